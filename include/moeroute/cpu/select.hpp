// SPDX-License-Identifier: Apache-2.0
// Selection for the CPU backend: the n best of a row (larger value first, ties to the lower
// index, as the reference and the kernels rank) and the group-limit mask.
//
// Each entry becomes one 64-bit key: the float's order in the high half and the complement of
// its index in the low half. Keys are distinct and a larger key is exactly a better entry, so
// selection is integer max / min in native vectors with no tie logic and no data-dependent
// branch: n passes of "the largest key below the last one" (one pass of per-lane max / min for
// n = 2), or a partial sort of keys for large n.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

#include <moeroute/config.hpp>
#include <moeroute/cpu/math.hpp>

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

/// @brief The two best of v[0, size) (size >= 2, no mask) in one pass over the values, their
///        keys made in registers (no key array: k = 2 routing reads each row once).
inline void top2_of_values(const float* v, std::int32_t size, std::int32_t* ids) noexcept {
  using fk = float __attribute__((vector_size(4 * key_lanes)));
  using ik = std::int32_t __attribute__((vector_size(4 * key_lanes)));
  key_vec low = {};  // 2^32 - 1 - index, for the lanes of the chunk at 0
  for (std::int32_t l = 0; l < key_lanes; ++l) low[l] = 0xffffffffLL - l;
  lane_top2 top;
  std::int32_t i = 0;
  for (; i + key_lanes <= size; i += key_lanes) {
    fk x;
    std::memcpy(&x, v + i, sizeof x);
    const ik b = (ik)(x + 0.0f);  // -0 folded onto +0, then the bits (as key_of)
    const ik ordered = b ^ ((b >> 31) & 0x7fffffff);
    top.offer((__builtin_convertvector(ordered, key_vec) << 32) | (low - i));
  }
  if (i < size) {  // the tail, padded with no_key
    key_vec x = key_vec{} + no_key;
    for (std::int32_t l = 0; i + l < size; ++l) x[l] = key_of(v[i + l], i + l);
    top.offer(x);
  }
  std::int64_t best[2];
  top.result(best);
  ids[0] = index_of(best[0]);
  ids[1] = index_of(best[1]);
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
  make_keys(v, size, allowed, keys);
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
  if (vals != nullptr)
    for (std::int32_t j = 0; j < n; ++j) vals[j] = v[ids[j]];
}

/// @brief The group limit: each of G groups of E / G experts scores the sum (in double, best
///        first) of its group_score_take(cfg) best selection values; the group_topk best groups
///        (ties to the lower group) are allowed. `group_scores` [G], `ids` [E] and `keys`
///        [key_capacity(E)] are scratch; allowed [E] is written.
inline void group_mask(const routing_config& cfg, const float* sel, std::int32_t E, std::int32_t G,
                       float* group_scores, std::int32_t* ids, std::int64_t* keys,
                       std::uint8_t* allowed) {
  const std::int32_t per_group = E / G, take = group_score_take(cfg);
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
