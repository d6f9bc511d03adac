// SPDX-License-Identifier: Apache-2.0
// Emulation stand-in for cub::DeviceRadixSort::SortPairs (README.md): a stable sort of the key
// bits [begin, end) on the host, with CUB's double-buffer contract (the result is in the other
// buffer, the selector flips at call time, the input buffers are left overwritten) and its
// two-call protocol (null temporary storage: report the size). Recorded like a launch while a
// stream is captured. Not CUB: its real temporary-storage size is checked on a GPU only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include <cuda_runtime.h>

namespace cub {

template <class T>
struct DoubleBuffer {
  T* d_buffers[2];
  int selector = 0;
  DoubleBuffer(T* current, T* alternate) : d_buffers{current, alternate} {}
  T* Current() { return d_buffers[selector]; }
  T* Alternate() { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void* d_temp_storage, std::size_t& temp_storage_bytes,
                               DoubleBuffer<K>& keys, DoubleBuffer<V>& values, int n, int begin_bit,
                               int end_bit, cudaStream_t = nullptr) {
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = 1024;
      return cudaSuccess;
    }
    if (n < 0 || begin_bit < 0 || end_bit > static_cast<int>(8 * sizeof(K)) || begin_bit > end_bit)
      return cudaErrorInvalidValue;
    K* kin = keys.Current();
    V* vin = values.Current();
    K* kout = keys.Alternate();
    V* vout = values.Alternate();
    emu::ls::enqueue([=] {
      const int width = end_bit - begin_bit;
      const K mask = width >= static_cast<int>(8 * sizeof(K)) ? ~K{0} : ((K{1} << width) - 1);
      std::vector<int> idx(static_cast<std::size_t>(n));
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
        return ((kin[a] >> begin_bit) & mask) < ((kin[b] >> begin_bit) & mask);
      });
      for (int i = 0; i < n; ++i) {
        kout[i] = kin[idx[i]];
        vout[i] = vin[idx[i]];
      }
      for (int i = 0; i < n; ++i) {  // a real sort leaves the input buffers overwritten too
        kin[i] = static_cast<K>(0xdeadbeef);
        vin[i] = static_cast<V>(-7);
      }
    });
    keys.selector ^= 1;
    values.selector ^= 1;
    return cudaSuccess;
  }
};

}  // namespace cub
