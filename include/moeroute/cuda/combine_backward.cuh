// SPDX-License-Identifier: Apache-2.0
// Launchers: combine backward (d expert outputs, d combine weights, the residual pass-through)
// and permute backward (d x), the CUDA twins of reference/combine_backward.hpp.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/kernels/combine_backward.cuh>
#include <moeroute/kernels/element.cuh>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

/// @brief Inputs and outputs of cuda::combine_backward. Element = float, __half or __nv_bfloat16.
template <class Element>
struct combine_backward_params {
  const Element* d_expert_out = nullptr;  ///< [rows, d] the experts' outputs (forward input)
  const Element* d_dy = nullptr;          ///< [T, d] dL/dy
  std::int64_t rows = 0;                  ///< rows of the layout's buffers
  std::int64_t tokens = 0;                ///< T
  std::int64_t hidden = 0;                ///< d
  /// From cuda::layout: d_row_token [rows], d_assignment_row [T, k]. Other fields not read.
  const_layout_result layout{};
  /// From cuda::dispatch: d_weight, d_fate [T, k]. Other fields not read.
  const_dispatch_result dispatched{};
  Element* d_grad_expert_out = nullptr;  ///< [rows, d] out (padding rows 0)
  float* d_grad_weight = nullptr;        ///< [T, k] f32 out (0 for dropped / masked)
  Element* d_grad_x = nullptr;           ///< [T, d] out or null: residual pass-through, else 0
};

/// @brief Checks config, shapes and pointers; names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg,
                              const combine_backward_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");
  if (auto s = detail::validate_extents(cfg, p.tokens, p.rows, p.hidden); !s) return s;
  // d = 0 leaves the [rows, d] and [T, d] buffers empty; d_grad_weight is still written (0).
  if (p.rows > 0 && p.hidden > 0)
    if (auto s = detail::require_pointers(
            "with rows > 0", detail::required(p.d_expert_out, "d_expert_out"),
            detail::required(p.layout.d_row_token, "layout.d_row_token"),
            detail::required(p.d_grad_expert_out, "d_grad_expert_out"));
        !s)
      return s;
  // The [T, .] inputs are empty with T = 0; rows may still be E * C > 0 (min_capacity), all of
  // them padding then, and the rows kernel reads nothing but row_token for a padding row.
  if (p.tokens == 0) return status::success();
  if (p.hidden > 0)
    if (auto s = detail::require_pointers("with tokens > 0", detail::required(p.d_dy, "d_dy")); !s)
      return s;
  return detail::require_pointers(
      "with tokens > 0", detail::required(p.layout.d_assignment_row, "layout.d_assignment_row"),
      detail::required(p.dispatched.d_weight, "dispatched.d_weight"),
      detail::required(p.dispatched.d_fate, "dispatched.d_fate"),
      detail::required(p.d_grad_weight, "d_grad_weight"));
}

/// @brief Combine backward: d expert_out (bitwise equal to reference::combine_backward: fp32,
///        rank order, no fma), d weight (warp dot products, fixed butterfly: reproducible, within
///        fp32 rounding of the reference) and the residual d x.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. No workspace.
///       T = 0: the [T, .] pointers may be null; d_grad_expert_out (all padding rows) gets 0.
template <class Element>
[[nodiscard]] status combine_backward(const routing_config& cfg,
                                      const combine_backward_params<Element>& p,
                                      cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.rows > 0 && p.hidden > 0)
    if (auto s = launch("combine_backward_rows_kernel",
                        kernels::combine_backward_rows_kernel<Element>, row_shape(p.rows, p.hidden),
                        stream, p.d_dy, p.layout.d_row_token, p.layout.d_assignment_row,
                        p.dispatched.d_weight, p.rows, cfg.top_k, p.hidden, p.d_grad_expert_out);
        !s)
      return s;
  if (p.tokens == 0) return status::success();
  launch_shape tokens_shape = row_shape(p.tokens, 0);
  tokens_shape.block = 128;  // four warps: one dot product each at a time
  return launch("combine_backward_tokens_kernel", kernels::combine_backward_tokens_kernel<Element>,
                tokens_shape, stream, p.d_dy, p.d_expert_out, p.layout.d_assignment_row,
                p.dispatched.d_fate, p.tokens, cfg.top_k, p.hidden,
                cfg.dispatch.dropped == drop_policy::residual, p.d_grad_weight, p.d_grad_x);
}

/// @brief Inputs and outputs of cuda::permute_backward.
template <class Element>
struct permute_backward_params {
  const Element* d_grad_buf = nullptr;  ///< [rows, d] dL/d expert-buffer rows
  std::int64_t rows = 0;                ///< rows of d_grad_buf
  std::int64_t tokens = 0;              ///< T
  std::int64_t hidden = 0;              ///< d
  /// From cuda::layout: d_assignment_row [T, k] (-1 = none). Other fields not read.
  const_layout_result layout{};
  bool accumulate = false;      ///< add into d_grad_x (e.g. on the residual part)
  Element* d_grad_x = nullptr;  ///< [T, d] out
};

/// @brief Checks config, shapes and pointers; names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg,
                              const permute_backward_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");
  if (auto s = detail::validate_extents(cfg, p.tokens, p.rows, p.hidden); !s) return s;
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  if (p.rows > 0)
    if (auto s =
            detail::require_pointers("with rows > 0", detail::required(p.d_grad_buf, "d_grad_buf"));
        !s)
      return s;
  return detail::require_pointers(
      "with tokens > 0", detail::required(p.layout.d_assignment_row, "layout.d_assignment_row"),
      detail::required(p.d_grad_x, "d_grad_x"));
}

/// @brief Permute backward: d x[t] = sum of d buf over token t's distinct rows in rank order
///        (fp32, no fma): bitwise equal to reference::permute_backward. No float atomics.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0: no-op.
template <class Element>
[[nodiscard]] status permute_backward(const routing_config& cfg,
                                      const permute_backward_params<Element>& p,
                                      cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  return launch("permute_backward_kernel", kernels::permute_backward_kernel<Element>,
                row_shape(p.tokens, p.hidden), stream, p.d_grad_buf, p.layout.d_assignment_row,
                p.tokens, cfg.top_k, p.hidden, p.accumulate, p.d_grad_x);
}

}  // namespace moeroute::cuda
