// SPDX-License-Identifier: Apache-2.0
// The CPU backend's float kernels: a vectorisable exp with a stated error bound, loads of
// float / half / bf16 rows with the reference's sanitising, and lane-split double sums. Plain
// C++ written so that GCC and Clang vectorise the loops for whatever ISA the consumer targets
// (SSE2 by default; AVX2 / AVX-512 with -march=...): no intrinsics, no per-element branches.
#pragma once

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include <moeroute/dtype.hpp>
#include <moeroute/macros.hpp>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace moeroute::cpu::math {

// GCC / Clang generic vectors (the row reductions and the vector exps below).
using f32x16 = float __attribute__((vector_size(64)));
using f32x8 = float __attribute__((vector_size(32)));
using f32x4 = float __attribute__((vector_size(16)));
using f64x8 = double __attribute__((vector_size(64)));
using f64x4 = double __attribute__((vector_size(32)));
using f64x2 = double __attribute__((vector_size(16)));
using i64x8 = std::int64_t __attribute__((vector_size(64)));

/// Lanes of the double accumulators: 8 fills an AVX-512 register and is a fixed number, so a
/// sum's rounding does not depend on the ISA the code was compiled for.
inline constexpr int sum_lanes = 8;

/// @brief exp(y) in float for any float y that is not NaN: Cody-Waite reduction to
///        r in [-ln2/2, ln2/2], a degree-6 minimax polynomial, and a two-step scaling by 2^n so
///        that subnormal results come out (y in [-103.9, -87.3]) and y > 88.73 gives +inf.
///        Below -103.9 the result is 0 (as is expf's, to within its smallest subnormal).
/// @note Error bound: at most 2 ulp from the correctly rounded exp for normal results, and at
///       most 1 ulp of the smallest normal (2^-149 absolute) for subnormal ones; checked over
///       every 61st float of [-104, 89] by tests/cpu/math_test.cpp. Monotonic on that grid.
[[nodiscard]] inline float exp(float y) noexcept {
  y = y < -104.0f ? -104.0f : (y > 89.0f ? 89.0f : y);
  constexpr float log2e = 1.44269504088896341f;
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (y * log2e + magic) - magic;
  const float r = (y - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 = hi + lo
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const std::int32_t ni = static_cast<std::int32_t>(n);  // in [-150, 129]
  const std::int32_t n1 = ni / 2, n2 = ni - n1;          // each in [-75, 65]: normal scales
  const float s1 = std::bit_cast<float>((n1 + 127) << 23);
  const float s2 = std::bit_cast<float>((n2 + 127) << 23);
  return p * s1 * s2;
}

#if defined(__AVX2__) && defined(__FMA__)
// exp16 and exp8's shared steps on generic vectors of 16 / 8 lanes, each operation an explicit
// instruction (a fused multiply-add where exp() contracts one), whatever -ffp-contract says.
[[gnu::always_inline]] inline f32x8 fmadd(f32x8 a, f32x8 b, f32x8 c) noexcept {
  return (f32x8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
}
[[gnu::always_inline]] inline f32x8 fnmadd(f32x8 a, f32x8 b, f32x8 c) noexcept {
  return (f32x8)_mm256_fnmadd_ps((__m256)a, (__m256)b, (__m256)c);
}
[[gnu::always_inline]] inline f32x8 clamp(f32x8 y, float lo, float hi) noexcept {
  // (maxps returns its second operand for a NaN: lo)
  return (f32x8)_mm256_min_ps(_mm256_max_ps((__m256)y, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
}
[[gnu::always_inline]] inline f32x4 clamp(f32x4 y, float lo, float hi) noexcept {
  return (f32x4)_mm_min_ps(_mm_max_ps((__m128)y, _mm_set1_ps(lo)), _mm_set1_ps(hi));
}
#if defined(__AVX512F__)
// (the maskz forms: the plain ones trip GCC 12's -Wmaybe-uninitialized on their undefined
// pass-through operand)
[[gnu::always_inline]] inline f32x16 fmadd(f32x16 a, f32x16 b, f32x16 c) noexcept {
  return (f32x16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
}
[[gnu::always_inline]] inline f32x16 fnmadd(f32x16 a, f32x16 b, f32x16 c) noexcept {
  return (f32x16)_mm512_fnmadd_ps((__m512)a, (__m512)b, (__m512)c);
}
[[gnu::always_inline]] inline f32x16 clamp(f32x16 y, float lo, float hi) noexcept {
  constexpr __mmask16 all = 0xffff;
  return (f32x16)_mm512_maskz_min_ps(all, _mm512_maskz_max_ps(all, (__m512)y, _mm512_set1_ps(lo)),
                                     _mm512_set1_ps(hi));
}
#endif

/// @brief exp()'s steps before the scaling, lane-wise: y clamped to [-104, 89], n = round(y /
///        ln2) and p = exp(y - n ln2) by the Cody-Waite reduction and the degree-6 polynomial,
///        so that exp(y) = p * 2^n. The scalar exp()'s operations, its multiply-adds fused.
///        `clamped` false: the caller knows y in [-104, 89], where the clamp is the identity.
template <class V, bool clamped = true>
[[gnu::always_inline]] inline V exp_reduced(V y, V& n) noexcept {
  if constexpr (clamped) y = clamp(y, -104.0f, 89.0f);
  const V magic = V{} + 12582912.0f;
  n = fmadd(y, V{} + 1.44269504088896341f, magic) - magic;
  V r = fnmadd(n, V{} + 0.693359375f, y);
  r = fnmadd(n, V{} + -2.12194440e-4f, r);
  V p = V{} + 1.9875691500e-4f;
  p = fmadd(p, r, V{} + 1.3981999507e-3f);
  p = fmadd(p, r, V{} + 8.3334519073e-3f);
  p = fmadd(p, r, V{} + 4.1665795894e-2f);
  p = fmadd(p, r, V{} + 1.6666665459e-1f);
  p = fmadd(p, r, V{} + 5.0000001201e-1f);
  return fmadd(p, r * r, r) + 1.0f;
}
#endif

#if defined(__AVX512F__)
/// @brief exp() of 16 lanes, for the row kernels: exp_reduced, and the scaling by 2^n in one
///        vscalefps, which rounds as exp()'s two steps do (a normal result is exact, a
///        subnormal one rounded once): exp()'s bits (tests/cpu/math_test.cpp compares exp_row
///        with exp() bit for bit).
[[gnu::always_inline]] inline __m512 exp16(__m512 y) noexcept {
  f32x16 n;
  const f32x16 p = exp_reduced((f32x16)y, n);
  return _mm512_maskz_scalef_ps(0xffff, (__m512)p, (__m512)n);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/// @brief exp() of 8 lanes (AVX2 + FMA): exp_reduced, and exp()'s two-step scaling by 2^n in
///        integer exponent fields (no vscalefps before AVX-512): p * 2^floor(n/2) is exact, so
///        the one rounding is the second multiply's, as in exp() and exp16 — the same bits.
///        Without it an AVX2 build took exp() a lane at a time (Qwen3's gating 5.5 ns per logit
///        where AVX-512 took 0.85).
[[gnu::always_inline]] inline __m256 exp8(__m256 y) noexcept {
  f32x8 n;
  const auto p = (__m256)exp_reduced((f32x8)y, n);
  // n in [-150, 128]: halves in [-75, 64], each a normal power of two
  const __m256i ni = _mm256_cvtps_epi32((__m256)n);  // (integral already: exact)
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/// Where exp8_moderate holds: y >= this (and y <= 0).
inline constexpr float exp8_moderate_min = -86.0f;

/// @brief exp8 for y in [exp8_moderate_min, 0], which the caller knows (a softmax's x - max
///        where its smallest lies within 86 of its largest): no clamp (the identity there), and
///        the scaling by 2^n (n in [-124, 0]) in one multiply, since p * 2^n (p in [0.7, 1.42])
///        is then normal and exp8's two products are both exact: exp8's bits in 16 of its 23
///        operations (tests/cpu/math_test.cpp compares them over [-86, 0]).
[[gnu::always_inline]] inline __m256 exp8_moderate(__m256 y) noexcept {
  f32x8 n;
  const auto p = (__m256)exp_reduced<f32x8, false>((f32x8)y, n);
  const __m256i ni = _mm256_cvtps_epi32((__m256)n);  // (integral already: exact)
  const __m256 scale =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(p, scale);
}
#endif

MOEROUTE_PRECISE_FP_BEGIN
using i64x4 = std::int64_t __attribute__((vector_size(32)));
/// The 64-bit integer lanes matching double lanes V.
template <class V>
struct int_lanes {
  using type = std::int64_t;
};
template <>
struct int_lanes<f64x8> {
  using type = i64x8;
};
template <>
struct int_lanes<f64x4> {
  using type = i64x4;
};
using i64x2 = std::int64_t __attribute__((vector_size(16)));
template <>
struct int_lanes<f64x2> {
  using type = i64x2;
};
/// The unsigned lanes of 64-bit integer lanes I (a left shift of a negative signed lane is
/// not defined).
template <class I>
struct unsigned_lanes {
  using type = std::uint64_t;
};
template <>
struct unsigned_lanes<i64x8> {
  using type = std::uint64_t __attribute__((vector_size(64)));
};
template <>
struct unsigned_lanes<i64x4> {
  using type = std::uint64_t __attribute__((vector_size(32)));
};
template <>
struct unsigned_lanes<i64x2> {
  using type = std::uint64_t __attribute__((vector_size(16)));
};

/// @brief x = log(x) in double, in place, for a normal, finite x > 0, lane by lane for V =
///        double, f64x2, f64x4 or f64x8 (log() below is the double one): x = 2^e * f with f in
///        [sqrt(1/2), sqrt(2)), log f = 2 atanh(s), s = (f - 1) / (f + 1), |s| < 0.172, by its
///        odd series to s^19, and e * ln2 in two parts. Each step is exact or one IEEE
///        operation, so every lane gets the double's bits; the exponent goes to double by the
///        1.5 * 2^52 trick (exact for |e| < 2^51: AVX2 has no 64-bit integer conversion).
///        Vectors: the W logsumexps of the logit gradient's columns, where log() was W scalar
///        calls of ~40 dependent operations.
/// @note Always inlined, so contracted or not as its caller is: call it from a
///       MOEROUTE_PRECISE_FP region (math_test: contracted, 138 of 4.8M lanes differed by an ulp).
template <class V>
[[gnu::always_inline]] inline void log_lanes(V& x) noexcept {
  using I = typename int_lanes<V>::type;
  // the exponent that puts f in [sqrt(1/2), sqrt(2)): the bits' distance from those of
  // sqrt(1/2), in whole binades (arithmetic shift: negative below 1/2)
  constexpr std::int64_t sqrt_half = 0x3fe6a09e667f3bcdLL;
  constexpr double magic = 6755399441055744.0;  // 1.5 * 2^52
  const I bits = __builtin_bit_cast(I, x);
  const I e = (bits - sqrt_half) >> 52;
  const V f = __builtin_bit_cast(V, bits - (I)((typename unsigned_lanes<I>::type)e << 52));
  const V s = (f - 1.0) / (f + 1.0), z = s * s;
  // the series 1/3 + z/5 + ... + z^8/19 by Estrin's scheme (a chain of 5 operations after z,
  // not Horner's 16: the logit gradient takes one log per token)
  const V z2 = z * z, z4 = z2 * z2, z8 = z4 * z4;
  const V a0 = z * (1.0 / 5) + 1.0 / 3, a1 = z * (1.0 / 9) + 1.0 / 7;
  const V a2 = z * (1.0 / 13) + 1.0 / 11, a3 = z * (1.0 / 17) + 1.0 / 15;
  const V b0 = a1 * z2 + a0, b1 = a3 * z2 + a2;
  const V p = (1.0 / 19) * z8 + (b1 * z4 + b0);
  constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  const V ed = __builtin_bit_cast(V, e + std::bit_cast<std::int64_t>(magic)) - magic;
  x = ed * ln2_hi + ((2.0 * s) * (z * p) + (ed * ln2_lo + 2.0 * s));
}

/// @brief log(x) in double for a normal, finite x > 0 (log_lanes' steps).
/// @note Inline, without a call (a libm call in a vector loop spills every vector register):
///       within 4e-16 relative of log(x) (tests/cpu/math_test.cpp checks 1e-15 over
///       [2^-1022, 2^1023]), so float(m + log(sum)) is the float the reference rounds to except
///       where that double lies within 1e-15 of a float rounding boundary. Uncontracted
///       (MOEROUTE_PRECISE_FP), so the same bits whatever -march the caller is built with.
[[nodiscard]] inline double log(double x) noexcept {
  log_lanes(x);
  return x;
}

/// Calls f(std::integral_constant<int, j>{}) for j = 0 .. N-1, expanded at compile time (a fold,
/// not a loop the compiler may keep): the lock-step steps of exp_lanes below.
template <int N, class F>
[[gnu::always_inline]] inline void each_lane_vector(F&& f) {
  [&]<int... j>(std::integer_sequence<int, j...>) __attribute__((always_inline)) {
    (f(std::integral_constant<int, j>{}), ...);
  }
  (std::make_integer_sequence<int, N>{});
}

/// @brief x[j] = exp(x[j]) in double, in place, lane-wise for V = double, f64x2, f64x4 or
///        f64x8 and N independent vectors (in place: a vector never passes a call by value,
///        -Wpsabi), for any x that is not NaN: x clamped to [-746, 710], n = round(x / ln2) by
///        adding 1.5 * 2^52 (n is then the low bits of the sum: no float-to-integer
///        conversion, which AVX2 lacks for doubles), r = x - n ln2 in two parts
///        (|r| <= 0.347), exp(r) by its Taylor series to r^13 (truncation < 5e-18 relative),
///        and the scaling by 2^n in two normal powers of two so that subnormal results come out
///        and x > 709.79 gives +inf. Below -745.2 the result is 0, as is exp's.
/// @note The same operations for every V and N, written uncontracted (MOEROUTE_PRECISE_FP):
///       inlined into a caller that is too (the logit gradient's row path), the same bits on
///       every ISA, scalar or vector. Within 2.5e-16 relative (about 1 ulp) of exp(x) for
///       normal results (tests/cpu/math_test.cpp). Each step is written for the N vectors side
///       by side (each_lane_vector expands it, so the arrays stay in registers): one vector's
///       steps are a chain of ~25 dependent operations, and N interleaved chains give the
///       core independent work at every point (the logit gradient's rows pass N = 4).
///       (__builtin_bit_cast below: std::bit_cast would return a vector by value.)
///
///       `moderate`: the caller knows every x lies in [-700, 700], so the clamp is the identity
///       and 2^n (|n| <= 1010) a normal double by which p (in [0.7, 1.42]) stays normal: the
///       two steps' products are both exact, the same bits as one multiply by 2^n, which this
///       takes (11 of a vector's ~50 operations saved without AVX-512; with it, the clamp's).
template <int N, bool moderate = false, class V>
[[gnu::always_inline]] inline void exp_lanes(V (&x)[N]) noexcept {
  using I = typename int_lanes<V>::type;
  const V lo = V{} - 746.0, hi = V{} + 710.0;
  constexpr double log2e = 1.4426950408889634074;
  constexpr double magic = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  // ln2 = hi + lo, hi with 32 significant bits: n * hi is exact for |n| < 2^21
  constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  V n[N], r[N], r2[N], r4[N], r8[N], p[N];
  I ni[N];
  if constexpr (!moderate)
    each_lane_vector<N>([&](auto j) __attribute__((always_inline)) {
      x[j] = x[j] < lo ? lo : x[j];
      x[j] = x[j] > hi ? hi : x[j];
    });
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    // 8-double vectors (the logit gradient's): n by vrndscalepd, which rounds x log2e to the
    // nearest integer, ties to even, as the magic add does (it gives -0 where the add gives
    // +0: r is then x, or +0 for -0, whose series is 1 all the same, and 2^n is 1); x - n
    // ln2_hi in one vfnmaddpd, which rounds once what is exact anyway (n ln2_hi has at most
    // 43 significant bits, and x lies within a factor 2 of it: Sterbenz). Two of about 35
    // operations, the same bits.
    each_lane_vector<N>([&](auto j) __attribute__((always_inline)) {
      // (the zero-masked forms: GCC 12 takes the unmasked one's undefined source for
      // uninitialised)
      n[j] =
          (V)_mm512_maskz_roundscale_pd(0xff, (__m512d)(x[j] * log2e), _MM_FROUND_TO_NEAREST_INT);
      const auto exact = (V)_mm512_fnmadd_pd((__m512d)n[j], _mm512_set1_pd(ln2_hi), (__m512d)x[j]);
      r[j] = exact - n[j] * ln2_lo;
    });
  } else
#endif
  {
    each_lane_vector<N>([&](auto j) __attribute__((always_inline)) {
      const V kd = x[j] * log2e + magic;
      n[j] = kd - magic;
      ni[j] = __builtin_bit_cast(I, kd) - std::bit_cast<std::int64_t>(magic);
    });
    each_lane_vector<N>([&](auto j) __attribute__((always_inline)) {
      r[j] = (x[j] - n[j] * ln2_hi) - n[j] * ln2_lo;
    });
  }
  // the Taylor series to r^13 by Estrin's scheme: pairs, then pairs of pairs (a dependency
  // chain of 7 operations after r^8, not Horner's 26: short rows are latency-bound); the 1 is
  // added last, so that r's low bits are not rounded away first
  each_lane_vector<N>([&](auto j) __attribute__((always_inline)) { r2[j] = r[j] * r[j]; });
  each_lane_vector<N>([&](auto j) __attribute__((always_inline)) { r4[j] = r2[j] * r2[j]; });
  each_lane_vector<N>([&](auto j) __attribute__((always_inline)) { r8[j] = r4[j] * r4[j]; });
  each_lane_vector<N>([&](auto j) __attribute__((always_inline)) {
    const V a0 = r[j], a1 = r[j] * (1.0 / 6.0) + 0.5, a2 = r[j] * (1.0 / 120.0) + 1.0 / 24.0;
    const V a3 = r[j] * (1.0 / 5040.0) + 1.0 / 720.0;
    const V b0 = a1 * r2[j] + a0, b1 = a3 * r2[j] + a2;
    p[j] = b1 * r4[j] + b0;  // c0
  });
  each_lane_vector<N>([&](auto j) __attribute__((always_inline)) {
    const V a4 = r[j] * (1.0 / 362880.0) + 1.0 / 40320.0;
    const V a5 = r[j] * (1.0 / 39916800.0) + 1.0 / 3628800.0;
    const V a6 = r[j] * (1.0 / 6227020800.0) + 1.0 / 479001600.0;
    const V b2 = a5 * r2[j] + a4;
    const V c1 = a6 * r4[j] + b2;
    p[j] = (c1 * r8[j] + p[j]) + 1.0;
  });
#if defined(__AVX512F__)
  // vscalefpd: p * 2^n rounded once, as the two steps below round it (same bits); 8-double
  // vectors only (narrower ones, as a test makes, take the steps below)
  if constexpr (sizeof(V) == 64) {
    (void)ni;
    each_lane_vector<N>([&](auto j) __attribute__((always_inline)) {
      x[j] = (V)_mm512_maskz_scalef_pd(0xff, (__m512d)p[j], (__m512d)n[j]);
    });
    return;
  }
#endif
  if constexpr (moderate) {  // 2^n normal and p * 2^n normal: one exact multiply
    (void)n;
    each_lane_vector<N>([&](auto j) __attribute__((always_inline)) {
      x[j] = p[j] * __builtin_bit_cast(V, (ni[j] + 1023) << 52);
    });
    return;
  }
  // n in [-1076, 1024]: halves in [-538, 512], each a normal power of two; p * 2^n1 is exact,
  // so a subnormal result is rounded once. n1 = round(n / 2) by the same magic add (n / 2 is
  // exact): a 64-bit arithmetic shift is AVX-512's only, and GCC took AVX2 / SSE2 lanes one
  // at a time for it (the logit gradient 4x slower there)
  each_lane_vector<N>([&](auto j) __attribute__((always_inline)) {
    const I n1 =
        __builtin_bit_cast(I, n[j] * 0.5 + magic) - __builtin_bit_cast(std::int64_t, magic);
    const I n2 = ni[j] - n1;
    const V s1 = __builtin_bit_cast(V, (n1 + 1023) << 52);
    const V s2 = __builtin_bit_cast(V, (n2 + 1023) << 52);
    x[j] = p[j] * s1 * s2;
  });
}

/// exp_lanes of one vector (or one double).
template <class V>
[[gnu::always_inline]] inline void exp_lanes(V& x) noexcept {
  V one[1] = {x};
  exp_lanes<1>(one);
  x = one[0];
}

/// exp_lanes of one double.
[[nodiscard]] inline double exp(double x) noexcept {
  exp_lanes(x);
  return x;
}
MOEROUTE_PRECISE_FP_END

/// NaN -> -FLT_MAX, +-Inf -> +-FLT_MAX (the reference's sanitise), branch-free: a NaN fails
/// the first compare, so the two selects are exactly maxps / minps (which return their second
/// operand for a NaN) and vectorise to two instructions.
[[nodiscard]] inline float sanitize(float x) noexcept {
  const float a = x > -FLT_MAX ? x : -FLT_MAX;
  return a < FLT_MAX ? a : FLT_MAX;
}

/// sanitize() of every lane of a generic vector (GCC makes each select a compare and a blend;
/// clamp() below is the two-instruction form where AVX2 / AVX-512 intrinsics are at hand).
template <class V>
[[nodiscard]] inline V sanitize_lanes(const V& x) noexcept {
  const V a = x > -FLT_MAX ? x : -FLT_MAX;
  return a < FLT_MAX ? a : FLT_MAX;
}

/// 1 when x is NaN or +-Inf.
[[nodiscard]] inline std::int32_t nonfinite(float x) noexcept {
  return (std::bit_cast<std::uint32_t>(x) & 0x7F800000u) == 0x7F800000u ? 1 : 0;
}

/// One element as float: exact for float, half and bf16 (bf16 is a shift, so it vectorises).
template <class Element>
[[nodiscard]] inline float load(const Element& v) noexcept {
  if constexpr (std::is_same_v<Element, bf16_bits>) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(v.bits) << 16);
  } else {
    return to_float(v);
  }
}

// Row reductions in GCC / Clang generic vectors (f32x16 and kin, above): the running max / sums
// stay in registers and the lanes are folded by halves (16 -> 8 -> 4 -> 2 -> 1), a fixed order,
// so the rounding of a sum is the same for every ISA the vectors are lowered to.

/// The sum of 16 float lanes held as lanes 0-7 and 8-15: (l + l+8), then (+4), (+2), (+1).
[[nodiscard]] inline float fold_sum(const f32x8& lo, const f32x8& hi) noexcept {
  const f32x8 c = lo + hi;
  const f32x4 f =
      __builtin_shufflevector(c, c, 0, 1, 2, 3) + __builtin_shufflevector(c, c, 4, 5, 6, 7);
  return (f[0] + f[2]) + (f[1] + f[3]);
}

/// The sum of 16 float lanes, in the same order.
[[nodiscard]] inline float fold_sum(const f32x16& v) noexcept {
  return fold_sum(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

/// The sum of 8 double lanes: (l + l+4), then (+2), (+1).
[[nodiscard]] inline double fold_sum(const f64x8& v) noexcept {
  const f64x4 c =
      __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
  const f64x2 f = __builtin_shufflevector(c, c, 0, 1) + __builtin_shufflevector(c, c, 2, 3);
  return f[0] + f[1];
}

/// Lanes of a native float register (AVX-512: 16, AVX: 8, SSE2: 4), for the exact reductions
/// (max), whose result does not depend on the width.
#if defined(__AVX512F__)
inline constexpr std::int32_t native_lanes = 16;
#elif defined(__AVX__)
inline constexpr std::int32_t native_lanes = 8;
#else
inline constexpr std::int32_t native_lanes = 4;
#endif
using f32n = float __attribute__((vector_size(4 * native_lanes)));
using i32n = std::int32_t __attribute__((vector_size(4 * native_lanes)));

/// The largest lane (no NaN), by halves in registers: a short chain, not one per lane.
[[nodiscard]] inline float max_of_lanes(const f32x4& v) noexcept {
  const float a = v[0] > v[2] ? v[0] : v[2], b = v[1] > v[3] ? v[1] : v[3];
  return a > b ? a : b;
}
[[nodiscard]] inline float max_of_lanes(const f32x8& v) noexcept {
  const f32x4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3);
  const f32x4 b = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return max_of_lanes(a > b ? a : b);
}
[[nodiscard]] inline float max_of_lanes(const f32x16& v) noexcept {
  const f32x8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const f32x8 b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return max_of_lanes(a > b ? a : b);
}

/// The least of the lanes (no NaN), folded by halves in registers.
[[nodiscard]] inline float min_of_lanes(const f32x4& v) noexcept {
  const float a = v[0] < v[2] ? v[0] : v[2], b = v[1] < v[3] ? v[1] : v[3];
  return a < b ? a : b;
}
[[nodiscard]] inline float min_of_lanes(const f32x8& v) noexcept {
  const f32x4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3);
  const f32x4 b = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return min_of_lanes(a < b ? a : b);
}
[[nodiscard]] inline float min_of_lanes(const f32x16& v) noexcept {
  const f32x8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const f32x8 b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return min_of_lanes(a < b ? a : b);
}

/// @brief The max of v[0, n) (no NaN): native lanes, folded by halves, then the tail.
[[nodiscard]] inline float max_row(const float* __restrict v, std::int32_t n) noexcept {
  f32n lane = f32n{} - FLT_MAX;
  std::int32_t i = 0;
  for (; i + native_lanes <= n; i += native_lanes) {
    f32n x;
    std::memcpy(&x, v + i, sizeof x);
    lane = lane > x ? lane : x;  // one maxps
  }
  float m = max_of_lanes(lane);
  for (; i < n; ++i) m = m > v[i] ? m : v[i];
  return m;
}

/// @brief The sum of v[0, n) in float: 16 lanes folded by halves, then the tail (the reference
///        adds sequentially; this differs by float rounding only).
[[nodiscard]] inline float sum_row_f32(const float* __restrict v, std::int32_t n) noexcept {
  // (16 lanes as two halves: a 16-float generic vector has no register below AVX-512)
  f32x8 lo = {}, hi = {};
  std::int32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    f32x8 xl, xh;
    std::memcpy(&xl, v + i, sizeof xl);
    std::memcpy(&xh, v + i + 8, sizeof xh);
    lo += xl;
    hi += xh;
  }
  float s = fold_sum(lo, hi);
  for (; i < n; ++i) s += v[i];
  return s;
}

/// The generic vectors of N lanes load_lanes works in (a template argument cannot size a
/// vector_size attribute).
template <std::int32_t N>
struct lane_vectors;
template <>
struct lane_vectors<4> {
  using f = f32x4;
  using u16 = std::uint16_t __attribute__((vector_size(8)));
  using u32 = std::uint32_t __attribute__((vector_size(16)));
};
template <>
struct lane_vectors<8> {
  using f = f32x8;
  using u16 = std::uint16_t __attribute__((vector_size(16)));
  using u32 = std::uint32_t __attribute__((vector_size(32)));
};
template <>
struct lane_vectors<16> {
  using f = f32x16;
  using u16 = std::uint16_t __attribute__((vector_size(32)));
  using u32 = std::uint32_t __attribute__((vector_size(64)));
};

/// N elements as floats (by default a native register's; the token columns take 8 on every
/// build): float and bf16 as whole vectors (bf16 a widen and a shift), half one by one.
template <class Element, std::int32_t N = native_lanes>
[[nodiscard]] inline typename lane_vectors<N>::f load_lanes(const Element* __restrict p) noexcept {
  using V = lane_vectors<N>;
  typename V::f v = {};
  if constexpr (std::is_same_v<Element, float>) {
    std::memcpy(&v, p, sizeof v);
  } else if constexpr (std::is_same_v<Element, bf16_bits>) {
    typename V::u16 b;
    std::memcpy(&b, p, sizeof b);
    v = (typename V::f)(__builtin_convertvector(b, typename V::u32) << 16);
  } else {
    for (std::int32_t l = 0; l < N; ++l) v[l] = load(p[l]);
  }
  return v;
}

/// @brief x[i] = sanitize(row[i]) for the whole registers of row (n rounded down to
///        native_lanes); returns their max and adds the count of non-finite values to `bad`.
///        The second pass of a row found to hold a NaN or an Inf.
template <class Element>
[[nodiscard]] inline float sanitize_row(const Element* __restrict row, std::int32_t n,
                                        float* __restrict x, std::int64_t& bad) noexcept {
  constexpr std::int32_t exponent = 0x7F800000;
  f32n lane = f32n{} - FLT_MAX;
  i32n nfv = {};  // (a true lane is -1)
  for (std::int32_t j = 0; j + native_lanes <= n; j += native_lanes) {
    const f32n v = load_lanes(row + j);
    nfv -= ((i32n)v & exponent) == exponent;
    const f32n c = sanitize_lanes(v);
    std::memcpy(x + j, &c, sizeof c);
    lane = lane > c ? lane : c;
  }
  std::int32_t nf = 0;
  for (std::int32_t l = 0; l < native_lanes; ++l) nf += nfv[l];
  bad += nf;
  return max_of_lanes(lane);
}

/// @brief x[i] = sanitize(row[i]) for i < n; returns the max of x and adds the count of
///        non-finite inputs to `bad`. One pass over whole registers: copied, with the max and
///        the largest exponent field taken on the way; only a row with a NaN or an Inf (an
///        all-ones exponent) is passed again, sanitised and counted (sanitize() leaves a finite
///        value as it is).
template <class Element>
[[nodiscard]] inline float load_row(const Element* __restrict row, std::int32_t n,
                                    float* __restrict x, std::int64_t& bad) noexcept {
  constexpr std::int32_t exponent = 0x7F800000;
  f32n lane = f32n{} - FLT_MAX;
  i32n top = {};  // per lane, the largest exponent field seen
  std::int32_t i = 0;
  for (; i + native_lanes <= n; i += native_lanes) {
    const f32n v = load_lanes(row + i);
    const i32n e = (i32n)v & exponent;
    top = top > e ? top : e;
    std::memcpy(x + i, &v, sizeof v);
    lane = lane > v ? lane : v;
  }
  bool clean = true;
  for (std::int32_t l = 0; l < native_lanes; ++l) clean &= top[l] != exponent;
  float m = max_of_lanes(lane);
  std::int32_t nf = 0;
  if (!clean) {  // NaN or Inf: the row again, sanitised and counted
    std::int64_t counted = 0;
    m = sanitize_row(row, i, x, counted);
    nf = static_cast<std::int32_t>(counted);
  }
  if constexpr (native_lanes > 8) {  // a row of 8 (Mixtral) or a tail of 8 in half a register
    if (i + 8 <= n) {
      f32x8 c = {};
      for (std::int32_t l = 0; l < 8; ++l) {
        const float v = load(row[i + l]);
        nf += nonfinite(v);
        c[l] = sanitize(v);
      }
      std::memcpy(x + i, &c, sizeof c);
      const float h = max_of_lanes(c);
      m = m > h ? m : h;
      i += 8;
    }
  }
  for (; i < n; ++i) {
    const float v = load(row[i]);
    nf += nonfinite(v);
    x[i] = sanitize(v);
    m = m > x[i] ? m : x[i];
  }
  bad += nf;
  return m;
}

/// @brief The sum of v[0, n) in double: four chains of 8 lanes (element i in chain i / 8 % 4,
///        so that the adds' latency overlaps), the chains added (0 + 1) + (2 + 3), the lanes
///        folded by halves, then the tail — one order for every ISA.
[[nodiscard]] inline double sum_row(const float* __restrict v, std::int32_t n) noexcept {
  // each chain's 8 lanes as two halves of 4 (an 8-double generic vector has no register below
  // AVX-512, where GCC kept the chains in memory; AVX-512's exp_row has its own chains)
  f64x4 lo[4] = {}, hi[4] = {};
  const auto add = [&lo, &hi, v](std::int32_t c, std::int32_t at) {
    f32x8 x;
    std::memcpy(&x, v + at, sizeof x);
    lo[c] += __builtin_convertvector(__builtin_shufflevector(x, x, 0, 1, 2, 3), f64x4);
    hi[c] += __builtin_convertvector(__builtin_shufflevector(x, x, 4, 5, 6, 7), f64x4);
  };
  std::int32_t i = 0;
  for (; i + 4 * sum_lanes <= n; i += 4 * sum_lanes) {
    add(0, i);
    add(1, i + sum_lanes);
    add(2, i + 2 * sum_lanes);
    add(3, i + 3 * sum_lanes);
  }
  // up to three whole groups of 8 left, into chains 0, 1, 2 (constant indices: registers)
  if (i + sum_lanes <= n) {
    add(0, i);
    i += sum_lanes;
    if (i + sum_lanes <= n) {
      add(1, i);
      i += sum_lanes;
      if (i + sum_lanes <= n) {
        add(2, i);
        i += sum_lanes;
      }
    }
  }
  // fold_sum of (0 + 1) + (2 + 3): lane j + lane j + 4, then (j + 2), then (+1)
  const f64x4 c = ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3]));
  double s = (c[0] + c[2]) + (c[1] + c[3]);
  for (; i < n; ++i) s += static_cast<double>(v[i]);
  return s;
}

