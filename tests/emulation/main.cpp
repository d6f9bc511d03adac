// SPDX-License-Identifier: Apache-2.0
// Catch2 main of cuda_tests_emulated: the GPU test files on the CPU lock-step emulation
// (README.md). CTest passes "~[device]~[scale]~[soak]~[slow]" and runs the binary twice, the
// second time with EMU_REVERSE=1 (threads and blocks in reverse order); run bare, it applies
// that filter itself (the cases left out need a device or hours), and any arguments replace
// it. Catch2 runs from catch_runner.cpp.
#include "../catch_runner.hpp"

#include <cstdio>

int main(int argc, char** argv) {
  std::printf("moeroute GPU tests on the CPU lock-step emulation, %s thread order\n",
              emu::ls::reverse ? "reverse" : "forward");
  if (argc > 1) return moeroute::test::run_catch(argc, argv);
  static char filter[] = "~[device]~[scale]~[soak]~[slow]";
  char* bare[] = {argv[0], filter, nullptr};
  return moeroute::test::run_catch(2, bare);
}
