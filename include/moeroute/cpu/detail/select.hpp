// SPDX-License-Identifier: Apache-2.0
// Selection for the CPU backend: the n best of a row (larger value first, ties to the lower
// index, as the reference and the kernels rank) and the group-limit mask.
//
// Each entry becomes one 64-bit key: the float's order in the high half and the complement of
// its index in the low half. Keys are distinct and a larger key is exactly a better entry, so
// selection is integer max / min in native vectors with no tie logic and no data-dependent
// branch: n passes of "the largest key below the last one", or a partial sort of keys for large
// n. n = 2 without a mask needs no keys: per-lane max / min of the floats, then the ids from
// equality masks (top2_of_values).
//
// Where a vector compare yields a bit mask (AVX2, AVX-512), n of 3 to 16 first take a
// threshold: the n-th largest of 16 lane maxima bounds the n-th best from below, so only the
// entries at or above it (about 10 of 64 .. 256 for n = 8) are packed (AVX-512's compress,
// AVX2's permute by a table) and ranked by counting, in registers (equal values by index),
// four rows side by side in the gating. Rows with more than 16 such entries fall
// back to the keys: every path returns the same ids (tests/cpu/math_test.cpp, built for
// the default ISA, AVX2 and the machine's).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

#include <moeroute/config.hpp>
#include <moeroute/cpu/detail/math.hpp>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace moeroute::cpu::detail {

/// n up to this is selected by passes over the keys; beyond it by a partial sort of them.
inline constexpr std::int32_t select_small_max = 16;

/// Key lanes: a native register of int64 (AVX-512: 8, AVX: 4, SSE2: 2).
inline constexpr std::int32_t key_lanes = math::native_lanes / 2;
using key_vec = std::int64_t __attribute__((vector_size(8 * key_lanes)));

/// Below every key of a real entry: padding, and the entries a group limit excludes.
inline constexpr std::int64_t no_key = std::numeric_limits<std::int64_t>::min();

/// Keys a selection over `size` values needs (size rounded up to 8, the widest key vector).
[[nodiscard]] constexpr std::int32_t key_capacity(std::int32_t size) noexcept {
  return (size + 7) / 8 * 8;
}

/// @brief The key of value x (not NaN) at index i: -0 folded onto +0 (they compare equal),
///        the sign-magnitude float bits made two's-complement ordered, then 2^32 - 1 - i below.
[[nodiscard]] inline std::int64_t key_of(float x, std::int32_t i) noexcept {
  const auto b = std::bit_cast<std::int32_t>(x + 0.0f);
  const std::int32_t ordered = b ^ ((b >> 31) & 0x7fffffff);
  return static_cast<std::int64_t>(ordered) * 4294967296LL +
         static_cast<std::int64_t>(0xffffffffu - static_cast<std::uint32_t>(i));
}

/// The index a key was made from.
[[nodiscard]] inline std::int32_t index_of(std::int64_t key) noexcept {
  return static_cast<std::int32_t>(0xffffffffu - static_cast<std::uint32_t>(key));
}

// Vectors pass by reference only: by value, their calling convention would depend on the ISA
// (-Wpsabi), and these helpers are always inlined anyway.

/// Lane-wise max / min of key vectors. Written as a vector ?: so that GCC and Clang emit
/// vpmaxsq / vpminsq on AVX-512 (an and/or blend stays a compare and a blend).
inline void vmax(key_vec& r, const key_vec& a, const key_vec& b) noexcept { r = a > b ? a : b; }
inline void vmin(key_vec& r, const key_vec& a, const key_vec& b) noexcept { r = a < b ? a : b; }

/// The largest lane, by halving (8 -> 4 -> 2 -> 1 lanes) in registers.
using key_x2 = std::int64_t __attribute__((vector_size(16)));
using key_x4 = std::int64_t __attribute__((vector_size(32)));
using key_x8 = std::int64_t __attribute__((vector_size(64)));
[[nodiscard]] inline std::int64_t lane_max(const key_x2& v) noexcept {
  return v[0] > v[1] ? v[0] : v[1];
}
[[nodiscard]] inline std::int64_t lane_max(const key_x4& v) noexcept {
  const key_x2 a = __builtin_shufflevector(v, v, 0, 1), b = __builtin_shufflevector(v, v, 2, 3);
  return lane_max(a > b ? a : b);
}
[[nodiscard]] inline std::int64_t lane_max(const key_x8& v) noexcept {
  const key_x4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3);
  const key_x4 b = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return lane_max(a > b ? a : b);
}

/// @brief keys[i] = key_of(v[i], i) for allowed entries (allowed null: all), no_key for the
///        others and for the padding up to key_capacity(size).
inline void make_keys(const float* __restrict v, std::int32_t size,
                      const std::uint8_t* __restrict allowed, std::int64_t* __restrict keys) {
  if (allowed == nullptr) {
    for (std::int32_t i = 0; i < size; ++i) keys[i] = key_of(v[i], i);
  } else {
    for (std::int32_t i = 0; i < size; ++i) keys[i] = allowed[i] != 0 ? key_of(v[i], i) : no_key;
  }
  for (std::int32_t i = size; i < key_capacity(size); ++i) keys[i] = no_key;
}

/// @brief The largest key below `bound` among keys[0, padded) (padded a multiple of 8).
[[nodiscard]] inline std::int64_t max_key_below(const std::int64_t* keys, std::int32_t padded,
                                                std::int64_t bound) noexcept {
  const key_vec none = key_vec{} + no_key, b = key_vec{} + bound;
  key_vec acc0 = none, acc1 = none;  // two chains, so the max latency overlaps
  std::int32_t i = 0;
  for (; i + 2 * key_lanes <= padded; i += 2 * key_lanes) {
    key_vec x, y;
    std::memcpy(&x, keys + i, sizeof x);
    std::memcpy(&y, keys + i + key_lanes, sizeof y);
    vmax(acc0, acc0, x < b ? x : none);
    vmax(acc1, acc1, y < b ? y : none);
  }
  for (; i < padded; i += key_lanes) {
    key_vec x;
    std::memcpy(&x, keys + i, sizeof x);
    vmax(acc0, acc0, x < b ? x : none);
  }
  vmax(acc0, acc0, acc1);
  return lane_max(acc0);
}