/// @brief ex[i] = exp(x[i] - m) for i < n; returns sum_row(ex). With AVX-512 each 16 exps are
///        added to sum_row's chains while in a register (the same chains, the same bits).
[[nodiscard]] inline double exp_row(const float* __restrict x, std::int32_t n, float m,
                                    float* __restrict ex) noexcept {
#if defined(__AVX512F__)
  const __m512 mv = _mm512_set1_ps(m);
  f64x8 lane[4] = {};
  // e's halves into chains c and c + 1 (the maskz forms: the plain ones trip GCC 12's
  // -Wmaybe-uninitialized, and generic vectors convert a quarter register at a time)
  const auto half = [](__m512 v, int h) {  // AVX-512F only (no DQ)
    return h == 0 ? _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, _mm512_castps_pd(v), 0))
                  : _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, _mm512_castps_pd(v), 1));
  };
  const auto add = [&lane, &half](int c, __m512 e) {
    lane[c] += (f64x8)_mm512_maskz_cvtps_pd(0xff, half(e, 0));
    lane[c + 1] += (f64x8)_mm512_maskz_cvtps_pd(0xff, half(e, 1));
  };
  std::int32_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
    const __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), mv));
    _mm512_storeu_ps(ex + i, e0);
    _mm512_storeu_ps(ex + i + 16, e1);
    add(0, e0);
    add(2, e1);
  }
  if (i + 16 <= n) {
    const __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
    _mm512_storeu_ps(ex + i, e0);
    add(0, e0);
    i += 16;
  }
  if (i == n) return fold_sum((lane[0] + lane[1]) + (lane[2] + lane[3]));
  const auto live = static_cast<__mmask16>((1u << (n - i)) - 1u);
  const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, x + i), mv));
  _mm512_mask_storeu_ps(ex + i, live, e);
  // the tail as sum_row takes it: a whole group of 8 into the next chain (i is a multiple of
  // 16 here: chain 0 or 2, chosen by a branch, as an array index would put the chains in
  // memory), then one by one
  if (i + sum_lanes <= n) {
    const auto t = (f64x8)_mm512_maskz_cvtps_pd(0xff, half(e, 0));
    if (i % 32 == 0) {
      lane[0] += t;
    } else {
      lane[2] += t;
    }
    i += sum_lanes;
  }
  double s = fold_sum((lane[0] + lane[1]) + (lane[2] + lane[3]));
  for (; i < n; ++i) s += static_cast<double>(ex[i]);
  return s;
