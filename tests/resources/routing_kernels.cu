// SPDX-License-Identifier: Apache-2.0
// Every gating and gating-backward kernel the launchers can pick, for float and bf16 rows, and
// every dispatch kernel: the translation unit cmake/kernel_resources.cmake compiles to a cubin
// with ptxas' resource report, which bench/kernel_resources.py reads (the kernel_resources
// ctest: no stack frame, no spill).
#include <cuda_bf16.h>

#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/gating.cuh>
#include <moeroute/cuda/gating_backward.cuh>

#define MOEROUTE_INSTANTIATE(Element)                                                    \
  template moeroute::status moeroute::cuda::gating<Element>(                             \
      const moeroute::routing_config&, const moeroute::gating_params<Element>&, void*,   \
      std::size_t, cudaStream_t);                                                        \
  template moeroute::status moeroute::cuda::gating_backward<Element>(                    \
      const moeroute::routing_config&, const moeroute::gating_backward_params<Element>&, \
      cudaStream_t);

// (__half compiles to the same code as __nv_bfloat16, register for register: checked once, by
// hand, when this file was written; the CI build spares its ~20 s)
MOEROUTE_INSTANTIATE(float)
MOEROUTE_INSTANTIATE(__nv_bfloat16)

// cuda::dispatch is not a template: a use emits every kernel it launches.
auto* const moeroute_dispatch_launcher = &moeroute::cuda::dispatch;
