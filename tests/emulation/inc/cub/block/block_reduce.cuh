// SPDX-License-Identifier: Apache-2.0
// Emulation stand-in for cub::BlockReduce (README.md): every thread of the block writes its
// value to the shared TempStorage, a real __syncthreads, then the reduction in thread order.
// As in CUB, only thread 0's result is defined; the others get a poisoned value.
#pragma once

namespace cub {

template <class T, int Threads>
class BlockReduce {
 public:
  struct TempStorage {
    T values[Threads];
  };
  explicit BlockReduce(TempStorage& storage) : s_(storage) {}

  template <class Op>
  T Reduce(T value, Op op) {
    s_.values[threadIdx.x] = value;
    __syncthreads();
    T r = s_.values[0];
    for (unsigned i = 1; i < blockDim.x; ++i) r = op(r, s_.values[i]);
    __syncthreads();  // nobody rewrites the storage before everyone has read it
    return threadIdx.x == 0 ? r : T(0x5a5a5a5a);
  }

 private:
  TempStorage& s_;
};

}  // namespace cub