#else
  std::int32_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 mv = _mm256_set1_ps(m);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(ex + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv)));
#endif
  for (; i < n; ++i) ex[i] = exp(x[i] - m);
  return sum_row(ex, n);
#endif
}

/// @brief p[i] = float(ex[i] / sum) for i < n (by a multiply with 1 / sum in double).
inline void normalize_row(const float* __restrict ex, std::int32_t n, double sum,
                          float* __restrict p) noexcept {
  const double inv = 1.0 / sum;
  for (std::int32_t i = 0; i < n; ++i) p[i] = static_cast<float>(static_cast<double>(ex[i]) * inv);
}

/// @brief The aux pass of a softmax row in one sweep: with Normalize, v = float(ex[i] * inv)
///        (normalize_row's bits, inv = 1 / sum), stored to p[i] when Keep (something reads
///        the row later), else v = p[i]; acc[i] += v in double; returns how many v are at or
///        above `least`.
template <bool Normalize, bool Keep>
[[nodiscard]] inline std::int32_t aux_row(const float* __restrict ex, std::int32_t n, double inv,
                                          float* __restrict p, double* __restrict acc,
                                          float least) noexcept {
  std::int32_t at_least = 0;
  for (std::int32_t i = 0; i < n; ++i) {
    float v;
    if constexpr (Normalize) {
      v = static_cast<float>(static_cast<double>(ex[i]) * inv);
      if constexpr (Keep) p[i] = v;
    } else {
      v = p[i];
    }
    acc[i] += static_cast<double>(v);
    at_least += v >= least ? 1 : 0;
  }
  return at_least;
}

