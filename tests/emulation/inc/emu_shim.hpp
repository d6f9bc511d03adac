// SPDX-License-Identifier: Apache-2.0
// CPU emulation shim (tests/emulation/README.md): not CUDA, not CUB.
#pragma once
#include <cuda_runtime.h>
#include <cstring>
#include <cstdint>
#include <algorithm>
#include <functional>
#include <vector>
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__
#define __launch_bounds__(x)
struct emu_dim { unsigned x = 0, y = 0, z = 0; };
inline emu_dim emu_blockIdx, emu_threadIdx, emu_blockDim, emu_gridDim;
#define blockIdx emu_blockIdx
#define threadIdx emu_threadIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim
inline bool emu_reverse = false;
inline void __syncthreads() {}
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { auto o = *p; *p += v; return o; }
inline int __reduce_add_sync(unsigned, int v) { return v; }
#define cudaMemsetAsync(p, v, n, s) (std::memset((p), (v), (n)), cudaSuccess)
#define cudaGetLastError() cudaSuccess
namespace emu {
template <class F>
void launch(unsigned grid, unsigned block, F&& f) {
  blockDim.x = block; gridDim.x = grid;
  for (unsigned bi = 0; bi < grid; ++bi) {
    unsigned b = emu_reverse ? grid - 1 - bi : bi;
    for (unsigned ti = 0; ti < block; ++ti) {
      blockIdx.x = b; threadIdx.x = emu_reverse ? block - 1 - ti : ti;
      f();
    }
  }
}
}
