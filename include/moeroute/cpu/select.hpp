// SPDX-License-Identifier: Apache-2.0
// Selection for the CPU backend: the n best of a row (larger value first, ties to the lower
// index, as the reference and the kernels rank) and the group-limit mask. Small n keeps a
// sorted run of n in registers while scanning once; large n sorts an index array.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include <moeroute/config.hpp>
#include <moeroute/cpu/math.hpp>

namespace moeroute::cpu::detail {

/// n up to this is selected by one insertion scan; beyond it by a partial sort of indices.
inline constexpr std::int32_t select_small_max = 16;

/// Strict "better than": larger value, then lower index.
[[nodiscard]] inline bool better(float va, std::int32_t a, float vb, std::int32_t b) noexcept {
  return va > vb || (va == vb && a < b);
}

/// Lanes of the selection vectors: a native register of the target (math::native_lanes), so
/// a generic vector is never split into memory round trips. Selection is exact, so the results
/// do not depend on it.
inline constexpr std::int32_t select_lanes = math::native_lanes;
using f32v = math::f32n;
using i32v = math::i32n;

/// 0, 1, ..., select_lanes - 1
[[nodiscard]] inline i32v lane_iota() noexcept {
  i32v v = {};
  for (std::int32_t l = 0; l < select_lanes; ++l) v[l] = l;
  return v;
}

// Vectors pass by reference only: by value, their calling convention would depend on the ISA
// (-Wpsabi), and these helpers are always inlined anyway.

/// r = m ? a : b per lane (m lanes all ones or zero). A C-style cast between generic vectors
/// of one size reinterprets the bits, in registers.
template <class F, class I>
inline void blend(F& r, const I& m, const F& a, const F& b) noexcept {
  r = (F)((m & (I)a) | (~m & (I)b));
}

/// The better of two (value, index) lane sets, lane by lane: the larger value, then the lower
/// index (a lane holding nothing has value -inf and index -1).
template <class F, class I>
inline void better_of(F& v, I& i, const F& w, const I& j) noexcept {
  // index -1 marks an empty lane (its value says nothing: -inf is a legal value)
  const I gain = (j >= 0) & ((i < 0) | (w > v) | ((w == v) & (j < i)));
  blend(v, gain, w, v);
  i = (gain & j) | (~gain & i);
}

/// @brief The best (value, lowest index) of the lanes: 16 lanes by halving in registers,
///        narrower vectors lane by lane (branch-free).
inline void reduce_best(const f32v& v, const i32v& ix, float& best, std::int32_t& at) noexcept {
  float bv;
  std::int32_t bi;
#if defined(__AVX512F__)  // select_lanes == 16 (a discarded `if constexpr` would still be checked)
  {
    using f8 = float __attribute__((vector_size(32)));
    using i8 = std::int32_t __attribute__((vector_size(32)));
    using f4 = float __attribute__((vector_size(16)));
    using i4 = std::int32_t __attribute__((vector_size(16)));
    using f2 = float __attribute__((vector_size(8)));
    using i2 = std::int32_t __attribute__((vector_size(8)));
    // __builtin_shufflevector (GCC >= 12, Clang) keeps the halves in registers
    f8 v8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    i8 j8 = __builtin_shufflevector(ix, ix, 0, 1, 2, 3, 4, 5, 6, 7);
    const f8 w8 = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const i8 k8 = __builtin_shufflevector(ix, ix, 8, 9, 10, 11, 12, 13, 14, 15);
    better_of(v8, j8, w8, k8);
    f4 v4 = __builtin_shufflevector(v8, v8, 0, 1, 2, 3);
    i4 j4 = __builtin_shufflevector(j8, j8, 0, 1, 2, 3);
    const f4 w4 = __builtin_shufflevector(v8, v8, 4, 5, 6, 7);
    const i4 k4 = __builtin_shufflevector(j8, j8, 4, 5, 6, 7);
    better_of(v4, j4, w4, k4);
    f2 v2 = __builtin_shufflevector(v4, v4, 0, 1);
    i2 j2 = __builtin_shufflevector(j4, j4, 0, 1);
    const f2 w2 = __builtin_shufflevector(v4, v4, 2, 3);
    const i2 k2 = __builtin_shufflevector(j4, j4, 2, 3);
    better_of(v2, j2, w2, k2);
    bv = v2[0];
    bi = j2[0];
    // the last pair without a branch: random data would mispredict it half the time
    const bool second = j2[1] >= 0 && (bi < 0 || v2[1] > bv || (v2[1] == bv && j2[1] < bi));
    bv = second ? v2[1] : bv;
    bi = second ? j2[1] : bi;
  }
#else
  bv = v[0];
  bi = ix[0];
  for (std::int32_t l = 1; l < select_lanes; ++l) {
    const bool take = ix[l] >= 0 && (bi < 0 || v[l] > bv || (v[l] == bv && ix[l] < bi));
    bv = take ? v[l] : bv;
    bi = take ? ix[l] : bi;
  }
#endif
  best = bv;
  at = bi;
}

/// @brief The best entry of v[0, size) that ranks below (pv, pi) — a smaller value, or an
///        equal one at a larger index — as its index (-1 if none) and value `best`. One pass
///        of select_lanes lanes, each keeping its best (value, lowest index), then the lanes
///        reduced.
inline std::int32_t best_below(const float* v, std::int32_t size, float pv, std::int32_t pi,
                               float& best) noexcept {
  constexpr float none = -std::numeric_limits<float>::infinity();
  const i32v iota = lane_iota();
  const f32v vnone = f32v{} + none;
  f32v lane_v = vnone;
  i32v lane_i = i32v{} - 1;
  std::int32_t i = 0;
  for (; i + select_lanes <= size; i += select_lanes) {
    f32v x;
    std::memcpy(&x, v + i, sizeof x);
    const i32v idx = iota + i;
    const i32v below = (x < pv) | ((x == pv) & (idx > pi));
    // strictly better: a lane keeps its lowest index on ties; an empty lane (index -1) takes
    // any entry below, -inf included
    const i32v gain = below & ((x > lane_v) | (lane_i < 0));
    blend(lane_v, gain, x, lane_v);
    lane_i = (gain & idx) | (~gain & lane_i);
  }
  float m;
  std::int32_t at;
  reduce_best(lane_v, lane_i, m, at);
  const auto offer = [&](float x, std::int32_t j) {
    if (!(x < pv || (x == pv && j > pi))) return;
    if (x > m || (x == m && (at < 0 || j < at))) {
      m = x;
      at = j;
    }
  };
  for (; i < size; ++i) offer(v[i], i);
  best = m;
  return at;
}

/// @brief The two best of v[0, size) (size >= 2) in one pass: each lane keeps its best
///        and second best; the best of the lanes' bests wins, and the second is the best of
///        the other lanes' bests and the winner's second. Ties to the lower index throughout.
inline void top2(const float* v, std::int32_t size, float* vals, std::int32_t* ids) noexcept {
  constexpr float none = -std::numeric_limits<float>::infinity();
  const i32v iota = lane_iota();
  const f32v vnone = f32v{} + none;
  f32v v1 = vnone, v2 = vnone;
  i32v i1 = i32v{} - 1, i2 = i32v{} - 1;
  std::int32_t i = 0;
  for (; i + select_lanes <= size; i += select_lanes) {
    f32v x;
    std::memcpy(&x, v + i, sizeof x);
    const i32v idx = iota + i;
    // strictly: equal values keep the lower index; an empty slot (index -1) takes anything
    const i32v gain1 = (x > v1) | (i1 < 0);
    const i32v gain2 = ~gain1 & ((x > v2) | (i2 < 0));  // a new second best
    f32v down;  // what becomes the second: the old best, or x
    blend(down, gain1, v1, x);
    const i32v down_i = (gain1 & i1) | (~gain1 & idx);
    blend(v2, gain1 | gain2, down, v2);
    i2 = ((gain1 | gain2) & down_i) | (~(gain1 | gain2) & i2);
    blend(v1, gain1, x, v1);
    i1 = (gain1 & idx) | (~gain1 & i1);
  }
  float m1, m2;
  std::int32_t a1, a2;
  reduce_best(v1, i1, m1, a1);
  const i32v winner = i1 == a1;
  f32v cand;
  blend(cand, winner, v2, v1);
  reduce_best(cand, (winner & i2) | (~winner & i1), m2, a2);
  // the tail (indices above every lane's): an equal value never displaces
  for (; i < size; ++i) {
    const float x = v[i];
    if (a1 < 0 || x > m1) {
      m2 = m1;
      a2 = a1;
      m1 = x;
      a1 = i;
    } else if (a2 < 0 || x > m2) {
      m2 = x;
      a2 = i;
    }
  }
  vals[0] = m1;
  ids[0] = a1;
  vals[1] = m2;
  ids[1] = a2;
}

/// @brief The n best of v[0, size) among allowed[i] != 0 (allowed null: all), best first, into
///        ids[0, n) and their values into vals[0, n) (vals only for n <= select_small_max).
///        `scratch` [size] is used for n > select_small_max and may alias `ids`; `masked`
///        [size] (optional) holds a copy of v with the disallowed entries at -inf, so that a
///        group-limited selection runs the same vectorised passes. The caller guarantees at
///        least n allowed entries. Any values but NaN (a group score may be -inf).
inline void top_n(const float* v, std::int32_t size, const std::uint8_t* allowed, std::int32_t n,
                  float* vals, std::int32_t* ids, std::int32_t* scratch, float* masked = nullptr) {
  if (allowed != nullptr && masked != nullptr && n <= select_small_max) {
    // disallowed entries become -inf; an allowed -inf would then tie with them, so such a
    // row keeps the masked scan below (selection values are finite, so this is rare)
    constexpr float none = -std::numeric_limits<float>::infinity();
    int allowed_none = 0;
    for (std::int32_t i = 0; i < size; ++i) {
      masked[i] = allowed[i] != 0 ? v[i] : none;
      allowed_none |= static_cast<int>(allowed[i] != 0) & static_cast<int>(v[i] == none);
    }
    if (allowed_none == 0) {
      v = masked;
      allowed = nullptr;
    }
  }
  if (n <= select_small_max) {
    std::int32_t have = 0;
    float worst = 0.0f;  // vals[have - 1] once have == n
    // scanning in index order, an equal value never beats an entry already held
    const auto offer = [&](std::int32_t i) {
      const float x = v[i];
      if (have == n && !(x > worst)) return;
      std::int32_t pos = have < n ? have : n - 1;
      while (pos > 0 && x > vals[pos - 1]) {
        vals[pos] = vals[pos - 1];
        ids[pos] = ids[pos - 1];
        --pos;
      }
      vals[pos] = x;
      ids[pos] = i;
      if (have < n) ++have;
      worst = vals[have - 1];
    };
    if (allowed == nullptr && n == 2 && size >= 2) {
      top2(v, size, vals, ids);
      return;
    }
    if (allowed == nullptr) {  // n passes of best_below: vectorised, no data-dependent scan
      float pv = std::numeric_limits<float>::infinity();
      std::int32_t pi = -1;
      for (std::int32_t j = 0; j < n; ++j) {
        pi = best_below(v, size, pv, pi, pv);
        vals[j] = pv;
        ids[j] = pi;
      }
      return;
    }
    for (std::int32_t i = 0; i < size; ++i)
      if (allowed[i] != 0) offer(i);
    return;
  }
  std::int32_t m = 0;
  for (std::int32_t i = 0; i < size; ++i)
    if (allowed == nullptr || allowed[i] != 0) scratch[m++] = i;
  std::partial_sort(scratch, scratch + n, scratch + m,
                    [v](std::int32_t a, std::int32_t b) { return better(v[a], a, v[b], b); });
  if (ids != scratch) std::copy(scratch, scratch + n, ids);
}

/// @brief The group limit: each of G groups of E / G experts scores the sum (in double, best
///        first) of its group_score_take(cfg) best selection values; the group_topk best groups
///        (ties to the lower group) are allowed. `group_scores` [G] and `scratch` [E] are
///        scratch; allowed [E] is written.
inline void group_mask(const routing_config& cfg, const float* sel, std::int32_t E, std::int32_t G,
                       float* group_scores, std::int32_t* scratch, std::uint8_t* allowed) {
  const std::int32_t per_group = E / G, take = group_score_take(cfg);
  float vals[select_small_max];
  std::int32_t ids[select_small_max];
  for (std::int32_t grp = 0; grp < G; ++grp) {
    const float* v = sel + grp * per_group;
    double s = 0.0;
    if (take <= select_small_max) {
      top_n(v, per_group, nullptr, take, vals, ids, scratch);
      for (std::int32_t i = 0; i < take; ++i) s += vals[i];
    } else {
      top_n(v, per_group, nullptr, take, vals, scratch, scratch);
      for (std::int32_t i = 0; i < take; ++i) s += v[scratch[i]];
    }
    group_scores[grp] = static_cast<float>(s);
  }
  const std::int32_t keep = cfg.gating.group_limit.group_topk;
  std::int32_t* chosen = keep <= select_small_max ? ids : scratch;
  top_n(group_scores, G, nullptr, keep, vals, chosen, scratch);
  std::fill(allowed, allowed + E, std::uint8_t{0});
  for (std::int32_t i = 0; i < keep; ++i)
    std::fill(allowed + chosen[i] * per_group, allowed + (chosen[i] + 1) * per_group,
              std::uint8_t{1});
}

}  // namespace moeroute::cpu::detail
