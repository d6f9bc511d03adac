// SPDX-License-Identifier: Apache-2.0
// Launcher: gather hidden states [T, d] into an expert layout [rows, d] (the CUDA twin of
// reference::permute). float, __half and __nv_bfloat16.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/kernels/element.cuh>
#include <moeroute/kernels/permute.cuh>
#include <moeroute/params/permute.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

using moeroute::permute_params;

/// @brief Checks config, shapes and pointers; names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const permute_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");
  return check_params(cfg, p);
}

/// @brief out[row] = x[row_token[row]] for rows < *d_num_rows; padding rows (-1) get zeros.
/// @param cfg the config of the routing the layout belongs to; stream last.
/// @return success, invalid_* or cuda_error. No workspace.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0 (or
///       rows = 0, or d = 0) returns success and writes nothing; rows in [*d_num_rows, rows) are
///       not touched. 16-byte accesses when d * sizeof(Element) is a multiple of 16 and both
///       buffers are 16-byte aligned, element accesses otherwise. Exact copy (no arithmetic).
template <class Element>
[[nodiscard]] status permute(const routing_config& cfg, const permute_params<Element>& p,
                             cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0 || p.rows == 0 || p.hidden == 0) return status::success();
  constexpr int V16 = kernels::vec16_elems<Element>;
  if (kernels::can_vectorize<Element>(p.hidden, p.d_x, p.d_out))
    return launch("permute_kernel", kernels::permute_kernel<Element, V16>,
                  row_shape(p.rows, p.hidden / V16), stream, p.d_x, p.hidden, p.layout, p.rows,
                  p.d_out);
  return launch("permute_kernel", kernels::permute_kernel<Element, 1>, row_shape(p.rows, p.hidden),
                stream, p.d_x, p.hidden, p.layout, p.rows, p.d_out);
}

}  // namespace moeroute::cuda
