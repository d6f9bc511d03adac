// SPDX-License-Identifier: Apache-2.0
// moeroute._core: the C++ library's stages for Python. The package's Python code (moeroute/)
// allocates outputs in the caller's framework and calls these; nothing here allocates an
// output or implements routing of its own.
#include "module.hpp"

#include <pybind11/stl.h>

#include <moeroute/status.hpp>

#include "arrays.hpp"
#include "ops.hpp"

namespace moeroute::python {

void bind_ops(py::module_& m) {
  const auto cfg = py::arg("config"), arrays = py::arg("arrays");
  const auto threads = py::arg("threads") = 0;
  m.def("gating", &gating, cfg, arrays, threads);
  m.def("dispatch", &dispatch, cfg, arrays, threads);
  m.def(
      "layout",
      [](const routing_config& c, py::dict a, const std::string& kind, std::int64_t block_size,
         int t) { layout(c, std::move(a), parse_layout_kind(kind), block_size, t); },
      cfg, arrays, py::arg("layout"), py::arg("block_size"), threads);
  m.def("permute", &permute, cfg, arrays, threads);
  m.def("combine", &combine, cfg, arrays, threads);
  m.def("losses", &losses, cfg, arrays, py::arg("tokens"), threads);
  m.def(
      "gating_backward",
      [](const routing_config& c, py::dict a, double routing, double aux, double sequence_aux,
         double z, bool accumulate, int t) {
        gating_backward(c, std::move(a), gating_backward_weights{routing, aux, sequence_aux, z},
                        accumulate, t);
      },
      cfg, arrays, py::arg("routing"), py::arg("aux"), py::arg("sequence_aux"), py::arg("z"),
      py::arg("accumulate"), threads);
  m.def("combine_backward", &combine_backward, cfg, arrays, threads);
  m.def("permute_backward", &permute_backward, cfg, arrays, py::arg("accumulate"), threads);
  m.def("expert_bias_update", &expert_bias_update, cfg, arrays);
}

}  // namespace moeroute::python

PYBIND11_MODULE(_core, m) {
  namespace mp = moeroute::python;
  m.doc() = "moeroute's C++ stages (used through the moeroute package)";
  // moeroute.Error (a ValueError) for bad arguments and for every failed library status
  static PyObject* error = nullptr;
  error = pybind11::register_exception<mp::binding_error>(m, "Error", PyExc_ValueError).ptr();
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const moeroute::error& e) {
      PyErr_SetString(error, e.what());
    }
  });
  mp::bind_config(m);
  mp::bind_ops(m);
  mp::bind_plan(m);
  mp::bind_reference(m);
#if defined(_OPENMP)
  m.attr("openmp") = true;
#else
  m.attr("openmp") = false;
#endif
  m.attr("cuda") = false;
}