/// @brief The aux pass of a per-expert score row: v = scores[i] / denom (the reference's
///        expression), stored to p[i] when Keep (p may be scores: in place); acc[i] += v in
///        double; returns how many v are at or above `least`.
template <bool Keep>
[[nodiscard]] inline std::int32_t aux_quotient_row(const float* scores, std::int32_t n, float denom,
                                                   float* p, double* __restrict acc,
                                                   float least) noexcept {
  std::int32_t at_least = 0;
  for (std::int32_t i = 0; i < n; ++i) {
    const float v = scores[i] / denom;
    if constexpr (Keep) p[i] = v;
    acc[i] += static_cast<double>(v);
    at_least += v >= least ? 1 : 0;
  }
  return at_least;
}

/// @brief acc[i] += v[i] in double (a partial sum a task owns).
inline void accumulate_row(const float* __restrict v, std::int32_t n,
                           double* __restrict acc) noexcept {
  for (std::int32_t i = 0; i < n; ++i) acc[i] += static_cast<double>(v[i]);
}

#if defined(__AVX512F__)
/// 2^(j/16) for j = 0..15 as hi + lo: hi the nearest float, lo the nearest float to the rest
/// (sigmoid16's table).
alignas(64) inline constexpr float exp2_sixteenths_hi[16] = {
    0x1p+0f,        0x1.0b5586p+0f, 0x1.172b84p+0f, 0x1.2387a6p+0f, 0x1.306fep+0f,  0x1.3dea64p+0f,
    0x1.4bfdaep+0f, 0x1.5ab07ep+0f, 0x1.6a09e6p+0f, 0x1.7a1148p+0f, 0x1.8ace54p+0f, 0x1.9c4918p+0f,
    0x1.ae89fap+0f, 0x1.c199bep+0f, 0x1.d5818ep+0f, 0x1.ea4afap+0f};
