// SPDX-License-Identifier: Apache-2.0
// Warp building blocks for the gating kernels: reductions over a group of Width lanes (8, 16
// or 32; every lane of the warp takes part, so groups of one warp never diverge around a
// shuffle) and the (value, index) arg-max used k times for a top-k.
//
// Every reduction is a fixed xor butterfly, so each lane of a group ends with the same bits and
// a rerun gives the same bits. Ties in the arg-max go to the lower index.
#pragma once

#include <cstdint>

namespace moeroute::kernels::warp {

inline constexpr unsigned full_mask = 0xffffffffu;

/// Sentinel index of "no candidate": loses against every real (value, index) pair, because
/// real values are finite (>= -FLT_MAX) and the sentinel value is -inf.
inline constexpr std::int32_t no_index = 0x7fffffff;

/// @brief Strict order of the top-k: larger value first, then lower index.
__device__ __forceinline__ bool better(float va, std::int32_t ia, float vb, std::int32_t ib) {
  return va > vb || (va == vb && ia < ib);
}

template <int Width>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(full_mask, v, o, Width));
  return v;
}

template <int Width>
__device__ __forceinline__ double group_sum(double v) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(full_mask, v, o, Width);
  return v;
}

template <int Width>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(full_mask, v, o, Width));
  return v;
}

template <int Width>
__device__ __forceinline__ int group_sum(int v) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(full_mask, v, o, Width);
  return v;
}

/// @brief Arg-max over the group: on return every lane holds the best (value, index) of the
///        group under `better` (ties to the lower index).
template <int Width>
__device__ __forceinline__ void group_argmax(float& v, std::int32_t& i) {
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

/// @brief Per-lane bit set over Slots register slots (one word for up to 32 slots).
template <int Slots>
struct slot_mask {
  static constexpr int words = (Slots + 31) / 32;
  std::uint32_t w[words];
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < words; ++i) w[i] = 0u;
  }
  __device__ __forceinline__ bool test(int s) const { return (w[s >> 5] >> (s & 31)) & 1u; }
  __device__ __forceinline__ void set(int s) { w[s >> 5] |= 1u << (s & 31); }
};

}  // namespace moeroute::kernels::warp
