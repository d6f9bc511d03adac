// SPDX-License-Identifier: Apache-2.0
// CPU emulation shim (tests/emulation/README.md): not CUDA, not CUB.
#pragma once
#include <cuda_runtime.h>
namespace cub { struct DeviceScan {
  template <class T> static cudaError_t InclusiveSum(void* tmp, size_t& bytes, T* d, int n, cudaStream_t = 0) {
    if (!tmp) { bytes = 512; return cudaSuccess; }
    for (int i = 1; i < n; ++i) d[i] += d[i - 1];
    return cudaSuccess; } }; }
