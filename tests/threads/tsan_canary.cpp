// SPDX-License-Identifier: Apache-2.0
// The ThreadSanitizer stage's canary (tests/tsan.sh): a task body that writes one shared
// counter from every task of cpu::parallel_for, a data race under OpenMP. The stage builds it
// exactly as it builds the tests and requires TSan to report it, so a toolchain or option
// change that silently stops TSan from seeing the backend's OpenMP threads fails the stage
// instead of passing it.
#include <cstdint>
#include <cstdio>

#include <moeroute/cpu/parallel.hpp>

int main() {
  std::int64_t shared = 0;
  moeroute::cpu::parallel_for(moeroute::cpu::executor::openmp(2), 64,
                              [&](std::int64_t i) { shared += i; });
  std::printf("%lld\n", static_cast<long long>(shared));
  return 0;
}
