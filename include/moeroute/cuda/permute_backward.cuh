// SPDX-License-Identifier: Apache-2.0
// Launcher: permute backward (d expert-buffer rows -> d x), the CUDA twin of
// reference/permute_backward.hpp.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/kernels/element.cuh>
#include <moeroute/kernels/permute_backward.cuh>
#include <moeroute/params/permute_backward.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

using moeroute::permute_backward_params;

/// @brief Checks config, shapes and pointers; names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg,
                              const permute_backward_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");
  return check_params(cfg, p);
}

/// @brief Permute backward: d x[t] = sum of d buf over token t's distinct rows in rank order
///        (fp32, no fma): bitwise equal to reference::permute_backward. No float atomics.
///        16-byte accesses when d * sizeof(Element) is a multiple of 16 and both buffers are
///        16-byte aligned.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0: no-op.
template <class Element>
[[nodiscard]] status permute_backward(const routing_config& cfg,
                                      const permute_backward_params<Element>& p,
                                      cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  constexpr int V16 = kernels::vec16_elems<Element>;
  const bool v16 = kernels::can_vectorize<Element>(p.hidden, p.d_grad_buf, p.d_grad_x);
  return launch("permute_backward_kernel",
                v16 ? kernels::permute_backward_kernel<Element, V16>
                    : kernels::permute_backward_kernel<Element, 1>,
                row_shape(p.tokens, v16 ? p.hidden / V16 : p.hidden), stream, p.d_grad_buf,
                p.layout.d_assignment_row, p.tokens, cfg.top_k, p.hidden, p.accumulate, p.d_grad_x);
}

}  // namespace moeroute::cuda
