// SPDX-License-Identifier: Apache-2.0
// libFuzzer target over the whole CPU reference pipeline; the decoding and every invariant are
// in route_check.hpp (shared with the corpus replay test). Run through tests/fuzz/fuzz.sh.
#include <cstddef>
#include <cstdint>

#include "route_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return moeroute::fuzz::route_one(data, size);
}
