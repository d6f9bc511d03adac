// SPDX-License-Identifier: Apache-2.0
// Row kernels of the CPU backend's permute / combine family: a row of float, half_bits or
// bf16_bits loaded into float and stored back with the reference's rounding (round to nearest
// even), in column tiles that stay in L1, written as simple loops the compiler vectorises.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <moeroute/cpu/detail/math.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/status.hpp>

namespace moeroute::cpu::rows {

/// Columns per tile: a tile of floats per accumulator stays in L1 for any d.
inline constexpr std::int64_t tile = 512;

/// The first bad entry of a layout's assignment rows [n] / row tokens [rows] (either may be
/// null), or success: what the row ops check before they index with them.
[[nodiscard]] inline status check_layout_rows(const std::int64_t* assignment_row, std::int64_t n,
                                              const std::int32_t* row_token, std::int64_t rows,
                                              std::int64_t tokens) {
  for (std::int64_t a = 0; a < n; ++a)
    if (assignment_row[a] < -1 || assignment_row[a] >= rows)
      return status::make(status_code::invalid_argument,
                          "layout.d_assignment_row[" + std::to_string(a) + "] = " +
                              std::to_string(assignment_row[a]) + " is outside [-1, rows)");
  if (row_token != nullptr)
    for (std::int64_t r = 0; r < rows; ++r)
      if (row_token[r] < -1 || row_token[r] >= tokens)
        return status::make(status_code::invalid_argument,
                            "layout.d_row_token[" + std::to_string(r) +
                                "] = " + std::to_string(row_token[r]) + " is outside [-1, tokens)");
  return status::success();
}

/// @brief dst[0, bytes) = src[0, bytes) (not overlapping), inline: 256 bytes a step in 64-byte
///        vectors, then 64, then a libc memcpy of the tail under 64 bytes. A row op copies
///        thousands of rows of a few KB, and a libc call per row (its size dispatch included)
///        costs about as much as moving a row that sits in L2. With `next` (the row the caller
///        copies next, or null), each step asks for the same 256 bytes of it (into L2): the
///        next row's stream in flight at the pace of this one (see prefetch_along). With
///        `stream` (dst 64-byte aligned) the 64-byte steps are non-temporal stores where the ISA
///        has them (AVX-512; see stream_min_bytes): the caller calls stream_fence after.
inline void copy_bytes(void* __restrict dst, const void* __restrict src, std::size_t bytes,
                       const void* next = nullptr, bool stream = false) noexcept {
  // 64-byte vectors in registers, moved in and out by memcpy (unaligned vector moves): a
  // pointer cast to an under-aligned vector type is not portable (clang drops the typedef's
  // alignment through a reference and took movdqa for these unaligned rows)
  typedef unsigned char v64 __attribute__((vector_size(64)));
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const auto* n = static_cast<const unsigned char*>(next);
  const auto put = [stream](unsigned char* at, const v64& v) {
#if defined(__AVX512F__)
    if (stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(at), reinterpret_cast<const __m512i&>(v));
      return;
    }
#else
    (void)stream;
#endif
    std::memcpy(at, &v, sizeof(v64));
  };
  std::size_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    if (n != nullptr)
      for (std::size_t l = 0; l < 256; l += 64) __builtin_prefetch(n + i + l, 0, 2);
    v64 a, b, c, e;
    std::memcpy(&a, s + i, sizeof(v64));
    std::memcpy(&b, s + i + 64, sizeof(v64));
    std::memcpy(&c, s + i + 128, sizeof(v64));
    std::memcpy(&e, s + i + 192, sizeof(v64));
    put(d + i, a);
    put(d + i + 64, b);
    put(d + i + 128, c);
    put(d + i + 192, e);
  }
  for (; i + 64 <= bytes; i += 64) {
    v64 a;
    std::memcpy(&a, s + i, sizeof(v64));
    put(d + i, a);
  }
  if (i < bytes) std::memcpy(d + i, s + i, bytes - i);
}

/// float -> bf16, round to nearest even, NaN kept quiet: the bits of dtype's to_bf16,
/// branch-free so that a loop of it vectorises.
[[nodiscard]] inline bf16_bits to_bf16_fast(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u >> 16) | 0x40u;
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return bf16_bits{static_cast<std::uint16_t>(is_nan ? nan : rounded)};
}

