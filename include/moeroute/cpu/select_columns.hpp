// SPDX-License-Identifier: Apache-2.0
// Selection across a tile of rows at once (AVX-512): the n best (n <= 8) of each of up to 16
// rows, with the rows in the 16 lanes of a register. Blocks of 16 x 16 values are transposed
// in registers, so each register holds one expert's value for every row; each lane keeps its
// row's n best so far in n registers of values and n of ids, and every expert, in index
// order, is inserted by one compare and four blends per place. No reduction and no branch per
// row: about 2.5 vector operations per value, where selecting row by row costs a threshold, a
// compression and a rank count per row.
//
// Values are ranked as select.hpp ranks them — the float order with -0 equal to +0, made an
// int32 order; an entry the group limit excludes sits below every real value (INT32_MIN, as
// are the empty places at the start) — and an entry moves up only past a strictly smaller one,
// so equal values stay in index order: ties go to the lower index. The same ids as top_n
// (tests/cpu/math_test.cpp).
#pragma once

#include <cstdint>
#include <cstring>

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

/// @brief The n best (1 <= n <= column_places) of each row rows[r][0, size), r < count <= 16,
///        among allowed[r][i] != 0 (allowed[r] null: all), best first, into ids[r * n + j].
///        size a multiple of 16. Values are any floats but NaN; each row has n allowed entries.
template <std::int32_t N>
inline void top_n_columns_fixed(const float* const* rows, const std::uint8_t* const* allowed,
                                std::int32_t count, std::int32_t size, std::int32_t* ids) noexcept {
  const __m512i none = _mm512_set1_epi32(INT32_MIN);
  const __m512i sign_off = _mm512_set1_epi32(0x7fffffff);
  // keys of rows 0-7 (lo) and 8-15 (hi): the ordered value above 2^32 - 1 - index, so a larger
  // key is a better entry and keys are distinct (no tie logic: integer max / min)
  __m512i lo[N], hi[N];
  for (std::int32_t j = 0; j < N; ++j) lo[j] = hi[j] = _mm512_set1_epi64(INT64_MIN);
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
    for (std::int32_t c = 0; c < 16; ++c) {
      const __m512i low = _mm512_set1_epi64(0xffffffffLL - (b + c));
      const auto keys = [&](const __m256i& half) {  // 8 rows' values: ordered bits above low
        return _mm512_or_si512(
            _mm512_maskz_slli_epi64(0xff, _mm512_maskz_cvtepi32_epi64(0xff, half), 32), low);
      };
      __m512i x = keys(_mm512_maskz_extracti64x4_epi64(0xf, col[c], 0));
      __m512i y = keys(_mm512_maskz_extracti64x4_epi64(0xf, col[c], 1));
      for (std::int32_t j = 0; j < N; ++j) {
        const __m512i xl = _mm512_maskz_min_epi64(0xff, x, lo[j]),
                      yl = _mm512_maskz_min_epi64(0xff, y, hi[j]);
        lo[j] = _mm512_maskz_max_epi64(0xff, x, lo[j]);
        hi[j] = _mm512_maskz_max_epi64(0xff, y, hi[j]);
        x = xl;
        y = yl;
      }
    }
  }
  alignas(64) std::int64_t out[N][16];
  for (std::int32_t j = 0; j < N; ++j) {
    _mm512_store_si512(out[j], lo[j]);
    _mm512_store_si512(out[j] + 8, hi[j]);
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