alignas(64) inline constexpr float exp2_sixteenths_lo[16] = {0.0f,
                                                             0x1.9f3122p-25f,
                                                             -0x1.c15742p-27f,
                                                             0x1.ceac48p-25f,
                                                             0x1.4636e2p-25f,
                                                             0x1.824684p-25f,
                                                             -0x1.593abcp-25f,
                                                             -0x1.5bd5ecp-27f,
                                                             0x1.9fcef4p-26f,
                                                             -0x1.829fdp-25f,
                                                             0x1.15506ep-27f,
                                                             0x1.51f848p-27f,
                                                             -0x1.a94b14p-26f,
                                                             -0x1.3d56b2p-27f,
                                                             -0x1.822dbcp-27f,
                                                             0x1.52486cp-27f};

/// @brief sigmoid of 16 lanes, 1 / (1 + exp(-v)), for any v (NaN and -Inf give 0, +Inf 1:
///        sigmoid of sanitize(v)). Its own exp, cheaper than exp16 (13 operations instead of
///        17 with the negation and clamp): -v = (k / 16) ln2 + r with |r| <= ln2 / 32, exp(r)
///        by a degree-3 polynomial, 2^(k mod 16 / 16) from a 16-entry table in two registers
///        (hi + lo, one permute each) and 2^floor(k / 16) by vscalefps.
/// @note Error bound: at most 3 ulp from the exact sigmoid where exp(-v) is finite (the
///       reference's float formula is itself up to 2.5 ulp off; measured: 2.5, the same);
///       where exp(-v) overflows (v < -88.72) the result is 0, as the formula's. Checked over
///       every 61st float of [-89, 104] by tests/cpu/math_test.cpp.
[[gnu::always_inline]] inline __m512 sigmoid16(__m512 v) noexcept {
  constexpr __mmask16 all = 0xffff;  // (maskz forms: see clamp)
  // -v within [-104, 89]: below, the result is 1 whatever exp(-v) is; above, exp overflows to
  // +inf as the formula's does. (clamp takes a NaN to its low bound: -89, so 0.)
  const auto c = (__m512)clamp((f32x16)v, -89.0f, 104.0f);
  // k = round(-16 c / ln2), in the low mantissa bits of km (|k| <= 2401)
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 km = _mm512_fmadd_ps(c, _mm512_set1_ps(-0x1.715476p+4f), magic);
  const __m512 kf = _mm512_sub_ps(km, magic);
  // r = -c - k ln2 / 16, ln2 / 16 in two parts (hi has 11 bits: k * hi is exact)
  __m512 r = _mm512_fnmsub_ps(kf, _mm512_set1_ps(0x1.63p-5f), c);
  r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(-0x1.bd0106p-17f), r);
  // exp(r) - 1 = r + r^2 / 2 + r^3 / 6 (the next term is below 1e-8 relative)
  __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 6.0f), r, _mm512_set1_ps(0.5f));
  q = _mm512_mul_ps(_mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f)), r);
  // 2^(j / 16) exp(r) = hi + (hi q + lo), j = k mod 16 (vpermps reads the index's low 4 bits)
  const __m512i j = _mm512_castps_si512(km);
  const __m512 hi = _mm512_maskz_permutexvar_ps(all, j, _mm512_load_ps(exp2_sixteenths_hi));
  const __m512 lo = _mm512_maskz_permutexvar_ps(all, j, _mm512_load_ps(exp2_sixteenths_lo));
  const __m512 m = _mm512_add_ps(hi, _mm512_fmadd_ps(hi, q, lo));
  const __m512 e = _mm512_maskz_scalef_ps(all, m, _mm512_mul_ps(kf, _mm512_set1_ps(0.0625f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, e));
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
/// The AVX2 sigmoid of 8 lanes, sigmoid(sanitize(v)) for any v: clamped (a NaN to its low
/// bound), negated, exp8, 1 / (1 + e).
[[gnu::always_inline]] inline __m256 sigmoid8(__m256 v) noexcept {
  const auto c = (__m256)clamp((f32x8)v, -FLT_MAX, FLT_MAX);
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), c))));
}
#endif

