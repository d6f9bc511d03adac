// SPDX-License-Identifier: Apache-2.0
// Launcher: combine backward (d expert outputs, d combine weights, the residual pass-through),
// the CUDA twin of reference/combine_backward.hpp (permute's: cuda/permute_backward.cuh).
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/kernels/combine_backward.cuh>
#include <moeroute/kernels/element.cuh>
#include <moeroute/params/combine_backward.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

using moeroute::combine_backward_params;

/// @brief Checks config, shapes and pointers; names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg,
                              const combine_backward_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");
  return check_params(cfg, p);
}

/// @brief Combine backward: d expert_out (bitwise equal to reference::combine_backward: fp32,
///        rank order, no fma), d weight (warp dot products, fixed butterfly: reproducible, within
///        fp32 rounding of the reference) and the residual d x.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. No workspace.
///       16-byte accesses when d * sizeof(Element) is a multiple of 16 and the buffers are
///       16-byte aligned.
///       T = 0: the [T, .] pointers may be null; d_grad_expert_out (all padding rows) gets 0.
template <class Element>
[[nodiscard]] status combine_backward(const routing_config& cfg,
                                      const combine_backward_params<Element>& p,
                                      cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  constexpr int V16 = kernels::vec16_elems<Element>;
  const bool v16 =
      kernels::can_vectorize<Element>(p.hidden, p.d_dy, p.d_expert_out, p.d_grad_expert_out) &&
      kernels::can_vectorize<Element>(p.hidden, p.d_grad_x);
  if (p.rows > 0 && p.hidden > 0) {
    const auto rows_kernel = v16 ? kernels::combine_backward_rows_kernel<Element, V16>
                                 : kernels::combine_backward_rows_kernel<Element, 1>;
    if (auto s = launch("combine_backward_rows_kernel", rows_kernel,
                        row_shape(p.rows, v16 ? p.hidden / V16 : p.hidden), stream, p.d_dy,
                        p.layout.d_row_token, p.layout.d_assignment_row, p.dispatched.d_weight,
                        p.rows, cfg.top_k, p.hidden, p.d_grad_expert_out);
        !s)
      return s;
  }
  if (p.tokens == 0) return status::success();
  launch_shape tokens_shape = row_shape(p.tokens, 0);
  tokens_shape.block = 128;  // four warps: one dot product each at a time
  const auto tokens_kernel = v16 ? kernels::combine_backward_tokens_kernel<Element, V16>
                                 : kernels::combine_backward_tokens_kernel<Element, 1>;
  return launch("combine_backward_tokens_kernel", tokens_kernel, tokens_shape, stream, p.d_dy,
                p.d_expert_out, p.layout.d_assignment_row, p.dispatched.d_fate, p.tokens, cfg.top_k,
                p.hidden, cfg.dispatch.dropped == drop_policy::residual, p.d_grad_weight,
                p.d_grad_x);
}

}  // namespace moeroute::cuda
