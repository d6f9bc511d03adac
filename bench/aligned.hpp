// SPDX-License-Identifier: Apache-2.0
// Benchmark buffers at a 64-byte boundary, as an engine's tensors are (PyTorch's CPU allocator
// aligns to 64 bytes; cudaMallocHost to a page). A std::vector of a few MB sits 16 bytes past
// a page (glibc's mmap chunks), so every 64-byte load of a row straddles two cache lines and
// the row ops would be measured on a layout no engine hands them.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace moeroute::bench {

template <class T>
struct aligned_allocator {
  using value_type = T;
  static constexpr std::align_val_t alignment{64};
  aligned_allocator() = default;
  template <class U>
  aligned_allocator(const aligned_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), alignment)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, alignment); }
  template <class U>
  bool operator==(const aligned_allocator<U>&) const noexcept {
    return true;
  }
};

/// A std::vector whose data() is 64-byte aligned.
template <class T>
using aligned_vector = std::vector<T, aligned_allocator<T>>;

}  // namespace moeroute::bench
