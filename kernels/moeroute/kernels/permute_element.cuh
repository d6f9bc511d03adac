// SPDX-License-Identifier: Apache-2.0
// Element helpers shared by the permute and combine kernels: fp32 / fp16 / bf16 conversions
// (round to nearest even, as moeroute/dtype.hpp on the host) and an aligned vector of V
// elements, so a 16-byte chunk moves with one load or store.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace moeroute::kernels {

template <class T>
inline constexpr bool is_routed_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

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
  const auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return (hidden * static_cast<std::int64_t>(sizeof(T))) % 16 == 0 && aligned(p0) && aligned(p1) && aligned(p2);
}

}  // namespace moeroute::kernels
