// SPDX-License-Identifier: Apache-2.0
// Portability macros shared by host and device code.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MOEROUTE_HOST_DEVICE __host__ __device__
#else
#define MOEROUTE_HOST_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#define MOEROUTE_IN_DEVICE_CODE 1
#else
#define MOEROUTE_IN_DEVICE_CODE 0
#endif

// MOEROUTE_PRECISE_FP_BEGIN / _END bracket the host code whose results are documented bit for
// bit (the CPU reference, the shared Philox transforms): inside, the host compiler may not fuse
// a multiply and an add into one fma, whatever -march or -ffp-contract the user builds with, so
// every float operation is rounded on its own, as the kernels' explicit _rn intrinsics are. The
// setting is pushed and popped, so nothing leaks into the code that includes a header.
// (clang honours it unless built with -ffp-contract=fast, which ignores all such pragmas.)
#define MOEROUTE_PRAGMA(x) _Pragma(#x)
#if defined(__NVCC__)
// nvcc's front end does not know the GCC pragmas (warning 1675) but passes them on to the host
// compiler, which applies them.
#define MOEROUTE_PRECISE_FP_BEGIN        \
  MOEROUTE_PRAGMA(nv_diagnostic push)    \
  MOEROUTE_PRAGMA(nv_diag_suppress 1675) \
  MOEROUTE_PRAGMA(GCC push_options) MOEROUTE_PRAGMA(GCC optimize("fp-contract=off"))
#define MOEROUTE_PRECISE_FP_END MOEROUTE_PRAGMA(GCC pop_options) MOEROUTE_PRAGMA(nv_diagnostic pop)
#elif defined(__clang__)
#define MOEROUTE_PRECISE_FP_BEGIN \
  MOEROUTE_PRAGMA(float_control(push)) MOEROUTE_PRAGMA(clang fp contract(off))
#define MOEROUTE_PRECISE_FP_END MOEROUTE_PRAGMA(float_control(pop))
#elif defined(__GNUC__)
#define MOEROUTE_PRECISE_FP_BEGIN \
  MOEROUTE_PRAGMA(GCC push_options) MOEROUTE_PRAGMA(GCC optimize("fp-contract=off"))
#define MOEROUTE_PRECISE_FP_END MOEROUTE_PRAGMA(GCC pop_options)
#else
#define MOEROUTE_PRECISE_FP_BEGIN
#define MOEROUTE_PRECISE_FP_END
#endif
