// SPDX-License-Identifier: Apache-2.0
// CPU emulation shim (tests/emulation/README.md): not CUDA, not CUB.
#pragma once
#include <algorithm>
#include <numeric>
#include <vector>
#include <cuda_runtime.h>
namespace cub {
template <class T> struct DoubleBuffer { T* d_buffers[2]; int selector = 0;
  DoubleBuffer(T* a, T* b) { d_buffers[0] = a; d_buffers[1] = b; } T* Current() { return d_buffers[selector]; } };
struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void* tmp, size_t& bytes, DoubleBuffer<K>& keys, DoubleBuffer<V>& vals, int n, int begin, int end, cudaStream_t = 0) {
    if (!tmp) { bytes = 1024; return cudaSuccess; }
    const K mask = (end - begin >= 64) ? ~K{0} : ((K{1} << (end - begin)) - 1);
    std::vector<int> idx(n); std::iota(idx.begin(), idx.end(), 0);
    K* kin = keys.Current(); V* vin = vals.Current();
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return ((kin[a] >> begin) & mask) < ((kin[b] >> begin) & mask); });
    K* kout = keys.d_buffers[1 - keys.selector]; V* vout = vals.d_buffers[1 - vals.selector];
    for (int i = 0; i < n; ++i) { kout[i] = kin[idx[i]]; vout[i] = vin[idx[i]]; }
    // poison the old buffers like a real sort may
    for (int i = 0; i < n; ++i) { kin[i] = K(0xdeadbeef); vin[i] = V(-7); }
    keys.selector ^= 1; vals.selector ^= 1;
    return cudaSuccess;
  }
};
}
