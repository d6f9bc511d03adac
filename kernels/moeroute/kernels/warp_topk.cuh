// SPDX-License-Identifier: Apache-2.0
// Warp collectives of the gating kernels: reductions over a group of Width lanes (8, 16 or 32;
// every lane of the warp takes part, so groups of one warp never diverge around a shuffle), the
// layout of a row held in registers, and the top-k of such a row.
//
// Every reduction is a fixed xor butterfly, so each lane of a group ends with the same bits and
// a rerun gives the same bits. Ties in the arg-max (and so in the top-k) go to the lower index.
#pragma once

#include <cstdint>
#include <type_traits>

namespace moeroute::kernels::warp {

inline constexpr unsigned full_mask = 0xffffffffu;

/// Sentinel index of "no candidate": loses against every real (value, index) pair, because a
/// lane without a candidate offers (-inf, no_index) and a real index is always lower.
inline constexpr std::int32_t no_index = 0x7fffffff;

/// @brief Strict order of the top-k: larger value first, then lower index.
__device__ __forceinline__ bool better(float va, std::int32_t ia, float vb, std::int32_t ib) {
  return va > vb || (va == vb && ia < ib);
}

/// Max over the group; T = float or double. (Width 1: v itself.)
template <int Width, class T>
__device__ __forceinline__ T group_max(T v) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(full_mask, v, o, Width));
  return v;
}

/// Sum over the group; T = an integer, float (each add rounded on its own) or double. (Width
/// 1: v itself.)
template <int Width, class T>
__device__ __forceinline__ T group_sum(T v) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) {
    const T other = __shfl_xor_sync(full_mask, v, o, Width);
    if constexpr (std::is_same_v<T, float>) {
      v = __fadd_rn(v, other);
    } else {
      v += other;
    }
  }
  return v;
}

/// @brief A float's bits as an unsigned integer in the float's order (-0 as +0, which compare
///        equal); v is never NaN here.
__device__ __forceinline__ std::uint32_t ordered_bits(float v) {
  const std::uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

/// @brief The float of ordered_bits (a -0 comes back as +0).
__device__ __forceinline__ float from_ordered_bits(std::uint32_t o) {
  return __uint_as_float((o & 0x80000000u) != 0u ? (o & 0x7fffffffu) : ~o);
}

/// @brief Arg-max over the group: on return every lane holds the best (value, index) of the
///        group under `better` (ties to the lower index; a -0 winner is returned as +0).
///        A whole warp on sm_80 and later: two warp reductions (redux.sync), the largest value
///        as ordered bits, then the least index among the lanes holding it — 2 reductions and
///        a few integer operations where the xor butterfly takes 10 shuffles and 5 compares.
///        Groups of 8 or 16 lanes (and older devices): the butterfly.
template <int Width>
__device__ __forceinline__ void group_argmax(float& v, std::int32_t& i) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  if constexpr (Width == 32) {
    const std::uint32_t key = ordered_bits(v);
    const std::uint32_t best = __reduce_max_sync(full_mask, key);
    const std::uint32_t mine =
        key == best ? static_cast<std::uint32_t>(i) : static_cast<std::uint32_t>(no_index);
    i = static_cast<std::int32_t>(__reduce_min_sync(full_mask, mine));
    v = from_ordered_bits(best);
  } else
#endif
  {
#pragma unroll
    for (int o = Width / 2; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(full_mask, v, o, Width);
      const std::int32_t oi = __shfl_xor_sync(full_mask, i, o, Width);
      if (better(ov, oi, v, i)) {
        v = ov;
        i = oi;
      }
    }
  }
}

/// @brief Per-lane bit set over Slots register slots (one word per 32 slots; a plain word up to
///        32 slots, so that a run-time slot number never indexes an array).
template <int Slots, bool OneWord = (Slots <= 32)>
struct slot_mask {
  static constexpr int words = (Slots + 31) / 32;
  std::uint32_t w[words];
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < words; ++i) w[i] = 0u;
  }
  __device__ __forceinline__ bool test(int s) const { return (w[s >> 5] >> (s & 31)) & 1u; }
  __device__ __forceinline__ void set(int s) { w[s >> 5] |= 1u << (s & 31); }
  __device__ __forceinline__ void reset(int s) { w[s >> 5] &= ~(1u << (s & 31)); }
};
template <int Slots>
struct slot_mask<Slots, true> {
  std::uint32_t w;
  __device__ __forceinline__ void clear() { w = 0u; }
  __device__ __forceinline__ bool test(int s) const { return (w >> s) & 1u; }
  __device__ __forceinline__ void set(int s) { w |= 1u << s; }
  __device__ __forceinline__ void reset(int s) { w &= ~(1u << s); }
};

/// @brief arr[slot] for a slot known only at run time: a select chain over registers when the
///        array lives in registers, a plain (local-memory) read when Indexed.
template <int Slots, bool Indexed, class T>
__device__ __forceinline__ T slot_get(const T (&arr)[Slots], int slot) {
  if constexpr (Indexed) {
    return arr[slot];
  } else {
    T v = arr[0];
#pragma unroll
    for (int s = 1; s < Slots; ++s)
      if (s == slot) v = arr[s];
    return v;
  }
}

