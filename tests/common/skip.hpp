// SPDX-License-Identifier: Apache-2.0
// A test that cannot run says so as skipped, never as passed: it prints the reason and exits
// with 77, which CTest reports as skipped for tests that set SKIP_RETURN_CODE 77 (the GPU test
// entries do). Use it only in a test that runs alone in its CTest entry (e.g. [scale]), since it
// ends the whole binary.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace moeroute::test {

[[noreturn]] inline void skip_test(const std::string& reason) {
  std::printf("SKIPPED: %s\n", reason.c_str());
  std::fflush(stdout);
  std::exit(77);
}

}  // namespace moeroute::test