/// Each lane's largest and second largest key so far: the step of a one-pass top-2.
struct lane_top2 {
  key_vec v1 = key_vec{} + no_key, v2 = key_vec{} + no_key;

  void offer(const key_vec& x) noexcept {
    key_vec lo;
    vmin(lo, v1, x);
    vmax(v1, v1, x);
    vmax(v2, v2, lo);
  }
  /// The two largest over the lanes: the lanes' largest wins; the second is the largest of
  /// the other lanes' largest and the winner's second (no_key where fewer than two were
  /// offered).
  void result(std::int64_t* out) const noexcept {
    out[0] = lane_max(v1);
    key_vec rest;
    vmax(rest, v2, v1 == (key_vec{} + out[0]) ? key_vec{} + no_key : v1);
    out[1] = lane_max(rest);
  }
};

/// @brief The two largest keys below `bound` among keys[0, padded) in one pass.
inline void top2_below(const std::int64_t* keys, std::int32_t padded, std::int64_t bound,
                       std::int64_t* out) noexcept {
  const key_vec none = key_vec{} + no_key, b = key_vec{} + bound;
  lane_top2 top;
  for (std::int32_t i = 0; i < padded; i += key_lanes) {
    key_vec x;
    std::memcpy(&x, keys + i, sizeof x);
    top.offer(x < b ? x : none);
  }
  top.result(out);
}

/// Bit l set where lane l of x equals a (a compare-to-mask where the ISA has one).
[[nodiscard]] inline std::uint32_t lanes_equal(const math::f32n& x, float a) noexcept {
#if defined(__AVX512F__)
  return _mm512_cmpeq_ps_mask(x, _mm512_set1_ps(a));
#elif defined(__AVX2__)
  return static_cast<std::uint32_t>(
      _mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(a), _CMP_EQ_OQ)));
#else
  std::uint32_t bits = 0;
  for (std::int32_t l = 0; l < math::native_lanes; ++l) bits |= (x[l] == a ? 1u : 0u) << l;
  return bits;
#endif
}

/// Lane-wise min and max of values with no NaN: one instruction each (GCC makes the
/// ?: form a compare and a blend; the maskz forms: the plain ones trip GCC 12's
/// -Wmaybe-uninitialized).
[[nodiscard]] inline math::f32n lanes_min(const math::f32n& a, const math::f32n& b) noexcept {
#if defined(__AVX512F__)
  return _mm512_maskz_min_ps(0xffff, a, b);
#elif defined(__AVX2__)
  return _mm256_min_ps(a, b);
#else
  return a < b ? a : b;
#endif
}
[[nodiscard]] inline math::f32n lanes_max(const math::f32n& a, const math::f32n& b) noexcept {
#if defined(__AVX512F__)
  return _mm512_maskz_max_ps(0xffff, a, b);
#elif defined(__AVX2__)
  return _mm256_max_ps(a, b);
#else
  return a < b ? b : a;
#endif
}

/// @brief The two best of v[0, size) (size >= 2, no mask, no NaN): k = 2 routing reads each
///        row once for the values and once for the ids. The values first, as floats: each
///        lane's largest and second largest (a max, a min and a max per register, where keys
///        took compares and blends, and two registers per float register below AVX-512); then
///        the lowest index holding the best and the lowest other index holding the second,
///        from equality masks of 64 entries at a time (no branch on where they lie: rows of
///        up to 64 are one block). Float order with -0 equal to +0 is the keys' order, so the
///        ids are the keys' (math_test.cpp checks both against a stable sort).
inline void top2_of_values(const float* v, std::int32_t size, std::int32_t* ids) noexcept {
  using math::f32n;
  constexpr std::int32_t W = math::native_lanes;
  f32n m1 = f32n{} - std::numeric_limits<float>::infinity(), m2 = m1;  // lane l: the two
  std::int32_t i = 0;                                                  // largest of i % W == l
  for (; i + W <= size; i += W) {
    f32n x;
    std::memcpy(&x, v + i, sizeof x);
    const f32n lo = lanes_min(m1, x);
    m1 = lanes_max(m1, x);
    m2 = lanes_max(m2, lo);
  }
  float best = math::max_of_lanes(m1);
  for (std::int32_t j = i; j < size; ++j) best = std::max(best, v[j]);
  // the second: the best again when two lanes hold it, else the largest of the other lanes'
  // largest, the best lane's second and the tail's entries but one holding the best
  const std::int32_t best_lanes = std::popcount(lanes_equal(m1, best));
  float second = math::max_of_lanes(m1 == best ? m2 : m1);
  bool best_seen = best_lanes > 0;
  for (std::int32_t j = i; j < size; ++j) {
    if (v[j] == best && !best_seen) {
      best_seen = true;
      continue;
    }
    second = std::max(second, v[j]);
  }
  if (best_lanes > 1) second = best;
  // the ids (both are found by the last block): with the second equal to the best, the first
  // two entries holding it
  const bool tied = second == best;
  std::int32_t first = -1, next = -1;
  for (std::int32_t base = 0; first < 0 || next < 0; base += 64) {
    std::uint64_t eq_best = 0, eq_second = 0;
    const std::int32_t end = std::min(size, base + 64);
    std::int32_t j = base;
    for (; j + W <= end; j += W) {
      f32n x;
      std::memcpy(&x, v + j, sizeof x);
      eq_best |= std::uint64_t{lanes_equal(x, best)} << (j - base);
      eq_second |= std::uint64_t{lanes_equal(x, second)} << (j - base);
    }
    for (; j < end; ++j) {
      eq_best |= std::uint64_t{v[j] == best} << (j - base);
      eq_second |= std::uint64_t{v[j] == second} << (j - base);
    }
    if (first < 0 && eq_best != 0) {
      first = base + std::countr_zero(eq_best);
      if (tied) eq_second &= eq_second - 1;  // the entries after it
    }
    if (next < 0 && eq_second != 0) next = base + std::countr_zero(eq_second);
  }
  ids[0] = first;
  ids[1] = next;
}

