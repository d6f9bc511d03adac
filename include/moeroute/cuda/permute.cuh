// SPDX-License-Identifier: Apache-2.0
// Launcher: gather hidden states [T, d] into an expert layout [rows, d] (the CUDA twin of
// reference::permute). fp32, fp16 (__half) and bf16 (__nv_bfloat16).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/common.cuh>
#include <moeroute/kernels/permute.cuh>

namespace moeroute::cuda {

/// @brief Inputs and outputs of cuda::permute. Element = float, __half or __nv_bfloat16.
template <class Element>
struct permute_params {
  const Element* d_x = nullptr;              ///< [T, d] hidden states
  std::int64_t tokens = 0;                   ///< T
  std::int64_t hidden = 0;                   ///< d
  const std::int32_t* d_row_token = nullptr; ///< [rows] int32 token of each row, -1 = padding
  std::int64_t rows = 0;                     ///< rows of d_row_token and d_out (max_rows)
  const std::int64_t* d_num_rows = nullptr;  ///< [1] int64 rows in use (from build_layout); null = rows
  Element* d_out = nullptr;                  ///< [rows, d] out: expert input buffer
};

template <class Element>
[[nodiscard]] status validate(const permute_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>, "Element must be float, __half or __nv_bfloat16");
  auto bad = [](status_code c, std::string m) { return status::make(c, std::move(m)); };
  if (p.tokens < 0) return bad(status_code::invalid_shape, "tokens = " + std::to_string(p.tokens) + ": must be >= 0");
  if (p.hidden < 0 || p.hidden > max_hidden)
    return bad(status_code::invalid_shape, "hidden = " + std::to_string(p.hidden) + ": must be in [0, 2^20]");
  if (p.rows < 0) return bad(status_code::invalid_shape, "rows = " + std::to_string(p.rows) + ": must be >= 0");
  if (p.tokens == 0 || p.rows == 0 || p.hidden == 0) return status::success();
  if (!p.d_x) return bad(status_code::invalid_argument, "d_x is null with tokens > 0");
  if (!p.d_row_token) return bad(status_code::invalid_argument, "d_row_token is null with rows > 0");
  if (!p.d_out) return bad(status_code::invalid_argument, "d_out is null with rows > 0");
  return status::success();
}

/// @brief out[row] = x[row_token[row]] for rows < *d_num_rows; padding rows (-1) get zeros.
/// @return success, invalid_* or cuda_error. No workspace.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0 (or
///       rows = 0, or d = 0) returns success and writes nothing; rows in [*d_num_rows, rows) are not
///       touched. 16-byte accesses when d * sizeof(Element) is a multiple of 16 and both
///       buffers are 16-byte aligned, element accesses otherwise. Exact copy (no arithmetic).
template <class Element>
status permute(const permute_params<Element>& p, cudaStream_t stream = nullptr) {
  if (auto s = validate(p); !s) return s;
  if (p.tokens == 0 || p.rows == 0 || p.hidden == 0) return status::success();
  constexpr int V16 = kernels::vec16_elems<Element>;
  const bool vec = kernels::can_vectorize<Element>(p.hidden, p.d_x, p.d_out);
  const std::int64_t chunks = vec ? p.hidden / V16 : p.hidden;
  const int threads = static_cast<int>(std::clamp<std::int64_t>((chunks + 31) / 32 * 32, 32, 256));
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(p.rows, 65535LL * 16));
  if (vec) {
    kernels::permute_kernel<Element, V16><<<blocks, threads, 0, stream>>>(p.d_x, p.hidden, p.d_row_token, p.rows,
                                                                           p.d_num_rows, p.d_out);
  } else {
    kernels::permute_kernel<Element, 1><<<blocks, threads, 0, stream>>>(p.d_x, p.hidden, p.d_row_token, p.rows,
                                                                         p.d_num_rows, p.d_out);
  }
  return last_launch("permute_kernel");
}

}  // namespace moeroute::cuda
