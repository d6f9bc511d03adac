// SPDX-License-Identifier: Apache-2.0
// Launcher: weighted sum of expert outputs back into token order (the CUDA twin of
// reference::combine). fp32, fp16 (__half) and bf16 (__nv_bfloat16); math in fp32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/common.cuh>
#include <moeroute/kernels/combine.cuh>

namespace moeroute::cuda {

/// @brief Inputs and outputs of cuda::combine. Element = float, __half or __nv_bfloat16.
template <class Element>
struct combine_params {
  const Element* d_expert_out = nullptr;          ///< [rows, d] expert outputs in layout order
  std::int64_t rows = 0;                          ///< rows of d_expert_out
  const std::int64_t* d_assignment_row = nullptr; ///< [T, k] int64 from build_layout, -1 = none
  const float* d_weight = nullptr;                ///< [T, k] f32 from cuda::dispatch
  const std::uint8_t* d_fate = nullptr;           ///< [T, k] uint8 from cuda::dispatch (residual only)
  const Element* d_x = nullptr;                   ///< [T, d] layer input (residual only)
  std::int64_t tokens = 0;                        ///< T
  std::int32_t k = 0;
  std::int64_t hidden = 0;                        ///< d
  drop_policy dropped = drop_policy::zero_weight; ///< residual: a token with nothing kept gets x
  Element* d_y = nullptr;                         ///< [T, d] out
};

template <class Element>
[[nodiscard]] status validate(const combine_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>, "Element must be float, __half or __nv_bfloat16");
  auto bad = [](status_code c, std::string m) { return status::make(c, std::move(m)); };
  if (p.tokens < 0) return bad(status_code::invalid_shape, "tokens = " + std::to_string(p.tokens) + ": must be >= 0");
  if (p.k < 1) return bad(status_code::invalid_shape, "k = " + std::to_string(p.k) + ": must be >= 1");
  if (p.hidden < 0 || p.hidden > max_hidden)
    return bad(status_code::invalid_shape, "hidden = " + std::to_string(p.hidden) + ": must be in [0, 2^20]");
  if (p.rows < 0) return bad(status_code::invalid_shape, "rows = " + std::to_string(p.rows) + ": must be >= 0");
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  if (p.rows > 0 && !p.d_expert_out) return bad(status_code::invalid_argument, "d_expert_out is null with rows > 0");
  if (!p.d_assignment_row) return bad(status_code::invalid_argument, "d_assignment_row is null with tokens > 0");
  if (!p.d_weight) return bad(status_code::invalid_argument, "d_weight is null with tokens > 0");
  if (!p.d_y) return bad(status_code::invalid_argument, "d_y is null with tokens > 0");
  if (p.dropped == drop_policy::residual) {
    if (!p.d_fate) return bad(status_code::invalid_argument, "d_fate is null with the residual policy");
    if (!p.d_x) return bad(status_code::invalid_argument, "d_x is null with the residual policy");
  }
  return status::success();
}

/// @brief y[t] = sum over j = 0..k-1 of weight[t, j] * expert_out[row(t, j)], in fp32, in rank
///        order, each product and sum rounded on its own: bitwise reproducible and equal to
///        reference::combine. drop_policy::residual: a valid token with no surviving assignment
///        gets y[t] = x[t] (copied); fallback outputs come in as ordinary rows.
/// @return success, invalid_* or cuda_error. No workspace.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0 (or d = 0)
///       returns success and writes nothing. 16-byte accesses when d * sizeof(Element) is a multiple
///       of 16 and the buffers are 16-byte aligned.
template <class Element>
status combine(const combine_params<Element>& p, cudaStream_t stream = nullptr) {
  if (auto s = validate(p); !s) return s;
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  constexpr int V16 = kernels::vec16_elems<Element>;
  const bool residual = p.dropped == drop_policy::residual;
  const bool vec = kernels::can_vectorize<Element>(p.hidden, p.d_expert_out, p.d_y, residual ? p.d_x : nullptr);
  const std::int64_t chunks = vec ? p.hidden / V16 : p.hidden;
  const int threads = static_cast<int>(std::clamp<std::int64_t>((chunks + 31) / 32 * 32, 32, 256));
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(p.tokens, 65535LL * 16));
  if (vec) {
    kernels::combine_kernel<Element, V16><<<blocks, threads, 0, stream>>>(
        p.d_expert_out, p.d_assignment_row, p.d_weight, p.d_fate, p.d_x, p.tokens, p.k, p.hidden, residual, p.d_y);
  } else {
    kernels::combine_kernel<Element, 1><<<blocks, threads, 0, stream>>>(
        p.d_expert_out, p.d_assignment_row, p.d_weight, p.d_fate, p.d_x, p.tokens, p.k, p.hidden, residual, p.d_y);
  }
  return last_launch("combine_kernel");
}

}  // namespace moeroute::cuda