#if defined(__AVX512F__) || defined(__AVX2__)
// Selection by a threshold, where a vector compare yields a bit mask (AVX2, AVX-512).

/// @brief A lower bound on the n-th best of v among allowed entries (n <= 16): the n-th
///        largest of 16 lane maxima, lane l holding the entries i with i % 16 == l (excluded
///        entries count as -inf). The n lanes whose maxima are at or above it hold n distinct
///        entries at or above it; usually few others are (about 10 of 64 .. 256 for n = 8).
///        A lane without an allowed entry may make it -inf: then every allowed entry passes.
[[nodiscard]] inline float threshold_of(const float* v, std::int32_t size,
                                        const std::uint8_t* allowed, std::int32_t n) noexcept {
  constexpr float inf = std::numeric_limits<float>::infinity();
  alignas(64) float m[16];
#if defined(__AVX512F__)
  __m512 lane = _mm512_set1_ps(-inf);
  std::int32_t i = 0;
  for (; i + 16 <= size; i += 16) {
    const __m512 x = _mm512_loadu_ps(v + i);
    __mmask16 keep = 0xffff;
    if (allowed != nullptr)
      keep = _mm512_test_epi32_mask(
          _mm512_maskz_cvtepu8_epi32(
              0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(allowed + i))),
          _mm512_set1_epi32(0xff));
    lane = _mm512_mask_max_ps(lane, keep, lane, x);
  }
  _mm512_store_ps(m, lane);
#else
  for (std::int32_t l = 0; l < 16; ++l) m[l] = -inf;
  std::int32_t i = 0;
  if (allowed == nullptr) {  // (two registers: the masked loop below is scalar)
    __m256 lo = _mm256_set1_ps(-inf), hi = lo;
    for (; i + 16 <= size; i += 16) {
      lo = _mm256_max_ps(lo, _mm256_loadu_ps(v + i));
      hi = _mm256_max_ps(hi, _mm256_loadu_ps(v + i + 8));
    }
    _mm256_store_ps(m, lo);
    _mm256_store_ps(m + 8, hi);
  }
  for (; i + 16 <= size; i += 16)
    for (std::int32_t l = 0; l < 16; ++l)
      if (allowed == nullptr || allowed[i + l] != 0) m[l] = std::max(m[l], v[i + l]);
#endif
  for (std::int32_t l = 0; i + l < size; ++l)
    if (allowed == nullptr || allowed[i + l] != 0) m[l] = std::max(m[l], v[i + l]);
#if defined(__AVX512F__)
  // each lane's count of larger maxima, one broadcast per lane; the n-th largest is the
  // least maximum with fewer than n above it
  using i32x16 = std::int32_t __attribute__((vector_size(64)));
  math::f32x16 lane16;
  std::memcpy(&lane16, m, sizeof lane16);
  // (intrinsics: the generic form below costs five instructions a lane, this two and a
  // broadcast load; two counts so that the adds do not form one chain)
  const __m512 mv = _mm512_load_ps(m);
  const __m512i one = _mm512_set1_epi32(1);
  __m512i above0 = _mm512_setzero_si512(), above1 = _mm512_setzero_si512();
  for (std::int32_t l = 0; l < 16; l += 2) {
    above0 = _mm512_mask_add_epi32(above0, _mm512_cmp_ps_mask(mv, _mm512_set1_ps(m[l]), _CMP_LT_OQ),
                                   above0, one);
    above1 = _mm512_mask_add_epi32(
        above1, _mm512_cmp_ps_mask(mv, _mm512_set1_ps(m[l + 1]), _CMP_LT_OQ), above1, one);
  }
  const auto above = (i32x16)_mm512_add_epi32(above0, above1);
  return math::min_of_lanes(above < n ? lane16 : math::f32x16{} + inf);
#else
  // the same count on AVX2: a broadcast, two compares and two subtracts a lane, in two chains
  const __m256 lo = _mm256_load_ps(m), hi = _mm256_load_ps(m + 8);
  __m256i above_lo = _mm256_setzero_si256(), above_hi = above_lo;
  for (std::int32_t l = 0; l < 16; ++l) {
    const __m256 b = _mm256_broadcast_ss(m + l);
    above_lo = _mm256_sub_epi32(above_lo, _mm256_castps_si256(_mm256_cmp_ps(lo, b, _CMP_LT_OQ)));
    above_hi = _mm256_sub_epi32(above_hi, _mm256_castps_si256(_mm256_cmp_ps(hi, b, _CMP_LT_OQ)));
  }
  // (in the halves' registers: a 16-lane generic vector has none on AVX2)
  const __m256i nv = _mm256_set1_epi32(n);
  const __m256 none = _mm256_set1_ps(inf);
  const __m256 ml =
      _mm256_blendv_ps(none, lo, _mm256_castsi256_ps(_mm256_cmpgt_epi32(nv, above_lo)));
  const __m256 mh =
      _mm256_blendv_ps(none, hi, _mm256_castsi256_ps(_mm256_cmpgt_epi32(nv, above_hi)));
  return math::min_of_lanes((math::f32x8)_mm256_min_ps(ml, mh));
#endif
}

