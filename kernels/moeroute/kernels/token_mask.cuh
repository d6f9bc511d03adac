// SPDX-License-Identifier: Apache-2.0
// The valid-token mask of a batch whose real token count is in device memory (a CUDA graph
// captured once for the largest batch): rows [n, T) are padding.
#pragma once

#include <cstdint>

#include <moeroute/kernels/grid_dependency.cuh>

namespace moeroute::kernels {

/// d_mask[t] = (t < n, n = *d_count clamped to [0, T]) and d_valid[t] (when given).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    token_mask_kernel(std::int64_t tokens, const std::int64_t* __restrict__ d_count,
                      const std::uint8_t* __restrict__ d_valid, std::uint8_t* __restrict__ d_mask) {
  enter_after_prior_grid();
  const std::int64_t n = *d_count;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * Threads;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * Threads + threadIdx.x; t < tokens;
       t += stride)
    d_mask[t] = t < n && (d_valid == nullptr || d_valid[t] != 0) ? 1 : 0;
}

}  // namespace moeroute::kernels
