// SPDX-License-Identifier: Apache-2.0
// Shared launcher plumbing: CUDA error -> status, workspace carving at 256-byte alignment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/status.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cuda {

/// @brief Turns a cudaError_t into a status naming the call that failed.
[[nodiscard]] inline status from_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return status::success();
  return status::make(status_code::cuda_error,
                      std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

/// @brief The status of the last launch (cudaGetLastError, which also clears it).
[[nodiscard]] inline status last_launch(const char* kernel) {
  return from_cuda(cudaGetLastError(), kernel);
}

/// @brief Blocks for n items at `threads` per block, capped to what a grid can hold.
[[nodiscard]] inline unsigned grid_for(std::int64_t n, int threads, std::int64_t cap = 65535LL * 32) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b);
}

}  // namespace moeroute::cuda
