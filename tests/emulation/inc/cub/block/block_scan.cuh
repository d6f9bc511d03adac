// SPDX-License-Identifier: Apache-2.0
// Emulation stand-in for cub::BlockScan::ExclusiveSum (README.md): every thread writes its
// input to the shared TempStorage, a real __syncthreads, then each thread adds the inputs of
// the threads before it; every thread gets the block aggregate, as in CUB.
#pragma once

namespace cub {

template <class T, int Threads>
class BlockScan {
 public:
  struct TempStorage {
    T values[Threads];
  };
  explicit BlockScan(TempStorage& storage) : s_(storage) {}

  void ExclusiveSum(T input, T& output, T& block_aggregate) {
    s_.values[threadIdx.x] = input;
    __syncthreads();
    T prefix{}, total{};
    for (unsigned i = 0; i < blockDim.x; ++i) {
      if (i == threadIdx.x) prefix = total;
      total += s_.values[i];
    }
    output = prefix;
    block_aggregate = total;
    __syncthreads();
  }

 private:
  TempStorage& s_;
};

}  // namespace cub
