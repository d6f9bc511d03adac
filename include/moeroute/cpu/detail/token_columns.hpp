// SPDX-License-Identifier: Apache-2.0
// Gating's token columns (AVX2): eight tokens side by side, one per lane of a register, each
// register one expert, so that a softmax or sigmoid row's steps — the max, the exps and their
// double sum, P or the sigmoids and their float sum, the top-k (k <= 8) — are lane-wise
// operations with no reduction across lanes. Row by row, a short row spends its time in
// reductions and their dependent chains (Mixtral's 8 experts are one register: max, exp, sum,
// log and the selection one chain per token). gating_agent::gate_columns drives them.
//
// Each lane does the row path's operations in the row path's order — load_row's lane maxima
// and their fold, exp8, sum_row's four chains of 8 lanes and their folds, normalize_row's
// multiply, sigmoid8, sum_row_f32's 16 lanes — so a token's bits are the same in either path
// (tests/cpu/gating_columns_test.cpp compares each kernel with its row kernel and the outputs
// token by token, and every gating case compares its lean run, which takes this path, with its
// full run, which takes rows). AVX-512 builds take the same 8-lane columns, with load_row's
// 16-lane maxima and its half-register tail, two columns a register where that halves the
// operations (the exps, the transposes in and out: transpose16); `pays` says for which rows.
#pragma once

#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include <moeroute/config.hpp>
#include <moeroute/cpu/detail/math.hpp>
#include <moeroute/cpu/detail/select.hpp>
#include <moeroute/cpu/detail/sort_network.hpp>

#if defined(__AVX2__) && defined(__FMA__)
#define MOEROUTE_CPU_TOKEN_COLUMNS 1
#include <immintrin.h>

