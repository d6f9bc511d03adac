// SPDX-License-Identifier: Apache-2.0
// Host-side 16-bit float types for the CPU reference: storage-only wrappers with exact
// conversions to float, so the reference can read the same fp16/bf16 buffers a kernel reads.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>

#include <moeroute/macros.hpp>

namespace moeroute {

/// IEEE binary16 bits (same layout as __half).
struct half_bits {
  std::uint16_t bits = 0;
};
/// bfloat16 bits (same layout as __nv_bfloat16).
struct bf16_bits {
  std::uint16_t bits = 0;
};

/// Element type tags for launchers and tools.
enum class dtype : std::uint8_t { f32, f16, bf16 };

[[nodiscard]] constexpr std::size_t size_of(dtype t) noexcept { return t == dtype::f32 ? 4 : 2; }
[[nodiscard]] constexpr const char* to_string(dtype t) noexcept {
  return t == dtype::f32 ? "f32" : (t == dtype::f16 ? "f16" : "bf16");
}
/// The dtype named `s`: f32 / float32, f16 / float16, bf16 / bfloat16; nothing otherwise.
[[nodiscard]] constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  if (s == "f32" || s == "float32") return dtype::f32;
  if (s == "f16" || s == "float16") return dtype::f16;
  if (s == "bf16" || s == "bfloat16") return dtype::bf16;
  return std::nullopt;
}

[[nodiscard]] inline float to_float(float x) noexcept { return x; }

[[nodiscard]] inline float to_float(bf16_bits x) noexcept {
  const std::uint32_t u = static_cast<std::uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

[[nodiscard]] inline float to_float(half_bits x) noexcept {
  const std::uint32_t sign = (x.bits & 0x8000u) << 16;
  const std::uint32_t exp = (x.bits >> 10) & 0x1Fu;
  const std::uint32_t man = x.bits & 0x3FFu;
  std::uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: value = man * 2^-24, exact in float
      const float f = std::ldexp(static_cast<float>(man), -24);
      std::memcpy(&u, &f, sizeof u);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7F800000u | (man << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Round-to-nearest-even float -> bf16 (NaN stays NaN).
[[nodiscard]] inline bf16_bits to_bf16(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (std::isnan(f)) return bf16_bits{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  const std::uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return bf16_bits{static_cast<std::uint16_t>((u + rounding) >> 16)};
}

/// Round-to-nearest-even float -> binary16, with overflow to inf and subnormals.
[[nodiscard]] inline half_bits to_half(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return half_bits{static_cast<std::uint16_t>(sign | 0x7E00u)};
  if (a >= 65520.0f) return half_bits{static_cast<std::uint16_t>(sign | 0x7C00u)};
  if (a < 6.103515625e-05f) {  // subnormal or zero: multiples of 2^-24, round to nearest even
    const float scaled = a * 16777216.0f;
    const float r = std::nearbyint(scaled);  // default rounding mode: to nearest even
    return half_bits{static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(r))};
  }
  std::uint32_t ua;
  std::memcpy(&ua, &a, sizeof ua);
  const std::uint32_t rounding = 0xFFFu + ((ua >> 13) & 1u);
  ua += rounding;
  const std::uint32_t exp = (ua >> 23) - 112u;
  const std::uint32_t man = (ua >> 13) & 0x3FFu;
  return half_bits{static_cast<std::uint16_t>(sign | (exp << 10) | man)};
}

/// Round-to-nearest-even float -> T (float, half_bits or bf16_bits): the one conversion the
/// reference, the tests and the tools store a storage type with.
template <class T>
[[nodiscard]] T from_float(float f) noexcept {
  static_assert(
      std::is_same_v<T, float> || std::is_same_v<T, half_bits> || std::is_same_v<T, bf16_bits>,
      "T must be float, half_bits or bf16_bits");
  if constexpr (std::is_same_v<T, half_bits>) {
    return to_half(f);
  } else if constexpr (std::is_same_v<T, bf16_bits>) {
    return to_bf16(f);
  } else {
    return f;
  }
}

}  // namespace moeroute
