// SPDX-License-Identifier: Apache-2.0
// Emulation stand-in for cub::DeviceScan::InclusiveSum in place (README.md), with CUB's
// two-call protocol; recorded like a launch while a stream is captured.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace cub {

struct DeviceScan {
  template <class T>
  static cudaError_t InclusiveSum(void* d_temp_storage, std::size_t& temp_storage_bytes, T* d_data,
                                  int n, cudaStream_t = nullptr) {
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = 512;
      return cudaSuccess;
    }
    if (n < 0) return cudaErrorInvalidValue;
    emu::ls::enqueue([=] {
      for (int i = 1; i < n; ++i) d_data[i] += d_data[i - 1];
    });
    return cudaSuccess;
  }
};

}  // namespace cub