namespace moeroute::cpu::detail::columns {

/// Tokens of a column tile (lanes of an AVX2 float register; AVX-512 builds take the same
/// 8-lane columns).
inline constexpr std::int32_t lanes = 8;

/// True where the columns beat the row path for rows of E experts (the other bounds are
/// gating_agent's). Measured on one thread at T = 16384 (docs/performance.md, session 36, an
/// Intel Xeon with AVX-512), with top_k's keys: up to 128 experts the columns win on both ISAs
/// or tie (AVX-512: Qwen3 (128, 8) 1.63 -> 1.20 ns per logit, Switch (128, 1) 1.45 -> 1.01;
/// AVX2: Qwen3 2.17 -> 1.65, Megatron (128, 2) 1.82 -> 1.58, (128, 4) and (128, 1) even).
/// At 256 the columns' scratch crowds L1 (rows 5-15 % faster, session 30).
[[nodiscard]] constexpr bool pays(std::int32_t E) noexcept { return E <= 128; }

using math::f32x4;
using math::f32x8;
using math::f64x4;
using i32x8 = std::int32_t __attribute__((vector_size(32)));

/// Transposes 8 x 8 floats in registers: r[i] lane j becomes r[j] lane i.
[[gnu::always_inline]] inline void transpose8(__m256* r) noexcept {
  __m256 t[8], u[8];
  for (std::int32_t i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (std::int32_t i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (std::int32_t i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

#if defined(__AVX512F__)
// An 8 x 16 transpose in three steps of two-register permutes (vpermt2ps: 24 for 128 floats,
// where transpose8's unpacks, shuffles and lane permutes take 48, all on the one shuffle port).
// Eight registers of 16 lanes hold a block of 8 tokens t by 16 experts e; a layout says which
// bit of (t, e) each of the 7 position bits holds — lane bits 0-3, then register bits 0-2 — as
// a label: t0 t1 t2 = 0 1 2, e0 .. e3 = 3 .. 6. Consecutive layouts differ by one register bit
// and one lane bit trading labels, so each output register is one permute of a pair.
namespace transpose16 {
using layout = std::array<std::int8_t, 7>;
/// token t's experts in register t (lanes e)
inline constexpr layout rows = {3, 4, 5, 6, 0, 1, 2};
inline constexpr layout step1 = {3, 4, 5, 2, 0, 1, 6};  // t2 into lane bit 3, e3 out
inline constexpr layout step2 = {3, 4, 1, 2, 0, 5, 6};  // t1 into lane bit 2, e2 out
/// the token columns: register j holds experts 2j (lanes 0-7) and 2j + 1 (lanes 8-15), token t
/// in lane t: xc's layout, 16 floats at xc + 2j * 8
inline constexpr layout columns = {0, 1, 2, 3, 4, 5, 6};

/// The register bit whose label differs between two consecutive layouts.
[[nodiscard]] constexpr std::int32_t exchanged(const layout& from, const layout& to) noexcept {
  std::int32_t r = 0;
  while (from[4 + r] == to[4 + r]) ++r;
  return r;
}

/// The vpermt2ps indices of output register v << r (v = 0, 1; r = exchanged) of a pair whose
/// other register bits are 0: lane i takes the element with the same labels from register
/// (0 or 1 << r, index + 16) of `from`.
[[nodiscard]] constexpr std::array<std::int32_t, 16> index(const layout& from, const layout& to,
                                                           std::int32_t v) noexcept {
  const std::int32_t r = exchanged(from, to);
  std::array<std::int32_t, 16> idx{};
  for (std::int32_t i = 0; i < 16; ++i) {
    const std::int32_t at = i | v << (4 + r);  // position bits of `to`
    std::int32_t labels = 0;
    for (std::int32_t p = 0; p < 7; ++p) labels |= (at >> p & 1) << to[p];
    std::int32_t src = 0;  // position bits of `from`
    for (std::int32_t p = 0; p < 7; ++p) src |= (labels >> from[p] & 1) << p;
    idx[i] = (src >> (4 + r) & 1) * 16 + (src & 15);
  }
  return idx;
}

/// One step: v from layout `from` to layout `to`.
template <const layout& from, const layout& to>
[[gnu::always_inline]] inline void step(__m512* v) noexcept {
  constexpr std::int32_t r = exchanged(from, to);
  static constexpr std::array<std::int32_t, 16> lo = index(from, to, 0), hi = index(from, to, 1);
  const __m512i ilo = _mm512_loadu_si512(lo.data()), ihi = _mm512_loadu_si512(hi.data());
  for (std::int32_t a = 0; a < 8; ++a) {
    if ((a >> r & 1) != 0) continue;
    const __m512 x = v[a], y = v[a | 1 << r];
    v[a] = _mm512_permutex2var_ps(x, ilo, y);
    v[a | 1 << r] = _mm512_permutex2var_ps(x, ihi, y);
  }
}

/// Token rows (register t: token t's 16 experts) to token columns (register j: experts 2j and
/// 2j + 1, a token a lane).
[[gnu::always_inline]] inline void rows_to_columns(__m512* v) noexcept {
  step<rows, step1>(v);
  step<step1, step2>(v);
  step<step2, columns>(v);
}
/// The inverse of rows_to_columns.
[[gnu::always_inline]] inline void columns_to_rows(__m512* v) noexcept {
  step<columns, step2>(v);
  step<step2, step1>(v);
  step<step1, rows>(v);
}
}  // namespace transpose16
#endif

[[gnu::always_inline]] inline f32x8 load8(const float* p) noexcept {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline void store8(float* p, const f32x8& v) noexcept {
  std::memcpy(p, &v, sizeof v);
}
/// lanes 0-3 (h = 0) or 4-7 (h = 1) of a column, widened to double
[[gnu::always_inline]] inline f64x4 half_of(const float* c, std::int32_t h) noexcept {
  f32x4 v;
  std::memcpy(&v, c + 4 * h, sizeof v);
  return __builtin_convertvector(v, f64x4);
}
#if defined(__AVX512F__)
using math::f64x8;
/// A column's 8 floats widened (one vcvtps2pd).
[[gnu::always_inline]] inline f64x8 column_of(const float* c) noexcept {
  return (f64x8)_mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(c));
}
#endif

/// One block of 8 experts of the 8 rows as columns: loaded (`special` marks an all-ones
/// exponent field), transposed and stored, xc[(b + l) * 8 + t]; r[l] is column b + l. `next`
/// (or null): the next tile's rows, whose same block is prefetched where it starts a line.
template <class Element>
[[gnu::always_inline]] inline void load_block8(const Element* __restrict rows, std::int32_t E,
                                               std::int32_t b, float* __restrict xc, i32x8& special,
                                               __m256* r, const Element* next = nullptr) noexcept {
  const i32x8 exponent = i32x8{} + 0x7F800000;
  for (std::int32_t t = 0; t < 8; ++t) {
    const std::int64_t at = static_cast<std::int64_t>(t) * E + b;
    if (next != nullptr && at * static_cast<std::int64_t>(sizeof(Element)) % 64 == 0)
      __builtin_prefetch(next + at, 0, 3);
    const f32x8 v = math::load_lanes<Element, 8>(rows + at);
    special |= ((i32x8)v & exponent) == exponent;
    r[t] = (__m256)v;
  }
  transpose8(r);
  for (std::int32_t l = 0; l < 8; ++l) store8(xc + (b + l) * 8, (f32x8)r[l]);
}

/// max_of_lanes over w lane maxima v[0, w): lanes l and l + w / 2 for w, w / 2, ..., 2 (the
/// lower half's when greater).
[[gnu::always_inline]] inline f32x8 fold_max(f32x8* v, std::int32_t w) noexcept {
  for (; w > 1; w /= 2)
    for (std::int32_t l = 0; l < w / 2; ++l) v[l] = v[l] > v[l + w / 2] ? v[l] : v[l + w / 2];
  return v[0];
}

#if defined(__AVX512F__)
/// @brief load for rows of 16 experts or more on AVX-512: whole blocks of 16 loaded as 16-lane
///        rows and transposed by permutes (transpose16), a tail of 8 as load_row's
///        half-register tail; `next` (or null): the next tile's rows, prefetched a line a row
///        as each block is loaded (the hardware's prefetch left ~50 ns a tile of 64 experts
///        waiting on memory: Megatron's gating 1.07-1.10 -> 0.98-0.99 ns per logit).
template <class Element>
[[nodiscard]] inline bool load_wide(const Element* __restrict rows, std::int32_t E,
                                    float* __restrict xc, f32x8& m, f32x8& lo,
                                    const Element* next) noexcept {
  using math::f32x16;
  using i32x16 = std::int32_t __attribute__((vector_size(64)));
  const std::int32_t whole = E / 16 * 16;
  // lane16[j]: load_row's running maxima of its lanes 2j (lanes 0-7) and 2j + 1 (8-15), the
  // same maxima of the same values as 8-lane registers would hold
  f32x16 lane16[8], lo16 = f32x16{} + FLT_MAX;
  for (auto& v : lane16) v = f32x16{} - FLT_MAX;
  i32x16 top = {};  // the largest exponent field seen, lane by lane
  for (std::int32_t b = 0; b < whole; b += 16) {
    __m512 r[8];
    for (std::int32_t t = 0; t < 8; ++t) {
      const std::int64_t at = static_cast<std::int64_t>(t) * E + b;
      if (next != nullptr) __builtin_prefetch(next + at, 0, 3);
      const f32x16 v = math::load_lanes<Element, 16>(rows + at);
      const i32x16 e = (i32x16)v & 0x7F800000;
      top = top > e ? top : e;
      r[t] = (__m512)v;
    }
    transpose16::rows_to_columns(r);
    for (std::int32_t j = 0; j < 8; ++j) {
      const auto c = (f32x16)r[j];
      _mm512_storeu_ps(xc + (b + 2 * j) * 8, r[j]);
      lo16 = lo16 < c ? lo16 : c;
      lane16[j] = lane16[j] > c ? lane16[j] : c;
    }
  }
  const auto half = [](const auto& v, std::int32_t h) {
    return h == 0 ? __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
                  : __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  };
  f32x8 lane[16];
  for (std::int32_t j = 0; j < 8; ++j) {
    lane[2 * j] = half(lane16[j], 0);
    lane[2 * j + 1] = half(lane16[j], 1);
  }
  lo = half(lo16, 0) < half(lo16, 1) ? half(lo16, 0) : half(lo16, 1);
  const i32x8 exponent = i32x8{} + 0x7F800000;
  i32x8 special = (half(top, 0) == exponent) | (half(top, 1) == exponent);
  m = fold_max(lane, 16);
  if (whole < E) {
    __m256 r[8];
    load_block8(rows, E, whole, xc, special, r);
    f32x8 tail[8];
    for (std::int32_t l = 0; l < 8; ++l) {
      tail[l] = (f32x8)r[l];
      lo = (f32x8)_mm256_min_ps((__m256)lo, r[l]);
    }
    const f32x8 h = fold_max(tail, 8);
    m = m > h ? m : h;
  }
  return _mm256_testz_si256((__m256i)special, (__m256i)special) != 0;
}
#endif

/// @brief The sanitised logits of 8 rows of E (E a multiple of 8) as columns, xc[e * 8 + t],
///        each row's max in load_row's order (lane maxima of 8, folded by halves), and its min
///        (exp_and_sum's test for the moderate exp). next (or null): the next tile's rows, for
///        load_wide's prefetch.
/// @return false, with xc partly written, when a value is NaN or +-Inf: those rows take the
///         row path, which sanitises and counts them.
template <class Element>
[[nodiscard]] inline bool load(const Element* __restrict rows, std::int32_t E, float* __restrict xc,
                               f32x8& m, f32x8& lo, const Element* next = nullptr) noexcept {
#if defined(__AVX512F__)
  if (E >= 16) return load_wide(rows, E, xc, m, lo, next);
#endif
  // lane[l]: load_row's running max of its lane l (native_lanes of them: 8 on AVX2, 16 on
  // AVX-512, where only a row of 8, load_row's half-register tail, comes here), for each token
  constexpr std::int32_t R = math::native_lanes;
  static_assert(R == 8 || R == 16);
  f32x8 lane[R];
  for (auto& v : lane) v = f32x8{} - FLT_MAX;
  lo = f32x8{} + FLT_MAX;
  f32x8 tail[8];
  const std::int32_t whole = E / R * R;
  i32x8 special = {};  // all-ones exponent fields seen
  for (std::int32_t b = 0; b < E; b += 8) {
    __m256 r[8];
    load_block8(rows, E, b, xc, special, r, next);
    for (std::int32_t l = 0; l < 8; ++l) {
      const auto c = (f32x8)r[l];
      lo = (f32x8)_mm256_min_ps((__m256)lo, (__m256)c);
      if (b < whole) {
        f32x8& x = lane[b % R + l];
        x = x > c ? x : c;
      } else {
        tail[l] = c;
      }
    }
  }
  m = fold_max(lane, R);
  if (whole < E) {
    const f32x8 h = fold_max(tail, 8);
    m = m > h ? m : h;
  }
  return _mm256_testz_si256((__m256i)special, (__m256i)special) != 0;
}

/// @brief ec = exp(xc - m) column by column (exp8); lo: each token's smallest logit (load's);
///        sum[h] = each token's sum_row of its exps,
///        tokens 4h .. 4h + 3: sum_row's chain c lane l holds the exps of experts 8g + l,
///        g = c, c + 4, ..., added from 0; the chains are folded (0 + 1) + (2 + 3), lanes j
///        and j + 4 added, then (0 + 2) + (1 + 3).
inline void exp_and_sum(const float* __restrict xc, std::int32_t E, const f32x8& m, const f32x8& lo,
                        float* __restrict ec, f64x4* sum) noexcept {
#if defined(__AVX512F__)
  // two columns a register (exp16: exp8's bits), and each chain's 8 tokens in one register of
  // doubles (the same adds lane by lane): about half the instructions
  (void)lo;
  const auto m2 =
      (__m512)__builtin_shufflevector(m, m, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
  for (std::int32_t e = 0; e < E; e += 2)
    _mm512_storeu_ps(ec + e * 8, math::exp16(_mm512_sub_ps(_mm512_loadu_ps(xc + e * 8), m2)));
  const std::int32_t groups = E / 8;
  const auto chain = [&](std::int32_t c, std::int32_t l) {
    f64x8 s = {};
    for (std::int32_t g = c; g < groups; g += 4) s += column_of(ec + (8 * g + l) * 8);
    return s;
  };
  const auto folded = [&](std::int32_t l) {
    return (chain(0, l) + chain(1, l)) + (chain(2, l) + chain(3, l));
  };
  f64x8 c[4];
  for (std::int32_t j = 0; j < 4; ++j) c[j] = folded(j) + folded(j + 4);
  const f64x8 all = (c[0] + c[2]) + (c[1] + c[3]);
  sum[0] = __builtin_shufflevector(all, all, 0, 1, 2, 3);
  sum[1] = __builtin_shufflevector(all, all, 4, 5, 6, 7);
#else
  // exp8_moderate where every token's smallest logit lies within 86 of its max (x - m rounds
  // monotonically: every y of the tile is then >= -86): Switch's gating 1.46 -> 1.35 ns per
  // logit (a separate pass for the minima, not load's, gained nothing)
  const __m256 moderate = _mm256_cmp_ps(_mm256_sub_ps((__m256)lo, (__m256)m),
                                        _mm256_set1_ps(math::exp8_moderate_min), _CMP_GE_OQ);
  if (_mm256_movemask_ps(moderate) == 0xff) {
    for (std::int32_t e = 0; e < E; ++e)
      _mm256_storeu_ps(ec + e * 8,
                       math::exp8_moderate(_mm256_sub_ps(_mm256_loadu_ps(xc + e * 8), (__m256)m)));
  } else {
    for (std::int32_t e = 0; e < E; ++e)
      _mm256_storeu_ps(ec + e * 8,
                       math::exp8(_mm256_sub_ps(_mm256_loadu_ps(xc + e * 8), (__m256)m)));
  }
  const std::int32_t groups = E / 8;
  for (std::int32_t h = 0; h < 2; ++h) {
    const auto chain = [&](std::int32_t c, std::int32_t l) {
      f64x4 s = {};
      for (std::int32_t g = c; g < groups; g += 4) s += half_of(ec + (8 * g + l) * 8, h);
      return s;
    };
    const auto folded = [&](std::int32_t l) {
      return (chain(0, l) + chain(1, l)) + (chain(2, l) + chain(3, l));
    };
    f64x4 c[4];
    for (std::int32_t j = 0; j < 4; ++j) c[j] = folded(j) + folded(j + 4);
    sum[h] = (c[0] + c[2]) + (c[1] + c[3]);
  }
#endif
}

MOEROUTE_PRECISE_FP_BEGIN
/// @brief lse[l] = float(double(m[l]) + log(sum of token l)): the row path's logsumexp, by
///        math::log_lanes on the 8 sums at once (math::log's bits: it is log_lanes on one
///        double), where 8 scalar logs of ~40 dependent operations each were 0.08 ns per logit
///        of a 64-expert row. A sum is >= 1 (the max's exp) and finite.
inline void logsumexp(const f32x8& m, const f64x4* sum, float* lse) noexcept {
#if defined(__AVX512F__)
  f64x8 s = __builtin_shufflevector(sum[0], sum[1], 0, 1, 2, 3, 4, 5, 6, 7);
  math::log_lanes(s);
  const f32x8 r = __builtin_convertvector(__builtin_convertvector(m, f64x8) + s, f32x8);
  std::memcpy(lse, &r, sizeof r);
#else
  for (std::int32_t h = 0; h < 2; ++h) {
    f64x4 s = sum[h];
    math::log_lanes(s);
    f32x4 mh;
    std::memcpy(&mh, reinterpret_cast<const float*>(&m) + 4 * h, sizeof mh);
    const f32x4 r = __builtin_convertvector(__builtin_convertvector(mh, f64x4) + s, f32x4);
    std::memcpy(lse + 4 * h, &r, sizeof r);
  }
#endif
}
MOEROUTE_PRECISE_FP_END

/// @brief c = float(double(c) * inv) in place, column by column (normalize_row's bits; inv[h]
///        = 1 / sum of tokens 4h .. 4h + 3).
inline void normalize(float* __restrict c, std::int32_t E, const f64x4* inv) noexcept {
#if defined(__AVX512F__)
  const f64x8 both = __builtin_shufflevector(inv[0], inv[1], 0, 1, 2, 3, 4, 5, 6, 7);
  for (std::int32_t e = 0; e < E; ++e)
    store8(c + e * 8, __builtin_convertvector(column_of(c + e * 8) * both, f32x8));
#else
  for (std::int32_t e = 0; e < E; ++e) {
    const f32x4 lo = __builtin_convertvector(half_of(c + e * 8, 0) * inv[0], f32x4);
    const f32x4 hi = __builtin_convertvector(half_of(c + e * 8, 1) * inv[1], f32x4);
    std::memcpy(c + e * 8, &lo, sizeof lo);
    std::memcpy(c + e * 8 + 4, &hi, sizeof hi);
  }
#endif
}

/// @brief sc = sigmoid(xc) column by column (sigmoid_row's sigmoid lane-wise: its bits; sigmoid8
///        on AVX2, sigmoid16 on AVX-512).
inline void sigmoid(const float* __restrict xc, std::int32_t E, float* __restrict sc) noexcept {
#if defined(__AVX512F__)
  for (std::int32_t e = 0; e < E; e += 2)  // (two columns a register)
    _mm512_storeu_ps(sc + e * 8, math::sigmoid16(_mm512_loadu_ps(xc + e * 8)));
#else
  for (std::int32_t e = 0; e < E; ++e)
    _mm256_storeu_ps(sc + e * 8, math::sigmoid8(_mm256_loadu_ps(xc + e * 8)));
#endif
}

/// @brief out = sanitize(c + bias[e]) column by column (select_values' sum; sigmoid_row_fused
///        adds the bias to scores in [0, 1] without the sanitise, which leaves those as they are).
inline void add_bias(const float* __restrict c, std::int32_t E, const float* __restrict bias,
                     float* __restrict out) noexcept {
  for (std::int32_t e = 0; e < E; ++e)
    store8(out + e * 8, math::sanitize_lanes(load8(c + e * 8) + bias[e]));
}

/// @brief Each token's sum_row_f32 of its column values: 16 float lanes (element e in lane
///        e % 16, added from 0 block by block), folded by math::fold_sum's halves (l + l + 8,
///        then + 4, then (0 + 2) + (1 + 3)), then a tail of 8 added one by one.
inline f32x8 sum_f32(const float* __restrict c, std::int32_t E) noexcept {
  const std::int32_t whole = E / 16 * 16;
  f32x8 h[8];  // lane l + lane l + 8
  for (std::int32_t l = 0; l < 8; ++l) {
    f32x8 lo = {}, hi = {};
    for (std::int32_t b = 0; b < whole; b += 16) {
      lo += load8(c + (b + l) * 8);
      hi += load8(c + (b + l + 8) * 8);
    }
    h[l] = lo + hi;
  }
  f32x8 f[4];
  for (std::int32_t j = 0; j < 4; ++j) f[j] = h[j] + h[j + 4];
  f32x8 s = (f[0] + f[2]) + (f[1] + f[3]);
  for (std::int32_t e = whole; e < E; ++e) s += load8(c + e * 8);
  return s;
}

/// @brief c = c / denom in place, column by column (aux_quotient_row's quotients).
inline void divide(float* __restrict c, std::int32_t E, const f32x8& denom) noexcept {
  for (std::int32_t e = 0; e < E; ++e) store8(c + e * 8, load8(c + e * 8) / denom);
}

/// The most choices per token the columns select.
inline constexpr std::int32_t max_choices = 8;

/// @brief The K best experts of each token over columns c, best first, by insertion: ids id[j],
///        values b[j]. Ties to the lower index: an expert displaces a place only when strictly
///        larger, so equal values keep index order (-0 and +0 tie, as select.hpp ranks them; b[j]
///        may then hold the other zero). The values must be finite. A place costs a compare and
///        four selects per expert (top_k's keys take the tiles without near ties).
template <std::int32_t K>
inline void top_k_inserted(const float* __restrict c, std::int32_t E, i32x8* id,
                           f32x8* b) noexcept {
  for (std::int32_t j = 0; j < K; ++j) {
    b[j] = f32x8{} - __builtin_inff();
    id[j] = i32x8{};
  }
  i32x8 e_lanes = {};
  for (std::int32_t e = 0; e < E; ++e, e_lanes += 1) {
    const f32x8 v = load8(c + e * 8);
    i32x8 gt[K];
    for (std::int32_t j = 0; j < K; ++j) gt[j] = v > b[j];
    // place j takes place j - 1's entry when v beat that, else v when v beat place j (b sorted:
    // the values by max(b[j], min(b[j - 1], v)))
    for (std::int32_t j = K - 1; j > 0; --j) {
      id[j] = gt[j - 1] ? id[j - 1] : (gt[j] ? e_lanes : id[j]);
      const f32x8 lo = v < b[j - 1] ? v : b[j - 1];
      b[j] = b[j] > lo ? b[j] : lo;
    }
    id[0] = gt[0] ? e_lanes : id[0];
    b[0] = b[0] > v ? b[0] : v;
  }
}

// Selection by 32-bit keys. A key is a value's int32 order (select.hpp's ordered_int32: -0 made
// +0, the sign folded so that integer order is float order) with its low key_index_bits replaced by
// 127 - e: eight tokens a register (where 64-bit keys take four on AVX2, which has no 64-bit
// max), and a place one integer max and one min (where insertion by value carries the ids
// through four selects). Replacing those bits ranks two values that agree above them by index
// rather than value, so the keys' choice is top_k_inserted's exactly when no two of a token's
// K + 1 best keys agree above the index bits (adjacent in order: a sorted sequence); a tile
// where any token has such a near tie (true ties included: equal values, or -0 and +0) goes by
// insertion instead. Random logits: about 1 tile in 200 at K = 8 (agreements on 25 of 32 bits).

/// Index bits of a column key: rows of up to 128 experts (columns::pays).
inline constexpr std::int32_t key_index_bits = 7;
inline constexpr std::int32_t key_index_mask = (1 << key_index_bits) - 1;

[[gnu::always_inline]] inline i32x8 max_keys(const i32x8& a, const i32x8& b) noexcept {
  return (i32x8)_mm256_max_epi32((__m256i)a, (__m256i)b);
}
[[gnu::always_inline]] inline i32x8 min_keys(const i32x8& a, const i32x8& b) noexcept {
  return (i32x8)_mm256_min_epi32((__m256i)a, (__m256i)b);
}
/// A comparator: the larger key to i, the smaller to j.
struct order_keys {
  [[gnu::always_inline]] void operator()(i32x8& i, i32x8& j) const noexcept {
    const i32x8 hi = max_keys(i, j);
    j = min_keys(i, j);
    i = hi;
  }
};

/// Column e's keys; `index` holds key_index_mask - e in every lane (the callers step it down
/// a column at a time: a broadcast of each e was a shuffle-port operation a column).
[[gnu::always_inline]] inline i32x8 key_of(const float* __restrict c, std::int32_t e,
                                           const i32x8& index) noexcept {
  const auto ordered = (i32x8)ordered_int32(_mm256_loadu_ps(c + e * 8));
  return (ordered & ~key_index_mask) | index;
}

/// @brief acc = the 8 best of acc and g (each sorted best first), sorted (select_columns.hpp's
///        merge8); returns the best of the 8 it drops.
[[gnu::always_inline]] inline i32x8 merge8_keys(i32x8* acc, const i32x8* g) noexcept {
  i32x8 dropped[8];
  for (std::int32_t i = 0; i < 8; ++i) {
    dropped[i] = min_keys(acc[i], g[7 - i]);
    acc[i] = max_keys(acc[i], g[7 - i]);
  }
  bitonic_clean8(acc, order_keys{});
  for (std::int32_t s = 4; s >= 1; s /= 2)
    for (std::int32_t i = 0; i < s; ++i) dropped[i] = max_keys(dropped[i], dropped[i + s]);
  return dropped[0];
}

/// @brief top_k_inserted's ids and values by keys, when no token of the tile has a near tie
///        (above), and in `after` each token's (K + 1)-th best expert (where not null); false,
///        with id, b and after unspecified, when one has (or E is beyond the keys:
///        more than 128 experts, or not whole groups of 8 for the network). From 5 choices the
///        K + 1 best come from groups of 8 keys sorted by a network and merged into the running
///        8 best (about 5 comparators a key, where insertion takes K + 1); up to 4 by insertion
///        of keys into K + 1 places. Measured at T = 16384, E = 64, one thread on
///        AVX2 (docs/performance.md, session 36): K = 8 1.11 -> 0.39 ns per logit, K = 2 0.48
///        -> 0.21; K = 1 gains nothing (one max and one select a value).
template <std::int32_t K>
[[nodiscard]] inline bool top_k_by_keys(const float* __restrict c, std::int32_t E, i32x8* id,
                                        f32x8* b, i32x8* after = nullptr) noexcept {
  constexpr bool network = K >= 5;
  if (E > key_index_mask + 1 || E < K + 1 || (network && E % 8 != 0)) return false;
  const i32x8 none = i32x8{} + INT32_MIN;  // below every key (-Inf's order is above it)
  i32x8 best[8];
  i32x8 next = none;  // the (K + 1)-th best key
  if constexpr (network) {
    i32x8 index = i32x8{} + key_index_mask;
    for (std::int32_t j = 0; j < 8; ++j, index -= 1) best[j] = key_of(c, j, index);
    sort8_network(best, order_keys{});
    for (std::int32_t e = 8; e < E; e += 8) {
      i32x8 g[8];
      for (std::int32_t j = 0; j < 8; ++j, index -= 1) g[j] = key_of(c, e + j, index);
      sort8_network(g, order_keys{});
      const i32x8 dropped = merge8_keys(best, g);
      if constexpr (K == 8) next = max_keys(next, dropped);
    }
    if constexpr (K < 8) next = best[K];
  } else {
    for (std::int32_t j = 0; j <= K; ++j) best[j] = none;
    i32x8 index = i32x8{} + key_index_mask;
    for (std::int32_t e = 0; e < E; ++e, index -= 1) {
      i32x8 x = key_of(c, e, index);
      for (std::int32_t j = 0; j <= K; ++j) order_keys{}(best[j], x);
    }
    next = best[K];
  }
  const i32x8 high = i32x8{} + ~key_index_mask;
  i32x8 near = (next & high) == (best[K - 1] & high);
  for (std::int32_t j = 0; j + 1 < K; ++j) near |= (best[j] & high) == (best[j + 1] & high);
  if (_mm256_testz_si256((__m256i)near, (__m256i)near) == 0) return false;
  const i32x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
  for (std::int32_t j = 0; j < K; ++j) {
    id[j] = key_index_mask - (best[j] & key_index_mask);
    b[j] = (f32x8)_mm256_i32gather_ps(c, (__m256i)(id[j] * lanes + lane), sizeof(float));
  }
  if (after != nullptr) *after = key_index_mask - (next & key_index_mask);
  return true;
}

/// @brief The K best experts of each token over columns c, best first: ids id[j], values b[j]
///        — top_k_inserted's (its ties, its values), by keys where the tile allows; then
///        true, with each token's (K + 1)-th best in `after` (where not null).
template <std::int32_t K>
inline bool top_k(const float* __restrict c, std::int32_t E, i32x8* id, f32x8* b,
                  i32x8* after = nullptr) noexcept {
#if defined(__AVX512F__)
  // (rows of 8 keep insertion on AVX-512, where a select is one masked move: Mixtral's gating
  // measured 5-7 % slower by keys)
  const bool keys = K >= 2 && E >= 16;
#else
  const bool keys = K >= 2;
#endif
  if (keys && top_k_by_keys<K>(c, E, id, b, after)) return true;
  top_k_inserted<K>(c, E, id, b);
  return false;
}

/// @brief top_k<K> for k = K known at run time (1 .. max_choices): each K its own unrolled
///        selection, chosen by a fold over the K's.
template <std::int32_t... K>
inline bool top_k(const float* __restrict c, std::int32_t E, std::int32_t k, i32x8* id, f32x8* b,
                  i32x8* after, std::integer_sequence<std::int32_t, K...>) noexcept {
  bool keyed = false;
  (void)((k == K + 1 ? (keyed = top_k<K + 1>(c, E, id, b, after), true) : false) || ...);
  return keyed;
}
inline bool top_k(const float* __restrict c, std::int32_t E, std::int32_t k, i32x8* id, f32x8* b,
                  i32x8* after = nullptr) noexcept {
  return top_k(c, E, k, id, b, after, std::make_integer_sequence<std::int32_t, max_choices>{});
}

/// The values of the chosen experts of each token: c[id[l] * 8 + l].
[[gnu::always_inline]] inline f32x8 at_ids(const float* __restrict c, const i32x8& id) noexcept {
  f32x8 v;
  for (std::int32_t l = 0; l < lanes; ++l) v[l] = c[id[l] * lanes + l];
  return v;
}

/// What write_gates (gating.hpp) does with a token's chosen experts' logits and scores.
struct gate_rule {
  bool softmax_after;  // a softmax over the k chosen logits (libm's exp), else the scores
  std::int32_t k;      // 1 .. max_choices
  renormalize renorm;
  float epsilon;  // renorm_epsilon
  float scaling;  // scaling_factor
};

/// @brief g[j] = the gate of each token's choice j: write_gates's operations lane by lane
///        (the exps of the other choices' logits by libm's expf, one lane at a time: its
///        bits). logit[j] / score[j]: the choice's logit and score (P).
inline void gates(const gate_rule& r, const f32x8* logit, const f32x8* score, f32x8* g) noexcept {
  if (r.softmax_after) {
    // the best is the max (std::max keeps the first of equals): its dx 0, its exp 1; the sum
    // (0.0 + 1) + e_1 + ... in double, choice by choice, then each e_j / sum
    f32x8 ej[max_choices];
    ej[0] = f32x8{} + 1.0f;
    for (std::int32_t j = 1; j < r.k; ++j) {
      const f32x8 dx = logit[j] - logit[0];
      for (std::int32_t l = 0; l < lanes; ++l) ej[j][l] = dx[l] == 0.0f ? 1.0f : std::exp(dx[l]);
    }
    for (std::int32_t h = 0; h < 2; ++h) {
      f64x4 e[max_choices], gs = {};
      for (std::int32_t j = 0; j < r.k; ++j) {
        f32x4 q;
        std::memcpy(&q, reinterpret_cast<const float*>(&ej[j]) + 4 * h, sizeof q);
        e[j] = __builtin_convertvector(q, f64x4);
        gs += e[j];
      }
      for (std::int32_t j = 0; j < r.k; ++j) {
        const f32x4 q = __builtin_convertvector(e[j] / gs, f32x4);
        std::memcpy(reinterpret_cast<float*>(&g[j]) + 4 * h, &q, sizeof q);
      }
    }
  } else {
    for (std::int32_t j = 0; j < r.k; ++j) g[j] = score[j];
    if (r.renorm == renormalize::before_drop) {
      f32x8 total = g[0];  // (0.0f + g0 is g0: a score is never -0)
      for (std::int32_t j = 1; j < r.k; ++j) total += g[j];
      const f32x8 denom = total + r.epsilon;
      for (std::int32_t j = 0; j < r.k; ++j) g[j] = denom > 0.0f ? g[j] / denom : f32x8{};
    }
  }
  if (r.renorm != renormalize::after_drop)
    for (std::int32_t j = 0; j < r.k; ++j) g[j] *= r.scaling;
}

/// @brief out[t * k + j] = v[j][t] for the tile's tokens t (each token's k choices side by
///        side): k = 1 one store, k = 2 two interleaved stores, else lane by lane.
template <class V>
[[gnu::always_inline]] inline void store_choices(void* out, const V* v, std::int32_t k) noexcept {
  auto* o = static_cast<float*>(out);
  if (k == 1) {
    std::memcpy(o, &v[0], sizeof v[0]);
  } else if (k == 2) {
    const __m256 lo = _mm256_unpacklo_ps((__m256)v[0], (__m256)v[1]);  // tokens 0 1 4 5
    const __m256 hi = _mm256_unpackhi_ps((__m256)v[0], (__m256)v[1]);  // tokens 2 3 6 7
    _mm256_storeu_ps(o, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  } else {
    for (std::int32_t l = 0; l < lanes; ++l)
      for (std::int32_t j = 0; j < k; ++j) {
        const auto x = v[j][l];  // (clang rejects the address of a vector element)
        std::memcpy(o + l * k + j, &x, sizeof x);
      }
  }
}

/// @brief For each token, how many columns hold a value at or above its `least`.
inline i32x8 count_at_least(const float* __restrict c, std::int32_t E,
                            const f32x8& least) noexcept {
  i32x8 n = {};
  for (std::int32_t e = 0; e < E; ++e) n -= load8(c + e * 8) >= least;  // (true is -1)
  return n;
}

/// @brief acc[e] += double(c[e][t]) for the tokens t in order (the row path's per-token sums,
///        the same adds in the same order), 8 experts at a time transposed back to rows (16 by
///        transpose16 on AVX-512: Megatron's gating 3 % faster); lanes of `keep` 0 add nothing.
inline void accumulate(const float* __restrict c, std::int32_t E, const i32x8& keep,
                       double* __restrict acc) noexcept {
  std::int32_t first = 0;  // the first block of 8 the loop below takes
#if defined(__AVX512F__)
  // whole blocks of 16 experts transposed back by permutes (transpose16): token t's 16 values
  // in register t, added lane by lane in token order
  const auto keep16 =
      (__m512i)__builtin_shufflevector(keep, keep, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
  for (; first + 16 <= E; first += 16) {
    __m512 r[8];
    for (std::int32_t j = 0; j < 8; ++j)
      r[j] = (__m512)_mm512_and_si512(_mm512_loadu_si512(c + (first + 2 * j) * 8), keep16);
    transpose16::columns_to_rows(r);
    f64x8 lo, hi;
    std::memcpy(&lo, acc + first, sizeof lo);
    std::memcpy(&hi, acc + first + 8, sizeof hi);
    for (std::int32_t t = 0; t < 8; ++t) {  // (masked converts: GCC 12 splits the generic ones)
      const auto v = (math::f32x16)r[t];
      const auto lower = (__m256)__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
      const auto upper = (__m256)__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
      lo += (f64x8)_mm512_maskz_cvtps_pd(0xff, lower);
      hi += (f64x8)_mm512_maskz_cvtps_pd(0xff, upper);
    }
    std::memcpy(acc + first, &lo, sizeof lo);
    std::memcpy(acc + first + 8, &hi, sizeof hi);
  }
#endif
  for (std::int32_t b = first; b < E; b += 8) {
    __m256 r[8];
    for (std::int32_t l = 0; l < 8; ++l)
      r[l] = _mm256_and_ps(_mm256_loadu_ps(c + (b + l) * 8), (__m256)keep);
    transpose8(r);
#if defined(__AVX512F__)
    // the 8 experts' doubles in one register (the same adds lane by lane)
    f64x8 a;
    std::memcpy(&a, acc + b, sizeof a);
    for (std::int32_t t = 0; t < 8; ++t) a += (f64x8)_mm512_maskz_cvtps_pd(0xff, r[t]);
    std::memcpy(acc + b, &a, sizeof a);
#else
    f64x4 lo, hi;
    std::memcpy(&lo, acc + b, sizeof lo);
    std::memcpy(&hi, acc + b + 4, sizeof hi);
    for (std::int32_t t = 0; t < 8; ++t) {
      lo += (f64x4)_mm256_cvtps_pd(_mm256_castps256_ps128(r[t]));
      hi += (f64x4)_mm256_cvtps_pd(_mm256_extractf128_ps(r[t], 1));
    }
    std::memcpy(acc + b, &lo, sizeof lo);
    std::memcpy(acc + b + 4, &hi, sizeof hi);
#endif
  }
}

}  // namespace moeroute::cpu::detail::columns

#endif