/// @brief arr[slot] = v for a slot known only at run time (see slot_get).
template <int Slots, bool Indexed, class T>
__device__ __forceinline__ void slot_set(T (&arr)[Slots], int slot, T v) {
  if constexpr (Indexed) {
    arr[slot] = v;
  } else {
#pragma unroll
    for (int s = 0; s < Slots; ++s)
      if (s == slot) arr[s] = v;
  }
}

/// @brief A row of values spread over a group of Lanes threads: lane l holds, in slot s, the
///        element index(l, s) = (s / Vec) * Lanes * Vec + l * Vec + s % Vec (Vec consecutive
///        elements per lane, so a row is read with 16-byte loads). Slots ascend in index.
template <int Lanes, int Vec>
struct register_row {
  static __device__ __forceinline__ int index(int lane, int s) {
    return (s / Vec) * (Lanes * Vec) + lane * Vec + (s % Vec);
  }
  static __device__ __forceinline__ int owner_lane(int i) { return (i / Vec) % Lanes; }
  static __device__ __forceinline__ int owner_slot(int i) {
    return (i / (Lanes * Vec)) * Vec + (i % Vec);
  }
};

/// @brief The top-n of a row held in registers, best first: n rounds of a group arg-max, each
///        round's winner then taken out on the lane that holds it. Only the slots s < ns with
///        eligible(s) take part. On every lane of the group, visit(j, value, index) sees the
///        j-th best (j = 0 .. n-1), in order; with fewer eligible elements than n the rest are
///        (-inf, no_index).
/// @tparam Row     register_row<Lanes, Vec> (index of a slot)
/// @tparam Indexed the row lives in local memory (runtime slot count ns), see slot_get
template <class Row, int Lanes, int Slots, bool Indexed, class Eligible, class Visit>
__device__ __forceinline__ void topk(const float (&v)[Slots], int ns, int n, Eligible&& eligible,
                                     Visit&& visit) {
  [[maybe_unused]] constexpr int Unroll = Indexed ? 1 : Slots;  // read by #pragma unroll
  const int lane = static_cast<int>(threadIdx.x) % Lanes;
  slot_mask<Slots> taken;
  taken.clear();
  // this lane's best remaining candidate: slots ascend in index, so a strict > keeps the lower
  // index among equal values
  float lane_value;
  std::int32_t lane_index;
  int lane_slot;
  const auto lane_best = [&] {
    lane_value = -INFINITY;
    lane_index = no_index;
    lane_slot = -1;
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (Indexed && s >= ns)
        break;  // registers: ns == Slots; a runtime bound here made
                // nvcc keep the row in local memory
      if (!taken.test(s) && eligible(s) && (lane_index == no_index || v[s] > lane_value)) {
        lane_value = v[s];
        lane_index = Row::index(lane, s);
        lane_slot = s;
      }
    }
  };
  lane_best();
  for (int j = 0; j < n; ++j) {
    float best_value = lane_value;
    std::int32_t best_index = lane_index;
    group_argmax<Lanes>(best_value, best_index);
    if (best_index != no_index && best_index == lane_index) {  // this lane held the winner
      taken.set(lane_slot);
      lane_best();
    }
    visit(j, best_value, best_index);
  }
}

/// @brief topk() for a row it may consume: the candidates are the slots s < ns whose value is
///        not -inf (the caller writes -inf over the others first), and each round's winner is
///        overwritten with -inf on the lane that holds it. Same picks, same order, same visits as
///        topk() with eligible(s) = (v[s] != -inf) — valid only where no candidate can be -inf
///        (the sanitised selection values and P: every value in [-FLT_MAX, FLT_MAX]). Cheaper
///        per round: a lane's best is a compare and two selects per slot, with no mask to test.
template <class Row, int Lanes, int Slots, bool Indexed, class Visit>
__device__ __forceinline__ void topk_take(float (&v)[Slots], int ns, int n, Visit&& visit) {
  [[maybe_unused]] constexpr int Unroll = Indexed ? 1 : Slots;  // read by #pragma unroll
  const int lane = static_cast<int>(threadIdx.x) % Lanes;
  float lane_value;
  int lane_slot;
  // slots ascend in index and the compare is strict: the lower index wins among equal values
  const auto lane_best = [&] {
    lane_value = -INFINITY;
    lane_slot = -1;
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (Indexed && s >= ns) break;
      if (v[s] > lane_value) {
        lane_value = v[s];
        lane_slot = s;
      }
    }
  };
  lane_best();
  for (int j = 0; j < n; ++j) {
    const std::int32_t lane_index = lane_slot >= 0 ? Row::index(lane, lane_slot) : no_index;
    float best_value = lane_value;
    std::int32_t best_index = lane_index;
    group_argmax<Lanes>(best_value, best_index);
    if (best_index != no_index && best_index == lane_index) {  // this lane held the winner
      slot_set<Slots, Indexed>(v, lane_slot, -INFINITY);
      lane_best();
    }
    visit(j, best_value, best_index);
  }
}

}  // namespace moeroute::kernels::warp
