// SPDX-License-Identifier: Apache-2.0
// The stages as the Python module calls them: one function per operation of the C++ API,
// taking the config and a dict of named arrays (inputs and the outputs the Python side
// allocated from the specs). Names are the params structs' fields without their d_ prefix.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include <moeroute/config.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::python {

namespace py = pybind11;

/// The scratch of gating / dispatch on the CPU or (cuda) the CUDA backend.
[[nodiscard]] std::size_t gating_workspace_bytes(const routing_config& cfg, std::int64_t tokens,
                                                 bool cuda);
[[nodiscard]] std::size_t dispatch_workspace_bytes(const routing_config& cfg, std::int64_t tokens,
                                                   bool cuda);

// Each runs where its arrays live; `threads` caps OpenMP on the CPU, `stream` is the CUDA
// stream (cudaStream_t as an integer) for device arrays. The config is taken by value: a copy
// made while the GIL is held, so a Python thread assigning a field of the same moeroute.Config
// while the stage runs without the GIL cannot race with it (python/tests/test_threads.py,
// found by the ThreadSanitizer stage).
using stream_arg = std::optional<std::intptr_t>;
/// arrays["replay_ids"] [T, k] int32 (optional): routing replay, with `replay_ratio` the
/// score filter's min_score_ratio (moeroute/replay.hpp).
void gating(routing_config cfg, py::dict arrays, float replay_ratio, int threads,
            stream_arg stream);
void dispatch(routing_config cfg, py::dict arrays, int threads, stream_arg stream);
/// local_experts: the number of non-negative entries of arrays["expert_map"] (when given)
void layout(routing_config cfg, py::dict arrays, layout_kind kind, std::int64_t block_size,
            std::int32_t local_experts, int threads, stream_arg stream);
/// @brief gating, dispatch, layout (no expert map) and the losses of host arrays in one call:
///        every output carved from one numpy buffer (this binding owns it), each input read
///        once. Returns the four stages' outputs as dicts of numpy arrays (gating, dispatch,
///        layout, losses), as the stages' own bindings fill them. The fixed cost of a small
///        batch from Python (performance.md, "The Python package").
///        token_count: [1] int64 or None, the real tokens n of a padded batch (dispatch's
///        d_token_count; the caller's valid mask already leaves rows [n, T) out).
///        into: None, or the buffer (the outputs' numpy .base) of an earlier call with the
///        same config, T, layout and replay: written in place, the three losses into
///        into_losses ([3] float32 or float64), and an empty tuple returned (no output
///        object made: moeroute.torch's route(out=)).
py::tuple route_host(routing_config cfg, py::object logits, py::object bias, py::object valid,
                     layout_kind kind, std::int64_t block_size, bool per_token_aux,
                     py::object replay_ids, float replay_ratio, int threads, py::object token_count,
                     py::object into, py::object into_losses);
void permute(routing_config cfg, py::dict arrays, int threads, stream_arg stream);
void combine(routing_config cfg, py::dict arrays, int threads, stream_arg stream);
void losses(routing_config cfg, py::dict arrays, std::int64_t tokens, int threads,
            stream_arg stream);
void gating_backward(routing_config cfg, py::dict arrays, const gating_backward_weights& weights,
                     bool accumulate, int threads, stream_arg stream);
void combine_backward(routing_config cfg, py::dict arrays, int threads, stream_arg stream);
void permute_backward(routing_config cfg, py::dict arrays, bool accumulate, int threads,
                      stream_arg stream);
void expert_bias_update(routing_config cfg, py::dict arrays, stream_arg stream);
/// arrays: "token_count" [1] int64, "valid" [T] uint8 (optional), "mask" [T] uint8 (written)
void token_mask(py::dict arrays, stream_arg stream);

}  // namespace moeroute::python
