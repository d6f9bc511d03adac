// SPDX-License-Identifier: Apache-2.0
// The element types of the CUDA backend (float, __half, __nv_bfloat16) and what every kernel
// does with them: exact conversion to float, round-to-nearest-even conversion back (as
// moeroute/dtype.hpp does on the host), read-only loads, and an aligned vector of V elements
// so that a 16-byte chunk moves with one load or store.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <moeroute/dtype.hpp>

namespace moeroute::kernels {

template <class T>
inline constexpr bool is_routed_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

/// The device element type with the bits of a host storage type: the CPU reference reads and
/// writes fp16 / bf16 as moeroute::half_bits / bf16_bits (moeroute/dtype.hpp), the same bits
/// as __half / __nv_bfloat16, so one buffer serves both.
template <class T>
using device_element_t =
    std::conditional_t<std::is_same_v<T, half_bits>, __half,
                       std::conditional_t<std::is_same_v<T, bf16_bits>, __nv_bfloat16, T>>;

/// The host storage type with the bits of a device element type (device_element_t inverted).
template <class T>
using host_element_t =
    std::conditional_t<std::is_same_v<T, __half>, half_bits,
                       std::conditional_t<std::is_same_v<T, __nv_bfloat16>, bf16_bits, T>>;

template <class T>
__device__ inline float element_to_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

template <class T>
__device__ inline T element_from_float(float f) {
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(f);
  } else {
    return __float2bfloat16_rn(f);
  }
}

template <class T>
__device__ inline T element_zero() {
  return element_from_float<T>(0.0f);
}

/// @brief One element through the read-only cache, as float.
template <class T>
__device__ __forceinline__ float load_element(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return __ldg(p);
  } else {
    return element_to_float(__ldg(p));
  }
}

/// @brief Loads V consecutive elements at p as float: one 16-byte load when
///        V * sizeof(T) == 16 (p must then be 16-byte aligned), element loads otherwise.
template <class T, int V>
__device__ __forceinline__ void load_elements(const T* p, float (&out)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(w[i]);
    } else if constexpr (std::is_same_v<T, __half>) {
#pragma unroll
      for (int i = 0; i < V; ++i)
        out[i] =
            __half2float(__ushort_as_half(static_cast<unsigned short>(w[i / 2] >> (16 * (i % 2)))));
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) out[i] = __uint_as_float((w[i / 2] >> (16 * (i % 2))) << 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = load_element(p + i);
  }
}

/// V elements moved as one access (16 bytes when V = 16 / sizeof(T)).
template <class T, int V>
struct alignas(sizeof(T) * V) element_vec {
  T v[V];
};

/// Elements per 16-byte access.
template <class T>
inline constexpr int vec16_elems = static_cast<int>(16 / sizeof(T));

/// True when rows of `hidden` elements of T can be accessed 16 bytes at a time from every
/// pointer given (row starts stay 16-byte aligned).
template <class T>
inline bool can_vectorize(std::int64_t hidden, const void* p0, const void* p1 = nullptr,
                          const void* p2 = nullptr) {
  const auto aligned = [](const void* p) {
    return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  };
  return (hidden * static_cast<std::int64_t>(sizeof(T))) % 16 == 0 && aligned(p0) && aligned(p1) &&
         aligned(p2);
}

}  // namespace moeroute::kernels
