// SPDX-License-Identifier: Apache-2.0
// The CPU emulation of CUDA that the GPU tests run on without a device (README.md). Included
// first in every translation unit of cuda_tests_emulated (g++ -include), as nvcc includes its
// runtime headers first. It provides:
//   - CUDA's keywords and built-in variables for host code (__global__ functions become plain
//     functions, __shared__ variables statics shared by the threads of the running block);
//   - the device intrinsics the kernels use, rounding as the device does (IEEE round-to-nearest,
//     no contraction: the target builds with -ffp-contract=off);
//   - the other side of the library's two seams (MOEROUTE_EMULATION): moeroute_emulation::launch
//     runs a kernel's blocks one after another, every thread a fiber in lock step
//     (emu_lockstep.hpp), and moeroute_emulation::dynamic_shared hands out the running block's
//     dynamic shared memory;
//   - the CUDA runtime calls the tests make, on host memory (emu_runtime.hpp).
// The CUB calls the launchers make are replaced by inc/cub/ (host versions, in lock step).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- keywords: what nvcc gives meaning to, plain C++ here -----------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __grid_constant__
#define __global__
#define __device__
#define __host__
#define __shared__ static  // one block runs at a time, so a static is that block's variable
#define __forceinline__ inline
#define __noinline__  // (libstdc++ spells __attribute__((__noinline__)); empty keeps that valid)
#define __grid_constant__
#define __launch_bounds__(...)

// ---- built-in variables ----------------------------------------------------------------------
struct emu_dim3 {
  unsigned x = 0, y = 1, z = 1;
};
inline emu_dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim

#include <emu_lockstep.hpp>

// ---- device intrinsics -----------------------------------------------------------------------
using std::isfinite;
using std::isinf;
using std::isnan;
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
template <class T>
T __ldg(const T* p) {
  return *p;
}
// Atomics: nothing runs concurrently, so a read-modify-write is atomic.
template <class T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
T atomicCAS(T* p, T compare, T value) {
  const T old = *p;
  if (old == compare) *p = value;
  return old;
}
inline void __syncthreads() { emu::ls::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::ls::warp_barrier("__syncwarp"); }

template <class T>
T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
  const unsigned lane = threadIdx.x % 32;
  const unsigned src = lane / width * width + static_cast<unsigned>(src_lane) % width;
  return emu::ls::exchange(v, threadIdx.x / 32 * 32 + src);
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  const unsigned lane = threadIdx.x % 32;
  unsigned src = lane ^ static_cast<unsigned>(lane_mask);
  if (src / width > lane / width) src = lane;  // CUDA: a source in a later group returns our own
  return emu::ls::exchange(v, threadIdx.x / 32 * 32 + src);
}
inline int __reduce_add_sync(unsigned mask, int v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  return v;
}
// redux.sync's max / min of unsigned values over the lanes of mask (a whole warp, or an aligned
// power-of-two run of lanes: an xor butterfly that takes only partners inside the mask)
template <class Op>
unsigned emu_reduce_unsigned(unsigned mask, unsigned v, Op op) {
  const unsigned lane = threadIdx.x % 32;
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned other = __shfl_xor_sync(mask, v, o);
    if ((mask >> (lane ^ static_cast<unsigned>(o))) & 1u) v = op(v, other);
  }
  return v;
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  return emu_reduce_unsigned(mask, v, [](unsigned a, unsigned b) { return a > b ? a : b; });
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
  return emu_reduce_unsigned(mask, v, [](unsigned a, unsigned b) { return a < b ? a : b; });
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
template <class T>
unsigned __match_any_sync(unsigned, T v) {
  static_assert(sizeof(T) <= 8, "__match_any_sync of a type wider than 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return emu::ls::match_any(bits);
}

// ---- the library's seams ---------------------------------------------------------------------
namespace moeroute_emulation {

/// A kernel launch as CUDA checks it (an empty or oversized grid or block, dynamic shared memory
/// beyond the default 48 KiB), then run now, or recorded while a stream is being captured.
/// Arguments convert to the kernel's parameter types and are held by value, as a launch copies
/// its parameters.
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), unsigned grid, unsigned block, std::size_t smem,
                   cudaStream_t, Args&&... args) {
  if (grid == 0 || block == 0 || block > 1024) return cudaErrorInvalidConfiguration;
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  emu::ls::enqueue([=] {
    emu::ls::run_blocks(grid, block, smem, [kernel, params] { std::apply(kernel, params); });
  });
  return cudaSuccess;
}

inline void* dynamic_shared() { return emu::ls::sched.dynamic_smem.data(); }

}  // namespace moeroute_emulation

#include <emu_runtime.hpp>
