// SPDX-License-Identifier: Apache-2.0
// exp of a float in float arithmetic with fused multiply-adds, one definition for the host and
// the device: the GPU gating kernels' exp, and the bits of the CPU backend's vector exps
// (cpu::math::exp16 / exp8 take the same operations in vector registers; tests/cpu/math_test.cpp
// compares them with this function bit for bit).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <moeroute/macros.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute {

/// @brief exp(y) for any float y that is not NaN: y clamped to [-104, 89], n = round(y / ln2)
///        (the 1.5 * 2^23 add after a fused y * log2e), r = y - n ln2 in two fused steps
///        (ln2 = hi + lo), a degree-6 minimax polynomial by Horner's rule in fused
///        multiply-adds, and p * 2^n in two normal steps (p * 2^floor(n/2) exact, then one
///        rounding), so that subnormal results come out and y > 88.73 gives +inf. Below -103.9
///        the result is 0.
/// @note Every operation is an IEEE operation written out (an fma where fused, a plain
///       operation under MOEROUTE_PRECISE_FP otherwise), so the host, the emulation and the
///       device give the same bits. Error bound: at most 2 ulp from the correctly rounded exp
///       for normal results (measured: 1.0 ulp), monotonic (tests/cpu/math_test.cpp). About 20
///       float and integer operations and no double: the GPU's gating took a double exp per
///       logit before (about 40 instructions and a call).
MOEROUTE_HOST_DEVICE inline float exp_fma(float y) noexcept {
#if MOEROUTE_IN_DEVICE_CODE
  const auto fma = [](float a, float b, float c) { return __fmaf_rn(a, b, c); };
#else
  const auto fma = [](float a, float b, float c) { return std::fma(a, b, c); };
#endif
  y = y < -104.0f ? -104.0f : (y > 89.0f ? 89.0f : y);
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = fma(y, 1.44269504088896341f, magic) - magic;
  float r = fma(-n, 0.693359375f, y);
  r = fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fma(p, r, 1.3981999507e-3f);
  p = fma(p, r, 8.3334519073e-3f);
  p = fma(p, r, 4.1665795894e-2f);
  p = fma(p, r, 1.6666665459e-1f);
  p = fma(p, r, 5.0000001201e-1f);
  p = fma(p, r * r, r) + 1.0f;
  const std::int32_t ni = static_cast<std::int32_t>(n);  // in [-150, 129]
  const std::int32_t n1 = ni / 2, n2 = ni - n1;          // each in [-75, 65]: normal scales
  const std::uint32_t b1 = static_cast<std::uint32_t>(n1 + 127) << 23;
  const std::uint32_t b2 = static_cast<std::uint32_t>(n2 + 127) << 23;
  float s1, s2;  // (memcpy: std::bit_cast is not a device function everywhere)
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  return p * s1 * s2;
}

}  // namespace moeroute
MOEROUTE_PRECISE_FP_END
