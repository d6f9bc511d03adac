// SPDX-License-Identifier: Apache-2.0
// A parallel-for hook for cpu::executor that runs the tasks last to first: any dependence of a
// result on the task order shows up as a difference from the serial run. Shared by the CPU
// backend's harnesses.
#pragma once

#include <cstdint>

namespace moeroute::test {

inline void reverse_order_run(void*, std::int64_t tasks, void (*task)(void*, std::int64_t),
                              void* arg) {
  for (std::int64_t i = tasks - 1; i >= 0; --i) task(arg, i);
}

}  // namespace moeroute::test
