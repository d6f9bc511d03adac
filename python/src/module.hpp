// SPDX-License-Identifier: Apache-2.0
// The pieces of moeroute._core, each bound in its own file.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include <moeroute/types.hpp>

namespace moeroute::python {

namespace py = pybind11;

/// "padded" / "compact" -> layout_kind; raises moeroute.Error for another name.
[[nodiscard]] layout_kind parse_layout_kind(const std::string& s);

/// Fills a module (moeroute._core, or the test module _core_emulated) with everything below.
void init_module(py::module_& m);
void bind_config(py::module_& m);     ///< Config, presets(), the output specs and size queries
void bind_ops(py::module_& m);        ///< the stages and their backward passes
void bind_plan(py::module_& m);       ///< capacity planning on in-memory logits
void bind_reference(py::module_& m);  ///< the CPU reference, for the tests' comparisons

}  // namespace moeroute::python
