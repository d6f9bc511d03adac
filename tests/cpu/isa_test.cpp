// SPDX-License-Identifier: Apache-2.0
// cpu/isa.hpp: the level names round-trip, unknown names are refused, the running CPU has at
// least the level this binary is compiled for, and each test build reports the level its flags
// set (cpu_avx2_tests: x86-64-v3 is avx2; cpu_native_tests: -march=native is the host's level).
#include <catch2/catch.hpp>

#include <moeroute/cpu/isa.hpp>

namespace cpu = moeroute::cpu;

TEST_CASE("isa: names round-trip and unknown names are refused", "[cpu][isa]") {
  for (cpu::isa_level level : cpu::isa_levels) {
    const auto parsed = cpu::parse_isa(cpu::isa_name(level));
    REQUIRE(parsed.has_value());
    CHECK(*parsed == level);
  }
  CHECK(cpu::isa_name(cpu::isa_level::baseline) == "baseline");
  CHECK(cpu::isa_name(cpu::isa_level::avx2) == "avx2");
  CHECK(cpu::isa_name(cpu::isa_level::avx512) == "avx512");
  CHECK_FALSE(cpu::parse_isa("AVX2").has_value());
  CHECK_FALSE(cpu::parse_isa("").has_value());
  CHECK_FALSE(cpu::parse_isa("avx512f").has_value());
}

TEST_CASE("isa: the host runs this binary's level, and the build reports its flags' level",
          "[cpu][isa]") {
  const cpu::isa_level compiled = cpu::compiled_isa();
  const cpu::isa_level host = cpu::host_isa();
  INFO("compiled " << cpu::isa_name(compiled) << ", host " << cpu::isa_name(host));
  CHECK(static_cast<int>(host) >= static_cast<int>(compiled));
  CHECK(cpu::host_isa() == host);  // the query is stable
#if defined(MOEROUTE_TEST_COMPILED_ISA)
#define MOEROUTE_TEST_STR2(x) #x
#define MOEROUTE_TEST_STR(x) MOEROUTE_TEST_STR2(x)
  CHECK(cpu::isa_name(compiled) == MOEROUTE_TEST_STR(MOEROUTE_TEST_COMPILED_ISA));
#endif
#if defined(MOEROUTE_TEST_COMPILED_ISA_IS_HOST) && defined(__x86_64__)
  CHECK(compiled == host);
#endif
}
