// SPDX-License-Identifier: Apache-2.0
// The dynamic shared memory of a block, typed. The one place a kernel names `extern __shared__`,
// so the CPU emulation of the test suite (MOEROUTE_EMULATION, tests/emulation/) can hand out its
// emulated block's buffer instead.
#pragma once

namespace moeroute::kernels {

/// @brief The block's dynamic shared memory (the launch's smem bytes), as T*. 16-byte aligned.
template <class T>
__device__ __forceinline__ T* dynamic_shared() {
#if defined(MOEROUTE_EMULATION)
  return static_cast<T*>(moeroute_emulation::dynamic_shared());
#else
  extern __shared__ __align__(16) unsigned char moeroute_dynamic_smem[];
  return reinterpret_cast<T*>(moeroute_dynamic_smem);
#endif
}

}  // namespace moeroute::kernels