#if defined(__AVX2__)
/// The lanes of v as ordered int32, as the AVX-512 ordered_int32 below (-0 folded onto +0,
/// sign-magnitude made two's complement): the AVX2 threshold selection's and the token
/// columns' keys (token_columns.hpp).
[[gnu::always_inline]] inline __m256i ordered_int32(__m256 v) noexcept {
  const __m256i b = _mm256_castps_si256(_mm256_add_ps(v, _mm256_setzero_ps()));  // -0 onto +0
  return _mm256_xor_si256(
      b, _mm256_and_si256(_mm256_srai_epi32(b, 31), _mm256_set1_epi32(0x7fffffff)));
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MOEROUTE_CPU_SELECT_AVX512 1
#define MOEROUTE_CPU_SELECT_ROWS 1  // top_n_rows_by_threshold (AVX-512 or AVX2)
/// The lanes of v as ordered int32: a larger value is a larger int (-0 folded onto +0,
/// sign-magnitude made two's complement), so ranks are counted by integer compares.
[[gnu::always_inline]] inline __m512i ordered_int32(__m512 v) noexcept {
  const __m512i b = _mm512_castps_si512(_mm512_add_ps(v, _mm512_setzero_ps()));  // -0 onto +0
  return _mm512_xor_si512(
      b, _mm512_and_si512(_mm512_maskz_srai_epi32(0xffff, b, 31), _mm512_set1_epi32(0x7fffffff)));
}

/// @brief The n best of each of R rows' candidates, best first: row r's c[r] candidate values
///        cand[r][0, c[r]) and their indices where[r][0, c[r]), in index order. Each candidate's
///        rank is how many are better: as ordered int32 (-0 folded onto +0, sign-magnitude made
///        two's complement), lane i is beaten by lane j when h_i < h_j, or h_i == h_j and j < i
///        (a lower index): h_i < h_j + (i > j), one compare. The lanes from c[r] on rank below
///        every real value (the ordered bits of -inf are above INT32_MIN), so the ranks are
///        0 .. 15, one each. Rows with more than 16 candidates are left unwritten. Each row's
///        two sums (even and odd j) keep the adds from forming one chain; the rows go side by
///        side.
template <std::int32_t R>
[[gnu::always_inline]] inline void order_candidates(const float (*cand)[32],
                                                    const std::int32_t (*where)[32],
                                                    const std::int32_t* c, std::int32_t n,
                                                    std::int32_t* const* ids) noexcept {
  const __m512i one = _mm512_set1_epi32(1);
  __m512i h[R], rank0[R], rank1[R];
  alignas(64) std::int32_t hs[R][16];
  for (std::int32_t r = 0; r < R; ++r) {
    const auto real = static_cast<__mmask16>((1u << std::min(c[r], 16)) - 1u);
    h[r] = _mm512_mask_mov_epi32(_mm512_set1_epi32(std::numeric_limits<std::int32_t>::min()), real,
                                 ordered_int32(_mm512_load_ps(cand[r])));
    _mm512_store_si512(hs[r], h[r]);
    rank0[r] = rank1[r] = _mm512_setzero_si512();
  }
  for (std::int32_t j = 0; j < 16; j += 2) {
    const auto after0 = static_cast<__mmask16>(0xfffeu << j);  // lanes above j
    const auto after1 = static_cast<__mmask16>(0xfffcu << j);  // lanes above j + 1
    for (std::int32_t r = 0; r < R; ++r) {
      const __m512i b0 = _mm512_set1_epi32(hs[r][j]), b1 = _mm512_set1_epi32(hs[r][j + 1]);
      rank0[r] = _mm512_mask_add_epi32(
          rank0[r], _mm512_cmplt_epi32_mask(h[r], _mm512_mask_add_epi32(b0, after0, b0, one)),
          rank0[r], one);
      rank1[r] = _mm512_mask_add_epi32(
          rank1[r], _mm512_cmplt_epi32_mask(h[r], _mm512_mask_add_epi32(b1, after1, b1, one)),
          rank1[r], one);
    }
  }
  // the j-th best: the index in the lane ranked j (one lane per rank)
  for (std::int32_t r = 0; r < R; ++r) {
    if (c[r] > 16) continue;
    const __m512i rank = _mm512_add_epi32(rank0[r], rank1[r]);
    const __m512i idx = _mm512_load_si512(where[r]);
    for (std::int32_t j = 0; j < n; ++j)
      ids[r][j] = _mm512_cvtsi512_si32(
          _mm512_maskz_compress_epi32(_mm512_cmpeq_epi32_mask(rank, _mm512_set1_epi32(j)), idx));
  }
}

/// @brief The n best (3 <= n <= 16) of each of R rows v[r][0, size) among its allowed entries
///        (allowed[r], null: all), best first, by a threshold: the entries at or above
///        threshold_of() (usually under 2n) are compressed with their indices, in index order,
///        and ranked by counting the better ones (order_candidates). ok[r] is false, with
///        ids[r] unwritten, where more than 16 entries of row r pass (the caller then selects
///        that row by 64-bit keys). Each phase goes through every row before the next: one
///        row's selection is a chain of dependent steps (lane maxima, their ranks, the
///        threshold, the compares, the running count, the store and reload of the candidates,
///        their ranks), and those of R rows overlap in the core only side by side in the
///        instruction stream (measured: top-8 of 128 from 79 to about 58 ns a row with 4 rows).
template <std::int32_t R>
inline void top_n_rows_by_threshold(const float* const* v, const std::uint8_t* const* allowed,
                                    std::int32_t size, std::int32_t n, std::int32_t* const* ids,
                                    bool* ok) noexcept {
  __m512 t[R];
  for (std::int32_t r = 0; r < R; ++r)
    t[r] = _mm512_set1_ps(threshold_of(v[r], size, allowed[r], n));
  // each chunk's passing entries compressed and stored whole at the row's running count (the
  // next chunk's store overwrites the tail): two shuffles and two stores a chunk, no chain
  // between chunks but the count. Stores start at most at 16, so they stay in the buffers;
  // more than 16 passing is the fallback anyway.
  alignas(64) float cand[R][32];
  alignas(64) std::int32_t where[R][32];
  std::int32_t c[R] = {};
  const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (std::int32_t i = 0; i < size; i += 16) {
    const auto live = static_cast<__mmask16>(size - i >= 16 ? 0xffffu : (1u << (size - i)) - 1u);
    const __m512i at_i = _mm512_add_epi32(lanes, _mm512_set1_epi32(i));
    for (std::int32_t r = 0; r < R; ++r) {
      const __m512 x = _mm512_maskz_loadu_ps(live, v[r] + i);
      __mmask16 k = _mm512_mask_cmp_ps_mask(live, x, t[r], _CMP_GE_OQ);
      if (allowed[r] != nullptr)
        k = _mm512_mask_test_epi32_mask(
            k, _mm512_maskz_cvtepu8_epi32(0xffff, _mm_maskz_loadu_epi8(live, allowed[r] + i)),
            _mm512_set1_epi32(0xff));
      const std::int32_t at = std::min(c[r], 16);
      _mm512_storeu_ps(cand[r] + at, _mm512_maskz_compress_ps(k, x));
      _mm512_storeu_si512(where[r] + at, _mm512_maskz_compress_epi32(k, at_i));
      c[r] += std::popcount(static_cast<std::uint32_t>(k));
    }
  }
  for (std::int32_t r = 0; r < R; ++r) ok[r] = c[r] <= 16;
  order_candidates<R>(cand, where, c, n, ids);
}

#elif defined(__AVX2__)
#define MOEROUTE_CPU_SELECT_ROWS 1
/// For each 8-bit mask, the positions of its set bits in order, a nibble each (AVX2 has no
/// compress: a vpermps by these moves the set lanes to the front).
inline constexpr auto left_pack_nibbles = [] {
  struct table {
    std::uint32_t v[256];
  } t{};
  for (std::uint32_t m = 0; m < 256; ++m) {
    std::uint32_t packed = 0, at = 0;
    for (std::uint32_t l = 0; l < 8; ++l)
      if (m >> l & 1u) packed |= l << (4 * at++);
    t.v[m] = packed;
  }
  return t;
}();

/// The vpermps indices that move the set lanes of `mask` to the front, in lane order.
[[gnu::always_inline]] inline __m256i left_pack_indices(std::uint32_t mask) noexcept {
  const __m256i packed = _mm256_set1_epi32(static_cast<std::int32_t>(left_pack_nibbles.v[mask]));
  return _mm256_and_si256(_mm256_srlv_epi32(packed, _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                          _mm256_set1_epi32(15));
}

/// @brief The AVX-512 top_n_rows_by_threshold on AVX2: the same threshold, the passing entries
///        packed 8 lanes at a time (a movemask, a table of vpermps indices, two stores at the
///        running count), ranked by the same count of better candidates in two 8-lane halves
///        (h_i < h_j + (i > j), one compare), the rows side by side. Same ids, same fallback:
///        ok[r] false, ids[r] unwritten, where more than 16 entries of row r pass.
template <std::int32_t R>
inline void top_n_rows_by_threshold(const float* const* v, const std::uint8_t* const* allowed,
                                    std::int32_t size, std::int32_t n, std::int32_t* const* ids,
                                    bool* ok) noexcept {
  __m256 t[R];
  for (std::int32_t r = 0; r < R; ++r)
    t[r] = _mm256_set1_ps(threshold_of(v[r], size, allowed[r], n));
  alignas(32) float cand[R][32];
  alignas(32) std::int32_t where[R][32];
  std::int32_t c[R] = {};
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (std::int32_t i = 0; i < size; i += 8) {
    const std::int32_t live = std::min<std::int32_t>(size - i, 8);
    const auto live_bits = static_cast<std::uint32_t>((1u << live) - 1u);
    const __m256i at_i = _mm256_add_epi32(lanes, _mm256_set1_epi32(i));
    for (std::int32_t r = 0; r < R; ++r) {
      __m256 x;
      if (live == 8) {
        x = _mm256_loadu_ps(v[r] + i);
      } else {  // the row's tail: the lanes past it are never packed
        alignas(32) float tail[8] = {};
        std::memcpy(tail, v[r] + i, sizeof(float) * static_cast<std::size_t>(live));
        x = _mm256_load_ps(tail);
      }
      auto k = static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(x, t[r], _CMP_GE_OQ))) &
               live_bits;
      if (allowed[r] != nullptr) {
        std::uint64_t bytes = 0;
        std::memcpy(&bytes, allowed[r] + i, static_cast<std::size_t>(live));
        const __m256i a = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<std::int64_t>(bytes)));
        k &= ~static_cast<std::uint32_t>(
            _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a, _mm256_setzero_si256()))));
      }
      const std::int32_t at = std::min(c[r], 16);
      const __m256i to_front = left_pack_indices(k);
      _mm256_storeu_ps(cand[r] + at, _mm256_permutevar8x32_ps(x, to_front));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(where[r] + at),
                          _mm256_permutevar8x32_epi32(at_i, to_front));
      c[r] += std::popcount(k);
    }
  }
  // ranks: lane i of half q (candidate 8q + i) is beaten by candidate j when h_i < h_j + (8q + i
  // > j); the lanes from c on are INT32_MIN, below every real value, and rank c .. 15
  __m256i h[R][2], rank[R][2];
  alignas(32) std::int32_t hs[R][16];
  for (std::int32_t r = 0; r < R; ++r) {
    for (std::int32_t q = 0; q < 2; ++q) {
      const __m256i real = _mm256_cmpgt_epi32(_mm256_set1_epi32(c[r]),
                                              _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * q)));
      h[r][q] = _mm256_blendv_epi8(_mm256_set1_epi32(std::numeric_limits<std::int32_t>::min()),
                                   ordered_int32(_mm256_load_ps(cand[r] + 8 * q)), real);
      _mm256_store_si256(reinterpret_cast<__m256i*>(hs[r] + 8 * q), h[r][q]);
      rank[r][q] = _mm256_setzero_si256();
    }
  }
  for (std::int32_t j = 0; j < 16; ++j) {
    // (8q + i > j) as -1 lanes: subtracting it adds 1
    const __m256i after0 = _mm256_cmpgt_epi32(lanes, _mm256_set1_epi32(j));
    const __m256i after1 =
        _mm256_cmpgt_epi32(_mm256_add_epi32(lanes, _mm256_set1_epi32(8)), _mm256_set1_epi32(j));
    for (std::int32_t r = 0; r < R; ++r) {
      const __m256i b = _mm256_set1_epi32(hs[r][j]);
      rank[r][0] =
          _mm256_sub_epi32(rank[r][0], _mm256_cmpgt_epi32(_mm256_sub_epi32(b, after0), h[r][0]));
      rank[r][1] =
          _mm256_sub_epi32(rank[r][1], _mm256_cmpgt_epi32(_mm256_sub_epi32(b, after1), h[r][1]));
    }
  }
  // the j-th best: the index in the lane ranked j
  for (std::int32_t r = 0; r < R; ++r) {
    ok[r] = c[r] <= 16;
    if (!ok[r]) continue;
    alignas(32) std::int32_t ranks[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(ranks), rank[r][0]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(ranks + 8), rank[r][1]);
    std::int32_t slot[16];  // the real lanes rank 0 .. c - 1, one each; the padding is never read
    for (std::int32_t l = 0; l < c[r]; ++l) slot[ranks[l]] = where[r][l];
    for (std::int32_t j = 0; j < n; ++j) ids[r][j] = slot[j];
  }
}

