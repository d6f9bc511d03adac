// SPDX-License-Identifier: Apache-2.0
// Which x86 vector ISA a translation unit was compiled for, and which one the running CPU has:
// what a program built several times (the Python package's extension, moeroute-capacity) uses
// to run the build that suits the machine. The CPU backend's vector paths are chosen at
// compile time (its headers are templates compiled into the caller), so one binary cannot
// switch paths per call; it can load or run the build of the best level the CPU supports.
// Every level gives the same bits (tests/cpu: the scalar, AVX2 and AVX-512 builds), so the
// choice changes speed, never results.
//
// The levels are the x86-64 micro-architecture levels the builds are compiled for:
//   baseline  the compiler's default target (x86-64: SSE2; any other machine: its default)
//   avx2      x86-64-v3: AVX2, FMA, BMI1 / BMI2 (Haswell, Zen 1 and later)
//   avx512    x86-64-v4: AVX-512 F / BW / CD / DQ / VL (Skylake-SP, Ice Lake, Zen 4 and later)
#pragma once

#include <optional>
#include <string_view>

namespace moeroute::cpu {

/// An x86 vector ISA level (ordered: a CPU that has one has every lower one).
enum class isa_level { baseline = 0, avx2 = 1, avx512 = 2 };

/// Every level, lowest first.
inline constexpr isa_level isa_levels[] = {isa_level::baseline, isa_level::avx2, isa_level::avx512};

/// The level's name: "baseline", "avx2" or "avx512" (the suffix of its build's name).
[[nodiscard]] constexpr std::string_view isa_name(isa_level level) noexcept {
  switch (level) {
    case isa_level::avx2:
      return "avx2";
    case isa_level::avx512:
      return "avx512";
    default:
      return "baseline";
  }
}

/// The level named `name` (isa_name's spelling), or nothing.
[[nodiscard]] constexpr std::optional<isa_level> parse_isa(std::string_view name) noexcept {
  for (isa_level level : isa_levels)
    if (isa_name(level) == name) return level;
  return std::nullopt;
}

/// The level the including translation unit is compiled for (from the compiler's macros).
[[nodiscard]] constexpr isa_level compiled_isa() noexcept {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512CD__) && \
    defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__AVX2__) && defined(__FMA__)
  return isa_level::avx512;
#elif defined(__AVX2__) && defined(__FMA__) && defined(__BMI2__)
  return isa_level::avx2;
#else
  return isa_level::baseline;
#endif
}

/// @brief The highest level the running CPU (and its operating system: the CPU-feature
///        queries check that the OS saves the vector registers) supports. A TU compiled for
///        the baseline may call it before running code built for a higher level.
[[nodiscard]] inline isa_level host_isa() noexcept {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();  // a no-op once run; needed when called from a static initialiser
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
  const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  return v4 ? isa_level::avx512 : v3 ? isa_level::avx2 : isa_level::baseline;
#else
  return isa_level::baseline;
#endif
}

}  // namespace moeroute::cpu