/// Asks for the cache lines of src[0, n) (a hint; no effect on results).
template <class Element>
inline void prefetch(const Element* src, std::int64_t n) noexcept {
  constexpr std::int64_t per_line = 64 / static_cast<std::int64_t>(sizeof(Element));
  for (std::int64_t c = 0; c < n; c += per_line) __builtin_prefetch(src + c);
}

/// @brief In a 16-column walk over rows: asks (into L2) for the cache line of another row
///        that holds column c, when c starts one. Walking the next rows a row op will read at
///        the pace of the current ones keeps their streams in flight without flooding the fill
///        buffers or evicting the current rows from L1, as requesting whole rows up front does.
template <class Element>
inline void prefetch_along(const Element* next_row, std::int64_t c) noexcept {
  constexpr std::int64_t per_line = 64 / static_cast<std::int64_t>(sizeof(Element));
  if (c % per_line == 0) __builtin_prefetch(next_row + c, 0, 2);
}

/// dst[c] = float(src[c]) for c < n
template <class Element>
inline void load(const Element* __restrict src, std::int64_t n, float* __restrict dst) noexcept {
  for (std::int64_t c = 0; c < n; ++c) dst[c] = math::load(src[c]);
}

/// dst[c] = Element(src[c]) for c < n (the reference's from_float rounding)
template <class Element>
inline void store(const float* __restrict src, std::int64_t n, Element* __restrict dst) noexcept {
  if constexpr (std::is_same_v<Element, float>) {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = src[c];
  } else if constexpr (std::is_same_v<Element, bf16_bits>) {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = to_bf16_fast(src[c]);
  } else {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = from_float<Element>(src[c]);
  }
}

// L columns at a time in GCC / Clang generic vectors: bf16 and float rows loaded to float and
// stored back with the same rounding as load() / store() above. The kernels take L = lanes,
// the ISA's register (16 on AVX-512, 8 on AVX2, 4 on SSE2): GCC lowers a wider generic
// vector to memory and a compare on one to scalar code, which ran combine at 3 GB/s on an
// AVX2 machine. bf16's widening and rounding take AVX-512 / AVX512-BF16 instructions where the
// compiler targets them (same bits: the "row kernels' bf16 load and store" test in
// tests/cpu/math_test.cpp).

/// Vectors of L lanes: float (f), its bits (u), as signed (i), and bf16 bits (h).
template <int L>
struct row_vec;
template <>
struct row_vec<16> {
  using f = float __attribute__((vector_size(64)));
  using u = std::uint32_t __attribute__((vector_size(64)));
  using i = std::int32_t __attribute__((vector_size(64)));
  using h = std::uint16_t __attribute__((vector_size(32)));
};
template <>
struct row_vec<8> {
  using f = float __attribute__((vector_size(32)));
  using u = std::uint32_t __attribute__((vector_size(32)));
  using i = std::int32_t __attribute__((vector_size(32)));
  using h = std::uint16_t __attribute__((vector_size(16)));
};
template <>
struct row_vec<4> {
  using f = float __attribute__((vector_size(16)));
  using u = std::uint32_t __attribute__((vector_size(16)));
  using i = std::int32_t __attribute__((vector_size(16)));
  using h = std::uint16_t __attribute__((vector_size(8)));
};

/// The kernels' width: one register of floats.
inline constexpr std::int32_t lanes = math::native_lanes;
using f32l = row_vec<lanes>::f;
using f32x16 = row_vec<16>::f;

/// Element types with a vector path (float and bf16: loads and stores by whole registers;
/// half goes element by element through dtype.hpp).
template <class Element>
inline constexpr bool has_vector_path =
    std::is_same_v<Element, float> || std::is_same_v<Element, bf16_bits>;

/// r = float(src[0, L))
template <int L, class Element>
inline void load_lanes(const Element* src, typename row_vec<L>::f& r) noexcept {
  static_assert(L <= lanes, "wider than a register: GCC would keep the vector in memory");
  using V = row_vec<L>;
  if constexpr (std::is_same_v<Element, float>) {
    std::memcpy(&r, src, sizeof r);
  } else {
#if defined(__AVX512F__)
    if constexpr (L == 16) {
      // one widening load and a shift (GCC makes the generic conversion below two half-width
      // widenings and an insert); the maskz forms: the plain ones trip GCC 12's
      // -Wmaybe-uninitialized
      r = (typename V::f)_mm512_maskz_slli_epi32(
          0xffff,
          _mm512_maskz_cvtepu16_epi32(0xffff,
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))),
          16);
      return;
    }
