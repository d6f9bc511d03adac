// SPDX-License-Identifier: Apache-2.0
// Launchers: combine backward (d expert outputs, d combine weights, the residual pass-through)
// and permute backward (d x), the CUDA twins of reference/combine_backward.hpp.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/kernels/combine_backward.cuh>
#include <moeroute/kernels/element.cuh>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

namespace detail {
/// The extents both backward launchers check: T, rows >= 0, 1 <= d <= max_hidden.
[[nodiscard]] inline status validate_backward_extents(const routing_config& cfg,
                                                      std::int64_t tokens, std::int64_t rows,
                                                      std::int64_t hidden) {
  if (auto s = validate(cfg); !s) return s;
  if (auto s = validate_tokens(cfg, tokens); !s) return s;
  if (rows < 0)
    return status::make(status_code::invalid_shape,
                        "rows = " + std::to_string(rows) + ": must be >= 0");
  if (hidden < 1 || hidden > max_hidden)
    return status::make(status_code::invalid_shape,
                        "hidden = " + std::to_string(hidden) + ": must be in [1, 2^20]");
  return status::success();
}
[[nodiscard]] inline status null_argument(const char* what, const char* when) {
  return status::make(status_code::invalid_argument, std::string(what) + " is null " + when);
}
}  // namespace detail

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
  if (auto s = detail::validate_backward_extents(cfg, p.tokens, p.rows, p.hidden); !s) return s;
  if (p.rows > 0) {
    if (!p.d_expert_out) return detail::null_argument("d_expert_out", "with rows > 0");
    if (!p.layout.d_row_token) return detail::null_argument("layout.d_row_token", "with rows > 0");
    if (!p.d_grad_expert_out) return detail::null_argument("d_grad_expert_out", "with rows > 0");
  }
  // The [T, .] inputs are empty with T = 0; rows may still be E * C > 0 (min_capacity), all of
  // them padding then, and the rows kernel reads nothing but row_token for a padding row.
  if (p.tokens > 0) {
    const char* when = "with tokens > 0";
    if (!p.d_dy) return detail::null_argument("d_dy", when);
    if (!p.layout.d_assignment_row) return detail::null_argument("layout.d_assignment_row", when);
    if (!p.dispatched.d_weight) return detail::null_argument("dispatched.d_weight", when);
    if (!p.dispatched.d_fate) return detail::null_argument("dispatched.d_fate", when);
    if (!p.d_grad_weight) return detail::null_argument("d_grad_weight", when);
  }
  return status::success();
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
  if (p.rows > 0)
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
  if (auto s = detail::validate_backward_extents(cfg, p.tokens, p.rows, p.hidden); !s) return s;
  if (p.tokens == 0) return status::success();
  const char* when = "with tokens > 0";
  if (p.rows > 0 && !p.d_grad_buf) return detail::null_argument("d_grad_buf", "with rows > 0");
  if (!p.layout.d_assignment_row) return detail::null_argument("layout.d_assignment_row", when);
  if (!p.d_grad_x) return detail::null_argument("d_grad_x", when);
  return status::success();
}

/// @brief Permute backward: d x[t] = sum of d buf over token t's distinct rows in rank order
///        (fp32, no fma): bitwise equal to reference::permute_backward. No float atomics.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0: no-op.
template <class Element>
[[nodiscard]] status permute_backward(const routing_config& cfg,
                                      const permute_backward_params<Element>& p,
                                      cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  return launch("permute_backward_kernel", kernels::permute_backward_kernel<Element>,
                row_shape(p.tokens, p.hidden), stream, p.d_grad_buf, p.layout.d_assignment_row,
                p.tokens, cfg.top_k, p.hidden, p.accumulate, p.d_grad_x);
}

}  // namespace moeroute::cuda