#endif  // AVX-512 BW + VL, or AVX2

#if defined(MOEROUTE_CPU_SELECT_ROWS)
/// @brief top_n_rows_by_threshold for one row; false (nothing written) where more than 16
///        entries pass.
[[nodiscard]] inline bool top_n_by_threshold(const float* v, std::int32_t size,
                                             const std::uint8_t* allowed, std::int32_t n,
                                             std::int32_t* ids) noexcept {
  bool ok = false;
  top_n_rows_by_threshold<1>(&v, &allowed, size, n, &ids, &ok);
  return ok;
}
#endif
#endif  // AVX-512 or AVX2

/// @brief The n best of keys[0, size) (distinct, keys[size, key_capacity(size)) writable),
///        best first, as indices.
inline void select_keys(std::int64_t* keys, std::int32_t size, std::int32_t n, std::int32_t* ids) {
  for (std::int32_t i = size; i < key_capacity(size); ++i) keys[i] = no_key;
  const std::int32_t padded = key_capacity(size);
  if (n <= select_small_max) {
    // two per pass while two are wanted: half the passes' reductions
    std::int64_t bound = std::numeric_limits<std::int64_t>::max(), best[2];
    std::int32_t j = 0;
    for (; j + 2 <= n; j += 2) {
      top2_below(keys, padded, bound, best);
      ids[j] = index_of(best[0]);
      ids[j + 1] = index_of(best[1]);
      bound = best[1];
    }
    if (j < n) ids[j] = index_of(max_key_below(keys, padded, bound));
  } else {
    std::partial_sort(keys, keys + n, keys + padded, std::greater<>());
    for (std::int32_t j = 0; j < n; ++j) ids[j] = index_of(keys[j]);
  }
}

