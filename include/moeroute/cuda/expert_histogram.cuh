// SPDX-License-Identifier: Apache-2.0
// Launcher: requests per expert from expert ids. The smallest complete example of the launcher
// conventions (params struct with shapes, status return, stream last, no sync, no allocation).
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/common.cuh>
#include <moeroute/kernels/expert_histogram.cuh>

namespace moeroute::cuda {

struct expert_histogram_params {
  const std::int32_t* d_ids = nullptr;              ///< [tokens, k] int32 expert ids
  std::int64_t tokens = 0;
  std::int32_t k = 0;
  std::int32_t experts = 0;
  unsigned long long* d_counts = nullptr;           ///< [experts] uint64, written (not added to)
  unsigned long long* d_out_of_range = nullptr;     ///< [1] uint64: ids outside [0, experts)
};

/// @brief Checks the params; names the first bad field.
[[nodiscard]] inline status validate(const expert_histogram_params& p) {
  if (p.tokens < 0) return status::make(status_code::invalid_shape, "tokens = " + std::to_string(p.tokens) + ": must be >= 0");
  if (p.k < 1) return status::make(status_code::invalid_shape, "k = " + std::to_string(p.k) + ": must be >= 1");
  if (p.experts < 1 || p.experts > max_experts)
    return status::make(status_code::invalid_shape, "experts = " + std::to_string(p.experts) + ": must be in [1, 8192]");
  if (p.tokens > 0 && p.d_ids == nullptr) return status::make(status_code::invalid_argument, "d_ids is null with tokens > 0");
  if (p.d_counts == nullptr) return status::make(status_code::invalid_argument, "d_counts is null");
  if (p.d_out_of_range == nullptr) return status::make(status_code::invalid_argument, "d_out_of_range is null");
  return status::success();
}

/// @brief counts[e] = number of ids equal to e. Asynchronous on `stream`; no workspace.
/// @return success, or the validation / launch error. T = 0 writes zero counts.
inline status expert_histogram(const expert_histogram_params& p, cudaStream_t stream = nullptr) {
  if (auto s = validate(p); !s) return s;
  if (auto s = from_cuda(cudaMemsetAsync(p.d_counts, 0, sizeof(unsigned long long) * p.experts, stream),
                         "cudaMemsetAsync(d_counts)"); !s)
    return s;
  if (auto s = from_cuda(cudaMemsetAsync(p.d_out_of_range, 0, sizeof(unsigned long long), stream),
                         "cudaMemsetAsync(d_out_of_range)"); !s)
    return s;
  const std::int64_t n = p.tokens * p.k;
  if (n == 0) return status::success();
  constexpr int threads = 256;
  const unsigned blocks = grid_for(n, threads, 1024);
  kernels::expert_histogram_kernel<threads><<<blocks, threads, sizeof(unsigned) * p.experts, stream>>>(
      p.d_ids, n, p.experts, p.d_counts, p.d_out_of_range);
  return last_launch("expert_histogram_kernel");
}

}  // namespace moeroute::cuda
