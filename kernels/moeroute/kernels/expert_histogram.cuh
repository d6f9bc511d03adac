// SPDX-License-Identifier: Apache-2.0
// Requests per expert from expert ids [T, k]. Integer counts: the order in which atomics land
// cannot change the result, so the output is deterministic.
#pragma once

#include <cstdint>

namespace moeroute::kernels {

/// Block-local histogram in shared memory, then one global atomicAdd per expert per block.
/// Ids outside [0, experts) are counted in *d_out_of_range instead (never written elsewhere).
template <int Threads>
__global__ void __launch_bounds__(Threads)
expert_histogram_kernel(const std::int32_t* __restrict__ d_ids,  // [n] int32
                        std::int64_t n, std::int32_t experts,
                        unsigned long long* __restrict__ d_counts,  // [experts], zeroed by caller
                        unsigned long long* __restrict__ d_out_of_range) {
  extern __shared__ unsigned int s_hist[];  // [experts]
  for (std::int32_t e = threadIdx.x; e < experts; e += Threads) s_hist[e] = 0;
  __syncthreads();
  unsigned int bad = 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * Threads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * Threads + threadIdx.x; i < n; i += stride) {
    const std::int32_t e = d_ids[i];
    if (e >= 0 && e < experts) {
      atomicAdd(&s_hist[e], 1u);
    } else {
      ++bad;
    }
  }
  __syncthreads();
  for (std::int32_t e = threadIdx.x; e < experts; e += Threads)
    if (s_hist[e]) atomicAdd(&d_counts[e], static_cast<unsigned long long>(s_hist[e]));
  if (bad) atomicAdd(d_out_of_range, static_cast<unsigned long long>(bad));
}

}  // namespace moeroute::kernels
