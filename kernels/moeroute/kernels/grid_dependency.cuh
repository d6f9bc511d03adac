// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch, the kernel side (the launch side: cuda/launch.cuh). Where it
// is on, moeroute launches a kernel so that its blocks may be scheduled while the kernel before
// it in the stream is still running — a decode step's chain of small kernels then does not pay
// a launch latency per kernel. That is safe only because every moeroute kernel calls
// enter_after_prior_grid() before anything else (tests/check_kernel_entry.py holds every
// __global__ to it).
#pragma once

namespace moeroute::kernels {

/// @brief The first statement of every moeroute kernel. griddepcontrol.wait returns once the
///        grids this one depends on have completed and their writes are visible (at once when
///        it was launched without the attribute); griddepcontrol.launch_dependents then lets
///        the next kernel's blocks be scheduled, which wait here in turn. No-ops below sm_90
///        (whose launches never carry the attribute) and on the CPU emulation.
__device__ __forceinline__ void enter_after_prior_grid() {
#if !defined(MOEROUTE_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace moeroute::kernels
