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
