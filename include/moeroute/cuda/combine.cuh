// SPDX-License-Identifier: Apache-2.0
// Launcher: weighted sum of expert outputs back into token order (the CUDA twin of
// reference::combine). float, __half and __nv_bfloat16; math in fp32.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
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
  auto bad = [](status_code c, std::string m) { return status::make(c, std::move(m)); };
  if (auto s = validate(cfg); !s) return s;
  if (auto s = validate_tokens(cfg, p.tokens); !s) return s;
  if (auto s = validate_hidden(p.hidden); !s) return s;
  if (p.rows < 0)
    return bad(status_code::invalid_shape, "rows = " + std::to_string(p.rows) + ": must be >= 0");
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  auto null = [&](const char* what, const char* when) {
    return bad(status_code::invalid_argument, std::string(what) + " is null " + when);
  };
  if (p.rows > 0 && !p.d_expert_out) return null("d_expert_out", "with rows > 0");
  if (!p.layout.d_assignment_row) return null("layout.d_assignment_row", "with tokens > 0");
  if (!p.dispatched.d_weight) return null("dispatched.d_weight", "with tokens > 0");
  if (!p.d_y) return null("d_y", "with tokens > 0");
  if (cfg.dispatch.dropped == drop_policy::residual) {
    if (!p.dispatched.d_fate) return null("dispatched.d_fate", "with the residual policy");
    if (!p.d_x) return null("d_x", "with the residual policy");
  }
  return status::success();
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
