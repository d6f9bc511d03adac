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
#include <moeroute/params/combine.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

using moeroute::combine_params;

/// @brief Checks config, shapes and pointers; names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const combine_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");
  return check_params(cfg, p);
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