/// @brief out[i] = sigmoid(sanitize(x[i])) = 1 / (1 + exp(-x)) for i < n: sigmoid16 on
///        AVX-512, else with exp() (both within 3 ulp of the sigmoid, docs/numerics.md).
inline void sigmoid_row(const float* __restrict x, std::int32_t n, float* __restrict out) noexcept {
#if defined(__AVX512F__)
  std::int32_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, sigmoid16(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const auto live = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(out + i, live, sigmoid16(_mm512_maskz_loadu_ps(live, x + i)));
  }
#else
  std::int32_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, sigmoid8(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) out[i] = 1.0f / (1.0f + exp(-sanitize(x[i])));
#endif
}

#if defined(__AVX512F__)
#define MOEROUTE_CPU_FUSED_SIGMOID 1
/// @brief A per-expert sigmoid row in one pass (DeepSeek-V3's scores): x[i] = sanitize(row[i])
///        (the non-finite inputs added to `bad`), scores[i] = sigmoid(x[i]) as sigmoid_row
///        computes it, and with a bias sel[i] = scores[i] + bias[i]; returns the max of x and
///        sets `sum` to sum_row_f32(scores, n) (the same lanes added in the same order: the
///        same bits). n % 16 == 0; the bias finite (gating checks it), so the sum needs no
///        sanitise. One pass where load_row, sigmoid_row, the bias and the aux denominator's
///        sum took four; as in load_row, x is stored as read and only a row with a NaN or an
///        Inf is passed again (sigmoid16 gives sigmoid(sanitize(v)) for any v).
template <class Element>
[[nodiscard]] inline float sigmoid_row_fused(const Element* __restrict row, std::int32_t n,
                                             const float* __restrict bias, float* __restrict x,
                                             float* __restrict scores, float* __restrict sel,
                                             std::int64_t& bad, float& sum) noexcept {
  constexpr __mmask16 all = 0xffff;  // (maskz forms: see clamp)
  const __m512i exponent = _mm512_set1_epi32(0x7F800000);
  __m512 top = _mm512_set1_ps(-FLT_MAX), total = _mm512_setzero_ps();
  __m512i exponents = _mm512_setzero_si512();  // per lane, the largest exponent field seen
  for (std::int32_t i = 0; i < n; i += 16) {
    const auto v = (__m512)load_lanes(row + i);
    exponents =
        _mm512_maskz_max_epi32(all, exponents, _mm512_and_si512(_mm512_castps_si512(v), exponent));
    _mm512_storeu_ps(x + i, v);
    top = _mm512_maskz_max_ps(all, top, v);
    const __m512 sv = sigmoid16(v);
    _mm512_storeu_ps(scores + i, sv);
    total = _mm512_add_ps(total, sv);
    if (bias != nullptr) _mm512_storeu_ps(sel + i, _mm512_add_ps(sv, _mm512_loadu_ps(bias + i)));
  }
  sum = fold_sum((f32x16)total);
  if (_mm512_cmpeq_epi32_mask(exponents, exponent) != 0) return sanitize_row(row, n, x, bad);
  return max_of_lanes((f32x16)top);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define MOEROUTE_CPU_FUSED_SIGMOID 1
/// @brief The same pass on AVX2: sigmoid_row's AVX2 sigmoid (sigmoid8),
///        the sum in sum_row_f32's 16 lanes as two halves; the same bits as load_row,
///        sigmoid_row, the bias add and sum_row_f32 on AVX2. n % 16 == 0.
template <class Element>
[[nodiscard]] inline float sigmoid_row_fused(const Element* __restrict row, std::int32_t n,
                                             const float* __restrict bias, float* __restrict x,
                                             float* __restrict scores, float* __restrict sel,
                                             std::int64_t& bad, float& sum) noexcept {
  const __m256i exponent = _mm256_set1_epi32(0x7F800000);
  __m256 top = _mm256_set1_ps(-FLT_MAX), total[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256i exponents = _mm256_setzero_si256();  // per lane, the largest exponent field seen
  for (std::int32_t i = 0; i < n; i += 16) {
    for (std::int32_t h = 0; h < 2; ++h) {
      const std::int32_t at = i + 8 * h;
      const auto v = (__m256)load_lanes(row + at);
      exponents = _mm256_max_epi32(exponents, _mm256_and_si256(_mm256_castps_si256(v), exponent));
      _mm256_storeu_ps(x + at, v);
      top = _mm256_max_ps(top, v);
      const __m256 sv = sigmoid8(v);
      _mm256_storeu_ps(scores + at, sv);
      total[h] = _mm256_add_ps(total[h], sv);
      if (bias != nullptr)
        _mm256_storeu_ps(sel + at, _mm256_add_ps(sv, _mm256_loadu_ps(bias + at)));
    }
  }
  sum = fold_sum((f32x8)total[0], (f32x8)total[1]);
  if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(exponents, exponent)) != 0)
    return sanitize_row(row, n, x, bad);
  return max_of_lanes((f32x8)top);
}
#endif

}  // namespace moeroute::cpu::math
