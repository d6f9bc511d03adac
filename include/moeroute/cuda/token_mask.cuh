// SPDX-License-Identifier: Apache-2.0
// Launcher: the padding mask of a batch whose real token count is in device memory, as
// cuda::router's device_tokens route applies it before gating (the twin of cpu::token_mask).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <moeroute/cuda/launch.cuh>
#include <moeroute/kernels/token_mask.cuh>
#include <moeroute/params/token_mask.hpp>
#include <moeroute/status.hpp>

namespace moeroute::cuda {

using moeroute::token_mask_params;

/// @brief Checks the shape and the pointers; names the first bad field.
[[nodiscard]] inline status validate(const token_mask_params& p) { return check_params(p); }

/// @brief d_mask[t] = 1 where t < n and d_valid[t] (when given), else 0; n = *d_count is read
///        on the device, so below 0 it masks every row and above T none (the count is never
///        seen on the host).
/// @note Asynchronous, one launch of the same shape whatever n is (a graph captured once
///       serves every count), no allocation.
[[nodiscard]] inline status token_mask(const token_mask_params& p, cudaStream_t stream = nullptr) {
  if (auto s = validate(p); !s) return s;
  if (p.tokens == 0) return status::success();
  constexpr int threads = 256;
  return launch("token_mask_kernel", kernels::token_mask_kernel<threads>,
                {grid_for(p.tokens, threads), threads, 0}, stream, p.tokens, p.d_count, p.d_valid,
                p.d_mask);
}

}  // namespace moeroute::cuda