#endif
    typename V::h h;
    std::memcpy(&h, src, sizeof h);
    r = (typename V::f)(__builtin_convertvector(h, typename V::u) << 16);
  }
}

/// to_bf16_fast of each lane of float bits. The NaN test is a signed compare (the magnitude's
/// bits are below 2^31; AVX2 has no unsigned compare, and GCC made one a lane at a time).
template <int L>
[[nodiscard]] inline typename row_vec<L>::h bf16_of_bits(const typename row_vec<L>::u& u) noexcept {
  using V = row_vec<L>;
  using U = typename V::u;
  const U rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const U nan = (U)((typename V::i)(u & 0x7FFFFFFFu) > 0x7F800000);
  const U bits = (nan & ((u >> 16) | 0x40u)) | (~nan & rounded);
  return __builtin_convertvector(bits, typename V::h);
}

/// Element(v) of L columns, as stored: float as is, bf16 rounded to nearest even (a NaN stays
/// a quiet NaN). (Results by reference: vectors by value would change the ABI per ISA.)
template <int L, class Element>
using packed = std::conditional_t<std::is_same_v<Element, float>, typename row_vec<L>::f,
                                  typename row_vec<L>::h>;
template <int L, class Element>
inline void pack_lanes(const typename row_vec<L>::f& v, packed<L, Element>& out) noexcept {
  static_assert(L <= lanes, "wider than a register: GCC would keep the vector in memory");
  if constexpr (std::is_same_v<Element, float>) {
    out = v;
  } else {
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
    if constexpr (L == 16) {
      // vcvtneps2bf16 rounds to nearest even and keeps a NaN quiet as to_bf16_fast does (one
      // instruction for the eleven below), but reads a subnormal input as zero: a register
      // holding one (rare) takes the integer path
      const __m512i b = (__m512i)v;
      const __mmask16 subnormal =
          _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(b, _mm512_set1_epi32(0x7F800000)), b,
                                      _mm512_set1_epi32(0x007FFFFF));
      if (subnormal == 0) {
        out = (typename row_vec<16>::h)_mm512_cvtneps_pbh((__m512)v);
        return;
      }
    }
#endif
    out = bf16_of_bits<L>((typename row_vec<L>::u)v);
  }
}

/// Outputs of at least this many bytes are written past the caches where a row op can
/// (store_lanes' `stream`), as memcpy writes a large copy (glibc: above 3/4 of the shared
/// cache a thread): an output this large is evicted by the op's own reads before anything
/// reads it back, and a normal store first reads each line it writes.
inline constexpr std::int64_t stream_min_bytes = std::int64_t{8} << 20;

/// True when a streamed store can write at `row` (aligned to 16 * sizeof(Element)).
template <class Element>
[[nodiscard]] inline bool stream_aligned(const Element* row) noexcept {
  return reinterpret_cast<std::uintptr_t>(row) % (16 * sizeof(Element)) == 0;
}

/// @brief dst[0, L) = Element(v) (round to nearest even; a NaN stays a quiet NaN). With
///        `stream` (dst then aligned to 16 * sizeof(Element)) and L = 16, by a non-temporal
///        store where the ISA has one (AVX-512): weakly ordered, so the writer calls
///        stream_fence before its results are read.
template <int L, class Element>
inline void store_lanes(const typename row_vec<L>::f& v, Element* dst,
                        bool stream = false) noexcept {
  packed<L, Element> h;
  pack_lanes<L, Element>(v, h);
#if defined(__AVX512F__)
  if constexpr (L == 16) {
    if (stream) {
      if constexpr (std::is_same_v<Element, float>)
        _mm512_stream_ps(reinterpret_cast<float*>(dst), (__m512)h);
      else
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), (__m256i)h);
      return;
    }
  }
#endif
  (void)stream;
  std::memcpy(static_cast<void*>(dst), &h, sizeof h);
}

/// Orders a thread's streamed stores before what it does next (its task's end).
inline void stream_fence() noexcept {
#if defined(__AVX512F__)
  _mm_sfence();
#endif
}

}  // namespace moeroute::cpu::rows
