// SPDX-License-Identifier: Apache-2.0
// The default allocator of cuda::router: device memory from cudaMalloc / cudaFree, in the
// std::allocator shape (allocate(n), deallocate(p, n)) that an engine's caching allocator can
// take instead (an adapter over PyTorch's or RMM's pool has the same two members).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include <moeroute/cuda/device_buffer.cuh>

namespace moeroute::cuda {

/// @brief Device memory through cudaMalloc (throws moeroute::error on failure) and cudaFree.
///        cudaMalloc and cudaFree synchronise the device: allocate once, outside a step.
template <class T>
struct device_allocator {
  using value_type = T;
  device_allocator() = default;
  template <class U>
  device_allocator(const device_allocator<U>&) noexcept {}
  [[nodiscard]] T* allocate(std::size_t n) {
    void* p = nullptr;
    if (n) throw_if_cuda_error(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept {
    if (p) (void)cudaFree(p);
  }
  template <class U>
  bool operator==(const device_allocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace moeroute::cuda
