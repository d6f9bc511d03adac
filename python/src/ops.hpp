// SPDX-License-Identifier: Apache-2.0
// The stages as the Python module calls them: one function per operation of the C++ API,
// taking the config and a dict of named arrays (inputs and the outputs the Python side
// allocated from the specs). Names are the params structs' fields without their d_ prefix.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::python {

namespace py = pybind11;

/// validate(cfg) and validate_tokens(cfg, tokens).
[[nodiscard]] status validate_extents_checked(const routing_config& cfg, std::int64_t tokens);
[[nodiscard]] std::size_t gating_workspace_bytes(const routing_config& cfg, std::int64_t tokens);
[[nodiscard]] std::size_t dispatch_workspace_bytes(const routing_config& cfg, std::int64_t tokens);

void gating(const routing_config& cfg, py::dict arrays, int threads);
void dispatch(const routing_config& cfg, py::dict arrays, int threads);
void layout(const routing_config& cfg, py::dict arrays, layout_kind kind, std::int64_t block_size,
            int threads);
void permute(const routing_config& cfg, py::dict arrays, int threads);
void combine(const routing_config& cfg, py::dict arrays, int threads);
void losses(const routing_config& cfg, py::dict arrays, std::int64_t tokens, int threads);
void gating_backward(const routing_config& cfg, py::dict arrays,
                     const gating_backward_weights& weights, bool accumulate, int threads);
void combine_backward(const routing_config& cfg, py::dict arrays, int threads);
void permute_backward(const routing_config& cfg, py::dict arrays, bool accumulate, int threads);
void expert_bias_update(const routing_config& cfg, py::dict arrays);

}  // namespace moeroute::python
