// SPDX-License-Identifier: Apache-2.0
// Selection across a tile of rows at once (AVX-512): the n best (n <= 8) of each of up to 16
// rows, with the rows in the lanes of registers. Blocks of 16 x 16 values are transposed in
// registers, so each register holds one expert's value for every row, made 64-bit keys (value
// above index) in two registers of 8 rows. Each lane keeps its row's best keys so far, sorted,
// in n registers: up to 5 places each expert is inserted (a max and a min per place); from 6,
// groups of 8 experts are sorted by a network and merged into the 8 best (fewer comparisons
// per value than 6-8 insertions). No reduction and no branch per row, where selecting row by
// row costs a threshold, a compression and a rank count per row.
//
// Values are ranked as select.hpp ranks them — the float order with -0 equal to +0, made an
// int32 order; an entry the group limit excludes sits below every real value (INT32_MIN, as
// are the empty places at the start) — and the index below the value breaks ties toward the
// lower index, so keys are distinct and every order of comparisons gives the same result. The
// same ids as top_n (tests/cpu/math_test.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#include <moeroute/cpu/detail/sort_network.hpp>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace moeroute::cpu::detail {

/// The most rows, and the most places per row, top_n_columns handles.
inline constexpr std::int32_t column_rows = 16;
inline constexpr std::int32_t column_places = 8;

#if defined(__AVX512F__)
#define MOEROUTE_CPU_SELECT_COLUMNS 1