/// @brief The n best of v[0, size) among allowed[i] != 0 (allowed null: all), best first: ids
///        into ids[0, n), their values into vals[0, n) when vals is not null. `keys` is scratch
///        of key_capacity(size). The caller guarantees at least n allowed entries. Any values
///        but NaN (-inf included, and -0 ties with +0).
inline void top_n(const float* v, std::int32_t size, const std::uint8_t* allowed, std::int32_t n,
                  float* vals, std::int32_t* ids, std::int64_t* keys) {
  if (n == 2 && allowed == nullptr && size >= 2) {
    top2_of_values(v, size, ids);
    if (vals != nullptr)
      for (std::int32_t j = 0; j < 2; ++j) vals[j] = v[ids[j]];
    return;
  }
#if defined(MOEROUTE_CPU_SELECT_ROWS)
  if (n >= 3 && n <= 16 && size >= 32 && top_n_by_threshold(v, size, allowed, n, ids)) {
    if (vals != nullptr)
      for (std::int32_t j = 0; j < n; ++j) vals[j] = v[ids[j]];
    return;
  }
#endif
  make_keys(v, size, allowed, keys);
  select_keys(keys, size, n, ids);
  if (vals != nullptr)
    for (std::int32_t j = 0; j < n; ++j) vals[j] = v[ids[j]];
}

/// True when group_kept_top2 applies: groups scored by their best one or two values (DeepSeek-V3:
/// the sum of the top 2 of 32), groups a multiple of 16 wide, G <= 16.
[[nodiscard]] inline bool group_limit_by_top2(const routing_config& cfg, std::int32_t E,
                                              std::int32_t G) noexcept {
  return group_score_take(cfg) <= 2 && (E / G) % 16 == 0 && G <= 16;
}

#if defined(MOEROUTE_CPU_SELECT_AVX512)
/// Lane-wise, the largest and second largest of two (largest, second largest) pairs.
[[gnu::always_inline]] inline void fold_top2_16(__m512 a1, __m512 b1, __m512 a2, __m512 b2,
                                                __m512& first, __m512& second) noexcept {
  constexpr __mmask16 all = 0xffff;  // (maskz forms: see math::clamp)
  first = _mm512_maskz_max_ps(all, a1, b1);
  second =
      _mm512_maskz_max_ps(all, _mm512_maskz_min_ps(all, a1, b1), _mm512_maskz_max_ps(all, a2, b2));
}

/// fold_top2_16 of the pairs (x1, x2) and (y1, y2) with their lanes rearranged by one shuffle:
/// Lo gathers the lanes compared with those Hi gathers, from 128-bit chunks of x and y
/// (Chunks: vshuff32x4) or within each chunk (vshufps).
template <bool Chunks, int Lo, int Hi>
[[gnu::always_inline]] inline void fold_shuffled(__m512 x1, __m512 y1, __m512 x2, __m512 y2,
                                                 __m512& first, __m512& second) noexcept {
  constexpr __mmask16 all = 0xffff;
  if constexpr (Chunks)
    fold_top2_16(_mm512_maskz_shuffle_f32x4(all, x1, y1, Lo),
                 _mm512_maskz_shuffle_f32x4(all, x1, y1, Hi),
                 _mm512_maskz_shuffle_f32x4(all, x2, y2, Lo),
                 _mm512_maskz_shuffle_f32x4(all, x2, y2, Hi), first, second);
  else
    fold_top2_16(_mm512_maskz_shuffle_ps(all, x1, y1, Lo), _mm512_maskz_shuffle_ps(all, x1, y1, Hi),
                 _mm512_maskz_shuffle_ps(all, x2, y2, Lo), _mm512_maskz_shuffle_ps(all, x2, y2, Hi),
                 first, second);
}

