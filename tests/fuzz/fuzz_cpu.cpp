// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the CPU backend against the reference on every decoded input
// (cpu_check.hpp). Run through tests/fuzz/fuzz.sh; its corpus is fuzz_route's (same decoder).
#include <cstddef>
#include <cstdint>

#include "cpu_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return moeroute::fuzz::cpu_one(data, size);
}
