// SPDX-License-Identifier: Apache-2.0
// Launcher: weighted sum of expert outputs back into token order (the CUDA twin of
// reference::combine). float, __half and __nv_bfloat16; math in fp32.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/kernels/combine.cuh>
#include <moeroute/kernels/element.cuh>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

/// @brief Inputs and outputs of cuda::combine. Element = float, __half or __nv_bfloat16.
template <class Element>
struct combine_params {
  const Element* d_expert_out = nullptr;  ///< [rows, d] expert outputs in layout order
  std::int64_t rows = 0;                  ///< rows of d_expert_out
  std::int64_t tokens = 0;                ///< T
  std::int64_t hidden = 0;                ///< d
  /// From cuda::layout: d_assignment_row [T, k] int64 (-1 = none). Other fields not read.
  const_layout_result layout{};
  /// From cuda::dispatch: d_weight [T, k] f32; d_fate [T, k] (residual policy only).
  const_dispatch_result dispatched{};
  const Element* d_x = nullptr;  ///< [T, d] layer input (drop_policy::residual only)
  Element* d_y = nullptr;        ///< [T, d] out
};

/// @brief Checks config, shapes and pointers; names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const combine_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");
  if (auto s = detail::validate_extents(cfg, p.tokens, p.rows, p.hidden); !s) return s;
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  if (p.rows > 0)
    if (auto s = detail::require_pointers("with rows > 0",
                                          detail::required(p.d_expert_out, "d_expert_out"));
        !s)
      return s;
  if (auto s = detail::require_pointers(
          "with tokens > 0", detail::required(p.layout.d_assignment_row, "layout.d_assignment_row"),
          detail::required(p.dispatched.d_weight, "dispatched.d_weight"),
          detail::required(p.d_y, "d_y"));
      !s)
    return s;
  if (cfg.dispatch.dropped != drop_policy::residual) return status::success();
  return detail::require_pointers("with the residual policy",
                                  detail::required(p.dispatched.d_fate, "dispatched.d_fate"),
                                  detail::required(p.d_x, "d_x"));
}

/// @brief y[t] = sum over j = 0..k-1 of weight[t, j] * expert_out[row(t, j)], in fp32, in rank
///        order, each product and sum rounded on its own: bitwise reproducible and equal to
///        reference::combine. drop_policy::residual: a valid token with no surviving assignment
///        gets y[t] = x[t] (copied); fallback outputs come in as ordinary rows.
/// @return success, invalid_* or cuda_error. No workspace.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0 (or d = 0)
///       returns success and writes nothing. 16-byte accesses when d * sizeof(Element) is a
///       multiple of 16 and the buffers are 16-byte aligned.
template <class Element>
[[nodiscard]] status combine(const routing_config& cfg, const combine_params<Element>& p,
                             cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  constexpr int V16 = kernels::vec16_elems<Element>;
  const bool residual = cfg.dispatch.dropped == drop_policy::residual;
  if (kernels::can_vectorize<Element>(p.hidden, p.d_expert_out, p.d_y, residual ? p.d_x : nullptr))
    return launch("combine_kernel", kernels::combine_kernel<Element, V16>,
                  row_shape(p.tokens, p.hidden / V16), stream, p.d_expert_out, p.layout,
                  p.dispatched, p.d_x, p.tokens, cfg.top_k, p.hidden, residual, p.d_y);
  return launch("combine_kernel", kernels::combine_kernel<Element, 1>,
                row_shape(p.tokens, p.hidden), stream, p.d_expert_out, p.layout, p.dispatched,
                p.d_x, p.tokens, cfg.top_k, p.hidden, residual, p.d_y);
}

}  // namespace moeroute::cuda