/// @brief group_kept_top2's scores of 8 groups (a multiple of 16 wide) in lanes 0..7: each
///        group's lane-wise largest and second largest, then the lanes of all 8 folded
///        together — two groups' halves side by side in one register, then four groups'
///        quarters, then the 128-bit chunks' pairs and single lanes: 4 folds for the 8 groups
///        where folding one group alone took 4 (DeepSeek-V3, rows in L1: the groups' scores
///        29 -> 9 ns a token, measured). float(double(best) + double(second)) (take 2) or best
///        (take 1).
[[gnu::always_inline]] inline __m256 group_scores_of8(const float* sel, std::int32_t per_group,
                                                      std::int32_t take) noexcept {
  constexpr __mmask16 all = 0xffff;
  __m512 v1[8], v2[8];
  for (std::int32_t g = 0; g < 8; ++g) {
    const float* v = sel + g * per_group;
    v1[g] = _mm512_loadu_ps(v);
    v2[g] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (std::int32_t i = 16; i < per_group; i += 16)
      fold_top2_16(v1[g], _mm512_loadu_ps(v + i), v2[g], v2[g], v1[g], v2[g]);
  }
  // 16 -> 8 lanes: groups 2p, 2p + 1 side by side (their low halves against their high ones)
  __m512 a1[4], a2[4], b1[2], b2[2], c1, c2, d1, d2;
  for (std::int32_t p = 0; p < 4; ++p)
    fold_shuffled<true, 0x44, 0xee>(v1[2 * p], v1[2 * p + 1], v2[2 * p], v2[2 * p + 1], a1[p],
                                    a2[p]);
  // 8 -> 4: groups 4q .. 4q + 3, a 128-bit chunk each
  for (std::int32_t q = 0; q < 2; ++q)
    fold_shuffled<true, 0x88, 0xdd>(a1[2 * q], a1[2 * q + 1], a2[2 * q], a2[2 * q + 1], b1[q],
                                    b2[q]);
  // 4 -> 2 within the chunks: chunk c holds groups c and c + 4, two lanes each
  fold_shuffled<false, 0x44, 0xee>(b1[0], b1[1], b2[0], b2[1], c1, c2);
  // 2 -> 1: chunk c's lanes 0 and 1 are groups c and c + 4
  fold_shuffled<false, 0x88, 0xdd>(c1, c1, c2, c2, d1, d2);
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  // (the first 8 lanes by a vector-extension shuffle: GCC 12's _mm512_castps512_ps256 trips
  // -Wmaybe-uninitialized)
  const auto low8 = [](__m512 v) {
    const auto w = (math::f32x16)v;
    return __builtin_shufflevector(w, w, 0, 1, 2, 3, 4, 5, 6, 7);
  };
  const math::f32x8 best = low8(_mm512_maskz_permutexvar_ps(all, order, d1));
  if (take != 2) return (__m256)best;
  const math::f32x8 second = low8(_mm512_maskz_permutexvar_ps(all, order, d2));
  return (__m256) __builtin_convertvector(
      __builtin_convertvector(best, math::f64x8) + __builtin_convertvector(second, math::f64x8),
      math::f32x8);
}

