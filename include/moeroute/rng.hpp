// SPDX-License-Identifier: Apache-2.0
// Counter-based random numbers (Philox-4x32-10) shared by the CPU reference and the kernels, so
// both draw the same noise for the same (seed, offset, element). The float transforms below use
// only correctly rounded operations (+, *, /, fma written out, no contraction), so host and
// device produce the same bits. (moeroute::core compiles host code with -ffp-contract=off.)
#pragma once

#include <cstdint>
#include <cstring>

#include <moeroute/macros.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::rng {

struct u32x4 {
  std::uint32_t v[4];
};

namespace detail {
MOEROUTE_HOST_DEVICE inline void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi,
                                         std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

// Rounding-exact float ops: on the device the _rn intrinsics are never fused into an fma, so
// a * b + c stays two roundings, as on the host with -ffp-contract=off.
MOEROUTE_HOST_DEVICE inline float mul(float a, float b) {
#if MOEROUTE_IN_DEVICE_CODE
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MOEROUTE_HOST_DEVICE inline float add(float a, float b) {
#if MOEROUTE_IN_DEVICE_CODE
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MOEROUTE_HOST_DEVICE inline float div(float a, float b) {
#if MOEROUTE_IN_DEVICE_CODE
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
MOEROUTE_HOST_DEVICE inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
MOEROUTE_HOST_DEVICE inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

/// @brief Philox-4x32-10 (Salmon et al., SC'11): a bijection of a 128-bit counter under a
///        64-bit key. Same constants as cuRAND and numpy's Philox.
MOEROUTE_HOST_DEVICE inline u32x4 philox4x32(u32x4 ctr, std::uint64_t key64) {
  std::uint32_t k0 = static_cast<std::uint32_t>(key64),
                k1 = static_cast<std::uint32_t>(key64 >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    detail::mulhilo(0xD2511F53u, ctr.v[0], hi0, lo0);
    detail::mulhilo(0xCD9E8D57u, ctr.v[2], hi1, lo1);
    ctr = u32x4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

/// @brief Four 32-bit draws for element `index` of stream `stream` under (seed, offset).
///        Counter = (index lo, index hi, offset lo ^ stream, offset hi); key = seed.
MOEROUTE_HOST_DEVICE inline u32x4 draw(std::uint64_t seed, std::uint64_t offset,
                                       std::uint32_t stream, std::uint64_t index) {
  const u32x4 ctr{{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                   static_cast<std::uint32_t>(offset) ^ (stream * 0x9E3779B9u),
                   static_cast<std::uint32_t>(offset >> 32)}};
  return philox4x32(ctr, seed);
}

/// Streams, so different uses of the same (seed, offset) never share draws.
inline constexpr std::uint32_t stream_gating_noise = 1;
inline constexpr std::uint32_t stream_random_priority = 2;
inline constexpr std::uint32_t stream_second_expert = 3;  ///< NLLB second-expert policies

/// @brief Uniform in (0, 1): 24 random bits, centred in their bucket, never 0 or 1.
MOEROUTE_HOST_DEVICE inline float uniform_open(std::uint32_t u) {
  return detail::add(detail::mul(static_cast<float>(u >> 8), 1.0f / 16777216.0f),
                     0.5f / 16777216.0f);
}

/// @brief Natural log for x in (0, +inf) from correctly rounded operations only (so host and
///        device agree bit for bit). Max error about 2 ulp; inputs here come from uniform_open.
MOEROUTE_HOST_DEVICE inline float portable_log(float x) {
  using namespace detail;
  std::uint32_t b = float_bits(x);
  int e = static_cast<int>((b >> 23) & 0xFFu) - 127;
  // mantissa in [1, 2); fold into [sqrt(1/2), sqrt(2)) so the series converges fast
  float m = bits_float((b & 0x007FFFFFu) | 0x3F800000u);
  if (m > 1.41421356f) {
    m = mul(m, 0.5f);
    e += 1;
  }
  // log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.1716
  const float s = div(add(m, -1.0f), add(m, 1.0f));
  const float s2 = mul(s, s);
  float p = 1.0f / 11.0f;
  p = add(mul(p, s2), 1.0f / 9.0f);
  p = add(mul(p, s2), 1.0f / 7.0f);
  p = add(mul(p, s2), 1.0f / 5.0f);
  p = add(mul(p, s2), 1.0f / 3.0f);
  p = add(mul(p, s2), 1.0f);
  const float log_m = mul(mul(2.0f, s), p);
  // e * ln2 in two parts keeps the sum accurate
  const float fe = static_cast<float>(e);
  return add(add(mul(fe, 0.693145751953125f), log_m), mul(fe, 1.4286067653e-6f));
}

/// @brief cos(2 pi u) for u in (0, 1), from correctly rounded operations only.
MOEROUTE_HOST_DEVICE inline float portable_cos_2pi(float u) {
  using namespace detail;
  // reduce to r in [-0.5, 0.5] turns, then fold by symmetry to [0, 0.25]
  float r = add(u, -0.5f);  // cos(2 pi u) = -cos(2 pi r)
  float sign = -1.0f;
  if (r < 0.0f) r = -r;  // cos is even
  if (r > 0.25f) {       // cos(2 pi r) = -cos(2 pi (0.5 - r))
    r = add(0.5f, -r);
    sign = -sign;
  }
  const float x = mul(r, 6.28318530717958647692f);  // [0, pi/2]
  const float x2 = mul(x, x);
  // Taylor to x^14 is below float precision on [0, pi/2]
  float p = -1.0f / 87178291200.0f;
  p = add(mul(p, x2), 1.0f / 479001600.0f);
  p = add(mul(p, x2), -1.0f / 3628800.0f);
  p = add(mul(p, x2), 1.0f / 40320.0f);
  p = add(mul(p, x2), -1.0f / 720.0f);
  p = add(mul(p, x2), 1.0f / 24.0f);
  p = add(mul(p, x2), -0.5f);
  p = add(mul(p, x2), 1.0f);
  return mul(sign, p);
}

/// @brief sqrt by Newton steps on correctly rounded ops (IEEE sqrt is exact too, but device
///        sqrtf depends on -prec-sqrt; this keeps the noise independent of compiler flags).
MOEROUTE_HOST_DEVICE inline float portable_sqrt(float x) {
  using namespace detail;
  if (!(x > 0.0f)) return 0.0f;
  // initial guess from the exponent, then Newton in float
  float y = bits_float((float_bits(x) >> 1) + 0x1FBD1DF5u);
  for (int i = 0; i < 4; ++i) y = mul(0.5f, add(y, div(x, y)));
  return y;
}

/// @brief Standard normal by Box-Muller from two 32-bit draws.
MOEROUTE_HOST_DEVICE inline float normal(std::uint32_t a, std::uint32_t b) {
  const float u1 = uniform_open(a), u2 = uniform_open(b);
  const float radius = portable_sqrt(detail::mul(-2.0f, portable_log(u1)));
  return detail::mul(radius, portable_cos_2pi(u2));
}

/// @brief Standard Gumbel, -log(-log(U)).
MOEROUTE_HOST_DEVICE inline float gumbel(std::uint32_t a) {
  return -portable_log(-portable_log(uniform_open(a)));
}

/// The element index of expert e of token t in rows of E experts: the counter of the
/// per-(token, expert) draws below.
MOEROUTE_HOST_DEVICE inline std::uint64_t row_element(std::int64_t t, std::int32_t E,
                                                      std::int32_t e) {
  return static_cast<std::uint64_t>(t) * static_cast<std::uint64_t>(E) +
         static_cast<std::uint64_t>(e);
}

/// @brief The gating noise z of expert e of token t (rows of E experts): Philox on
///        stream_gating_noise at element t * E + e, a standard normal (gaussian) or Gumbel.
///        Every backend's gating and gating backward draw it here, so they add the same noise.
MOEROUTE_HOST_DEVICE inline float gating_noise(std::uint64_t seed, std::uint64_t offset,
                                               bool gaussian, std::int64_t t, std::int32_t E,
                                               std::int32_t e) {
  const u32x4 r = draw(seed, offset, stream_gating_noise, row_element(t, E, e));
  return gaussian ? normal(r.v[0], r.v[1]) : gumbel(r.v[0]);
}

/// @brief NLLB's "sampling" second expert: the Gumbel draw added to expert e's logit of
///        token t (rows of E experts), on stream_second_expert at element t * E + e.
MOEROUTE_HOST_DEVICE inline float second_expert_gumbel(std::uint64_t seed, std::uint64_t offset,
                                                       std::int64_t t, std::int32_t E,
                                                       std::int32_t e) {
  const u32x4 r = draw(seed, offset, stream_second_expert, row_element(t, E, e));
  return gumbel(r.v[0]);
}

/// @brief NLLB's "random" second expert: token t's uniform in (0, 1), on stream_second_expert
///        at element t (token t keeps its second choice when 2 * p2 > this).
MOEROUTE_HOST_DEVICE inline float second_expert_uniform(std::uint64_t seed, std::uint64_t offset,
                                                        std::int64_t t) {
  return uniform_open(draw(seed, offset, stream_second_expert, static_cast<std::uint64_t>(t)).v[0]);
}

/// @brief priority::random's key of expert e's assignment of token t (rows of E experts):
///        a uniform in (0, 1) on stream_random_priority at element t * E + e.
MOEROUTE_HOST_DEVICE inline float random_priority(std::uint64_t seed, std::uint64_t offset,
                                                  std::int64_t t, std::int32_t E, std::int32_t e) {
  return uniform_open(draw(seed, offset, stream_random_priority, row_element(t, E, e)).v[0]);
}

}  // namespace moeroute::rng
MOEROUTE_PRECISE_FP_END
