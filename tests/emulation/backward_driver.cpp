// SPDX-License-Identifier: Apache-2.0
// The backward kernels (logit_grads, combine_backward, permute_backward, expert_bias_update)
// executed on the CPU in lock step (inc/emu_lockstep.hpp; every CUDA thread a fiber, warp
// shuffles real barriers), against the CPU reference. Run by run_lockstep.sh, forward and
// reverse thread order (ctest: backward_emulation).
//   1. The GPU test itself (tests/cuda/backward_test.cu, included below): the same assertions
//      that run on a device. Its forward is the CPU reference, so no GPU gating / dispatch is
//      needed here.
//   2. The wider grid of tests/cuda/backward_grid_test.cu (also in cuda_tests): every score
//      function, renormalisation and drop policy, noise, groups and bias, batch / sequence aux
//      and z-loss terms, f32 / f16 / bf16, k = 1 .. E, T in {0, 1, 7, 300}, NaN / Inf rows.
// What it does not check: device libm (exp / log1p in double may differ from glibc by an ulp;
// here both sides use glibc), real concurrency, and launch limits. Those need a GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <emu_lockstep.hpp>
#include <emu_runtime.hpp>

#include "../cuda/backward_test.cu"
#include "../cuda/backward_grid_test.cu"

int main(int argc, char** argv) {
  // Nothing of backward_test.cu or backward_grid_test.cu needs a real device (their forward
  // is the CPU reference), so no test is excluded.
  return Catch::Session().run(argc, argv);
}
