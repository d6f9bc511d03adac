// SPDX-License-Identifier: Apache-2.0
// The GPU gating and loss tests (tests/cuda/gating_test.cu, losses_test.cu), unchanged, run on
// the CPU against the lock-step emulation (inc/emu_lockstep.hpp, inc/emu_runtime.hpp): the
// same assertions that run on a GPU run here, with every CUDA thread a fiber and warp shuffles
// and __syncthreads real barriers. run_lockstep.sh compiles this file and runs it twice, the
// second time with threads and blocks in reverse order (EMU_REVERSE=1).
//   bash tests/emulation/run_lockstep.sh WORK tests/emulation/gating_driver.cpp          (ctest)
//   bash tests/emulation/run_lockstep.sh WORK tests/emulation/gating_driver.cpp "*"      (all)
// With arguments Catch2 gets them as given; with none, the pass plan below applies.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include <emu_lockstep.hpp>
#include <emu_runtime.hpp>

#include "../cuda/gating_test.cu"
#include "../cuda/losses_test.cu"

namespace {

// Every test case can run here (nothing needs a real device; graph replay uses the emulated
// capture), but all of them take ~5 minutes per pass on one core, since each warp shuffle
// switches 32 fibers. ctest's gating_emulation has to stay near 2 minutes, compile included,
// so with no arguments the cases are split between the two passes: each case is compared with
// the reference in one pass, the cheap ones in both (those also check order independence).
// Catch2 test specs: ',' separates names, '\' escapes a ',' inside one.

/// Both passes.
const char* const both[] = {
    "gating: tiny shapes\\, every score function",
    "gating: workspace too small\\, bad params\\, T = 0",
    "gating: noise off in eval unless only_in_training is false",
    "gating: reroute candidates for next_choice",
    "losses from the reference's sums\\, tiny shapes",
    "losses from the reference's sums equal the reference bit for bit",
    "losses: zero valid tokens give 0; bad params are rejected; T = 0 writes nothing",
    "losses through the GPU gating match the reference\\, E = 6",
};
/// Forward order only.
const char* const forward_only[] = {
    "gating matches the reference over the T x E x k grid",
    "gating: every option combination\\, E = 60",
    "gating: sequence-level sums and padding",
    "gating: f16 and bf16 inputs\\, aligned and not",
};
/// Reverse order only.
const char* const reverse_only[] = {
    "gating: group limit (DeepSeek-V3 and smaller shapes)",
    "gating: NaN and Inf rows as the reference sanitises them",
    "gating: golden peer logits through every preset",
    "gating: two runs and a CUDA graph replay give identical bits",
    "losses through the GPU gating match the reference\\, E = 64",
};
// Neither, for time only (run them by name, or with "*"): the same kernels and code paths at
// larger T or k, or the other E of a pair.
//   "gating matches the reference at T = 16384"                               (~26 s)
//   "gating: sequence-level sums and padding, DeepSeek-V3 at T = 16384"       (~8 s)
//   "gating matches the reference over the grid: k = E >= 128 at T = 1000"    (~39 s)
//   "gating: every option combination, E = 64"                                (~29 s)
//   "losses through the GPU gating match the reference, E = 384"              (~8 s)

}  // namespace

int main(int argc, char** argv) {
  Catch::Session session;
  if (argc > 1) return session.run(argc, argv);
  std::string spec;
  auto add = [&](const char* name) { spec += (spec.empty() ? "" : ",") + std::string(name); };
  for (const char* n : both) add(n);
  if (emu_reverse) {
    for (const char* n : reverse_only) add(n);
  } else {
    for (const char* n : forward_only) add(n);
  }
  std::vector<const char*> args = {argv[0], spec.c_str()};
  if (session.applyCommandLine(static_cast<int>(args.size()), args.data()) != 0) return 2;
  // a misspelt name would silently drop a case: every name must match one test case
  const std::size_t listed =
      std::size(both) + (emu_reverse ? std::size(reverse_only) : std::size(forward_only));
  const auto matched = Catch::filterTests(Catch::getAllTestCasesSorted(session.config()),
                                          session.config().testSpec(), session.config());
  if (matched.size() != listed) {
    std::fprintf(stderr, "gating_driver: %zu test cases match the pass plan, %zu listed\n",
                 matched.size(), listed);
    return 2;
  }
  std::printf("gating_driver: %s pass, %zu test cases\n", emu_reverse ? "reverse" : "forward", listed);
  return session.run();
}