/// @brief The kept groups of G <= 16 group scores score[0, G) (score[16], the rest 0): those
///        with fewer than `keep` better ones, in increasing order into kept[]; returns how
///        many. Ranked by counting, as order_candidates ranks (ordered int32, ties to the lower
///        index).
inline std::int32_t kept_groups(const float* score, std::int32_t G, std::int32_t keep,
                                std::int32_t* kept) noexcept {
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i h = ordered_int32(_mm512_loadu_ps(score));
  alignas(64) std::int32_t hs[16];
  _mm512_store_si512(hs, h);
  __m512i better = _mm512_setzero_si512();
  for (std::int32_t j = 0; j < G; ++j) {
    const auto after = static_cast<__mmask16>(0xfffeu << j);  // lanes above j
    const __m512i bj = _mm512_set1_epi32(hs[j]);
    better = _mm512_mask_add_epi32(
        better, _mm512_cmplt_epi32_mask(h, _mm512_mask_add_epi32(bj, after, bj, one)), better, one);
  }
  const auto live = static_cast<__mmask16>((1u << G) - 1u);
  const __mmask16 k = _mm512_mask_cmplt_epi32_mask(live, better, _mm512_set1_epi32(keep));
  _mm512_mask_compressstoreu_epi32(
      kept, k, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return std::popcount(static_cast<unsigned>(k));
}
#endif

/// @brief The group limit's kept groups for groups scored by their best one or two values
///        (group_limit_by_top2): the score needs the values, not which entries hold them, so
///        each group keeps a per-lane largest and second largest and folds its lanes, with no
///        keys and no selection. The kept groups are those with fewer than group_topk better
///        groups (larger score, or equal and a lower index), written to kept[] in increasing
///        order; returns how many (group_topk). The same scores (sum in double, best first) and
///        groups as the general path of group_mask.
inline std::int32_t group_kept_top2(const routing_config& cfg, const float* sel, std::int32_t G,
                                    std::int32_t per_group, std::int32_t* kept) noexcept {
  const std::int32_t take = group_score_take(cfg);
  const std::int32_t keep = cfg.gating.group_limit.group_topk;
  float score[16] = {};
#if defined(MOEROUTE_CPU_SELECT_AVX512)
  if (G == 8) {
    _mm256_storeu_ps(score, group_scores_of8(sel, per_group, take));
    return kept_groups(score, G, keep, kept);
  }
#endif
  using math::f32x4, math::f32x8;
  // lane-wise: the largest and second largest of the pairs (a1, a2) and (b1, b2) (each its
  // largest first) (results by reference: vectors by value would change the ABI per ISA)
  const auto fold_top2 = [](const auto& a1, const auto& b1, const auto& a2, const auto& b2,
                            auto& first, auto& second) {
    const auto lo = a1 > b1 ? b1 : a1, s2 = a2 > b2 ? a2 : b2;
    first = a1 > b1 ? a1 : b1;
    second = lo > s2 ? lo : s2;
  };
  for (std::int32_t grp = 0; grp < G; ++grp) {
    const float* v = sel + grp * per_group;
    // each of 16 lanes' largest and second largest (lane l: the entries i % 16 == l), held as
    // two 8-lane halves: a 16-float generic vector has no register on AVX2, where GCC kept it
    // in memory and took it a lane at a time (a third of DeepSeek-V3's gating there)
    f32x8 lo1, hi1, lo2 = f32x8{} - std::numeric_limits<float>::infinity(), hi2 = lo2;
    std::memcpy(&lo1, v, sizeof lo1);
    std::memcpy(&hi1, v + 8, sizeof hi1);
    for (std::int32_t i = 16; i < per_group; i += 16) {
      f32x8 xl, xh;
      std::memcpy(&xl, v + i, sizeof xl);
      std::memcpy(&xh, v + i + 8, sizeof xh);
      const f32x8 ml = lo1 < xl ? lo1 : xl, mh = hi1 < xh ? hi1 : xh;
      lo1 = lo1 > xl ? lo1 : xl;
      hi1 = hi1 > xh ? hi1 : xh;
      lo2 = lo2 > ml ? lo2 : ml;
      hi2 = hi2 > mh ? hi2 : mh;
    }
    // fold the lanes by halves: the two largest of two (largest, second) pairs, lane-wise
    f32x8 b1, b2;
    f32x4 c1, c2;
    fold_top2(lo1, hi1, lo2, hi2, b1, b2);
    fold_top2(__builtin_shufflevector(b1, b1, 0, 1, 2, 3),
              __builtin_shufflevector(b1, b1, 4, 5, 6, 7),
              __builtin_shufflevector(b2, b2, 0, 1, 2, 3),
              __builtin_shufflevector(b2, b2, 4, 5, 6, 7), c1, c2);
    // (the last two folds stay in 4-lane registers, upper lanes ignored: folding scalars
    // read from the vectors cost DeepSeek-V3's gating 28 %)
    f32x4 d1, d2, e1, e2;
    fold_top2(c1, __builtin_shufflevector(c1, c1, 2, 3, 2, 3), c2,
              __builtin_shufflevector(c2, c2, 2, 3, 2, 3), d1, d2);
    fold_top2(d1, __builtin_shufflevector(d1, d1, 1, 1, 1, 1), d2,
              __builtin_shufflevector(d2, d2, 1, 1, 1, 1), e1, e2);
    double s = static_cast<double>(e1[0]);
    if (take == 2) s += static_cast<double>(e2[0]);
    score[grp] = static_cast<float>(s);
  }
#if defined(MOEROUTE_CPU_SELECT_AVX512)
  return kept_groups(score, G, keep, kept);
#else
  std::int32_t count = 0;
  for (std::int32_t grp = 0; grp < G; ++grp) {
    std::int32_t better = 0;
    for (std::int32_t h = 0; h < G; ++h)
      better += (score[h] > score[grp] || (score[h] == score[grp] && h < grp)) ? 1 : 0;
    kept[count] = grp;
    count += better < keep ? 1 : 0;
  }
  return count;
#endif
}

/// @brief The kept groups' values side by side: out[j * per_group + i] = sel[kept[j] * per_group
///        + i]. Their order is the index order of the row, so a selection over `out` ranks
///        (ties included) as one over the kept entries of the row does.
inline void gather_groups(const float* sel, std::int32_t per_group, const std::int32_t* kept,
                          std::int32_t count, float* out) noexcept {
  if (per_group % 16 == 0) {  // (a call to memcpy per group cost more than the copy)
    for (std::int32_t j = 0; j < count; ++j)
      for (std::int32_t i = 0; i < per_group; i += 16)
        std::memcpy(out + j * per_group + i, sel + kept[j] * per_group + i, 16 * sizeof(float));
    return;
  }
  for (std::int32_t j = 0; j < count; ++j)
    std::memcpy(out + j * per_group, sel + kept[j] * per_group,
                static_cast<std::size_t>(per_group) * sizeof(float));
}

/// @brief ids selected from gather_groups' row back to the row's indices.
inline void ungather_ids(std::int32_t per_group, const std::int32_t* kept, std::int32_t n,
                         std::int32_t* ids) noexcept {
  // groups of a power of two (DeepSeek-V3: 32) by a shift and a mask: an integer division
  // per id was 7 % of DeepSeek-V3's gating (measured)
  const auto size = static_cast<std::uint32_t>(per_group);
  if (std::has_single_bit(size)) {
    const int shift = std::countr_zero(size);
    for (std::int32_t j = 0; j < n; ++j)
      ids[j] = kept[ids[j] >> shift] * per_group + (ids[j] & (per_group - 1));
    return;
  }
  for (std::int32_t j = 0; j < n; ++j)
    ids[j] = kept[ids[j] / per_group] * per_group + ids[j] % per_group;
}

/// @brief The group limit: each of G groups of E / G experts scores the sum (in double, best
///        first) of its group_score_take(cfg) best selection values; the group_topk best groups
///        (ties to the lower group) are allowed. `group_scores` [G], `ids` [E] and `keys`
///        [key_capacity(E)] are scratch; allowed [E] is written.
inline void group_mask(const routing_config& cfg, const float* sel, std::int32_t E, std::int32_t G,
                       float* group_scores, std::int32_t* ids, std::int64_t* keys,
                       std::uint8_t* allowed) {
  const std::int32_t per_group = E / G, take = group_score_take(cfg);
  if (group_limit_by_top2(cfg, E, G)) {
    std::int32_t kept[16];
    const std::int32_t count = group_kept_top2(cfg, sel, G, per_group, kept);
    std::fill(allowed, allowed + E, std::uint8_t{0});
    for (std::int32_t j = 0; j < count; ++j)
      std::fill(allowed + kept[j] * per_group, allowed + (kept[j] + 1) * per_group,
                std::uint8_t{1});
    return;
  }
  for (std::int32_t grp = 0; grp < G; ++grp) {
    const float* v = sel + grp * per_group;
    top_n(v, per_group, nullptr, take, nullptr, ids, keys);
    double s = 0.0;
    for (std::int32_t i = 0; i < take; ++i) s += v[ids[i]];
    group_scores[grp] = static_cast<float>(s);
  }
  const std::int32_t keep = cfg.gating.group_limit.group_topk;
  top_n(group_scores, G, nullptr, keep, nullptr, ids, keys);
  std::fill(allowed, allowed + E, std::uint8_t{0});
  for (std::int32_t i = 0; i < keep; ++i)
    std::fill(allowed + ids[i] * per_group, allowed + (ids[i] + 1) * per_group, std::uint8_t{1});
}

}  // namespace moeroute::cpu::detail