/// Transposes 16 x 16 int32 in place: r[i] lane j becomes r[j] lane i. (The maskz forms with
/// every lane set: GCC 12 warns of an undefined pass-through inside the plain intrinsics.)
[[gnu::always_inline]] inline void transpose16(__m512i* r) noexcept {
  __m512i t[16];
  for (std::int32_t i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi32(0xffff, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(0xffff, r[i], r[i + 1]);
  }
  for (std::int32_t i = 0; i < 16; i += 4) {
    r[i] = _mm512_maskz_unpacklo_epi64(0xff, t[i], t[i + 2]);
    r[i + 1] = _mm512_maskz_unpackhi_epi64(0xff, t[i], t[i + 2]);
    r[i + 2] = _mm512_maskz_unpacklo_epi64(0xff, t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_maskz_unpackhi_epi64(0xff, t[i + 1], t[i + 3]);
  }
  // r[4q + c] now holds in its 128-bit block k rows 4q .. 4q + 3 of column 4k + c: column
  // 4k + c gathers block k of r[c], r[4 + c], r[8 + c], r[12 + c] (two 128-bit shuffles)
  for (std::int32_t c = 0; c < 4; ++c) {
    const __m512i a0 = r[c], a1 = r[4 + c], a2 = r[8 + c], a3 = r[12 + c];
    const __m512i b0 = _mm512_maskz_shuffle_i32x4(0xffff, a0, a1, 0x44),
                  b1 = _mm512_maskz_shuffle_i32x4(0xffff, a0, a1, 0xee);
    const __m512i b2 = _mm512_maskz_shuffle_i32x4(0xffff, a2, a3, 0x44),
                  b3 = _mm512_maskz_shuffle_i32x4(0xffff, a2, a3, 0xee);
    t[c] = _mm512_maskz_shuffle_i32x4(0xffff, b0, b2, 0x88);
    t[4 + c] = _mm512_maskz_shuffle_i32x4(0xffff, b0, b2, 0xdd);
    t[8 + c] = _mm512_maskz_shuffle_i32x4(0xffff, b1, b3, 0x88);
    t[12 + c] = _mm512_maskz_shuffle_i32x4(0xffff, b1, b3, 0xdd);
  }
  for (std::int32_t i = 0; i < 16; ++i) r[i] = t[i];
}

/// A comparator on keys: the larger to place i, the smaller to place j (a key list sorts best
/// first).
struct order_pair {
  [[gnu::always_inline]] void operator()(__m512i& i, __m512i& j) const noexcept {
    const __m512i hi = _mm512_maskz_max_epi64(0xff, i, j);
    j = _mm512_maskz_min_epi64(0xff, i, j);
    i = hi;
  }
};

/// Sorts 8 key vectors lane-wise, best first (sort_network.hpp's network).
[[gnu::always_inline]] inline void sort8(__m512i* v) noexcept { sort8_network(v, order_pair{}); }

/// @brief acc = the 8 best of acc and g (each sorted best first), sorted: the lane-wise larger
///        of acc[i] and g[7 - i] are those 8 (and a bitonic sequence), which a bitonic
///        half-cleaner cascade sorts.
[[gnu::always_inline]] inline void merge8(__m512i* acc, const __m512i* g) noexcept {
  for (std::int32_t i = 0; i < 8; ++i) acc[i] = _mm512_maskz_max_epi64(0xff, acc[i], g[7 - i]);
  bitonic_clean8(acc, order_pair{});
}

/// @brief The n best (1 <= n <= column_places) of each row rows[r][0, size), r < count <= 16,
///        among allowed[r][i] != 0 (allowed[r] null: all), best first, into ids[r * n + j].
///        size a multiple of 16. Values are any floats but NaN; each row has n allowed entries.
///        Up to 5 places, each expert is inserted (one comparator per place); from 6, each
///        block's two groups of 8 experts are sorted by a network and merged into the running
///        8 best, about 4 comparators per value instead of n (measured with 16 rows of 64:
///        top-8 42 -> 31 ns a row; at 4 places the two ways cost the same). Keys are distinct,
///        so both give the same result.
template <std::int32_t N>
inline void top_n_columns_fixed(const float* const* rows, const std::uint8_t* const* allowed,
                                std::int32_t count, std::int32_t size, std::int32_t* ids) noexcept {
  constexpr bool merges = N >= 6;
  constexpr std::int32_t L = merges ? 8 : N;  // places kept
  const __m512i none = _mm512_set1_epi32(INT32_MIN);
  const __m512i sign_off = _mm512_set1_epi32(0x7fffffff);
  // keys of rows 0-7 (half 0) and 8-15 (half 1): the ordered value above 2^32 - 1 - index, so
  // a larger key is a better entry and keys are distinct (no tie logic: integer max / min)
  __m512i best[2][L];
  for (std::int32_t h = 0; h < 2; ++h)
    for (std::int32_t j = 0; j < L; ++j) best[h][j] = _mm512_set1_epi64(INT64_MIN);
  for (std::int32_t b = 0; b < size; b += 16) {
    __m512i col[16];
    for (std::int32_t r = 0; r < 16; ++r) {
      // a row past count repeats row 0 (its lanes are never read)
      const std::int32_t src = r < count ? r : 0;
      const __m512i bits =
          _mm512_castps_si512(_mm512_add_ps(_mm512_loadu_ps(rows[src] + b), _mm512_setzero_ps()));
      __m512i ordered = _mm512_xor_si512(
          bits, _mm512_and_si512(_mm512_maskz_srai_epi32(0xffff, bits, 31), sign_off));
      if (allowed[src] != nullptr) {
        const __mmask16 keep = _mm512_test_epi32_mask(
            _mm512_maskz_cvtepu8_epi32(
                0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(allowed[src] + b))),
            _mm512_set1_epi32(0xff));
        ordered = _mm512_mask_mov_epi32(none, keep, ordered);
      }
      col[r] = ordered;
    }
    transpose16(col);
    // column c's key vector for half h (8 rows)
    const auto key = [&](std::int32_t c, std::int32_t h) {
      const __m256i half = h == 0 ? _mm512_maskz_extracti64x4_epi64(0xf, col[c], 0)
                                  : _mm512_maskz_extracti64x4_epi64(0xf, col[c], 1);
      return _mm512_or_si512(
          _mm512_maskz_slli_epi64(0xff, _mm512_maskz_cvtepi32_epi64(0xff, half), 32),
          _mm512_set1_epi64(0xffffffffLL - (b + c)));
    };
    for (std::int32_t h = 0; h < 2; ++h) {
      if constexpr (merges) {
        __m512i g0[8], g1[8];
        for (std::int32_t j = 0; j < 8; ++j) {
          g0[j] = key(j, h);
          g1[j] = key(8 + j, h);
        }
        sort8(g0);
        sort8(g1);
        merge8(g0, g1);
        if (b == 0) {
          for (std::int32_t j = 0; j < 8; ++j) best[h][j] = g0[j];
        } else {
          merge8(best[h], g0);
        }
      } else {
        for (std::int32_t c = 0; c < 16; ++c) {
          __m512i x = key(c, h);
          for (std::int32_t j = 0; j < L; ++j) {
            const __m512i lower = _mm512_maskz_min_epi64(0xff, x, best[h][j]);
            best[h][j] = _mm512_maskz_max_epi64(0xff, x, best[h][j]);
            x = lower;
          }
        }
      }
    }
  }
  alignas(64) std::int64_t out[N][16];
  for (std::int32_t j = 0; j < N; ++j) {
    _mm512_store_si512(out[j], best[0][j]);
    _mm512_store_si512(out[j] + 8, best[1][j]);
  }
  for (std::int32_t r = 0; r < count; ++r)
    for (std::int32_t j = 0; j < N; ++j)
      ids[r * N + j] =
          static_cast<std::int32_t>(0xffffffffu - static_cast<std::uint32_t>(out[j][r]));
}

/// top_n_columns_fixed for a runtime n in [1, column_places].
inline void top_n_columns(const float* const* rows, const std::uint8_t* const* allowed,
                          std::int32_t count, std::int32_t size, std::int32_t n,
                          std::int32_t* ids) noexcept {
  using fixed = void (*)(const float* const*, const std::uint8_t* const*, std::int32_t,
                         std::int32_t, std::int32_t*) noexcept;
  static constexpr fixed by_n[column_places] = {top_n_columns_fixed<1>, top_n_columns_fixed<2>,
                                                top_n_columns_fixed<3>, top_n_columns_fixed<4>,
                                                top_n_columns_fixed<5>, top_n_columns_fixed<6>,
                                                top_n_columns_fixed<7>, top_n_columns_fixed<8>};
  by_n[n - 1](rows, allowed, count, size, ids);
}
#endif

}  // namespace moeroute::cpu::detail
