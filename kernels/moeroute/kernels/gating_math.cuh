// SPDX-License-Identifier: Apache-2.0
// Device scalar formulas of the gating stage (docs/numerics.md, "Gating"), written to round
// like the CPU reference: every float operation is an explicit _rn intrinsic (never fused into
// an fma), and exp / log1p are evaluated in double and rounded once to float, which gives the
// correctly rounded result. glibc's expf / log1pf (what the reference calls) are not always
// correctly rounded: they differ from it in the last bit for ~0.06% / ~1% of arguments
// (docs/numerics.md, "GPU gating and losses"). Inputs are read as f32, f16 or bf16 and
// converted exactly to float.
#pragma once

#include <cfloat>
#include <cstdint>

#include <cuda_fp16.h>

#include <moeroute/config.hpp>
#include <moeroute/dtype.hpp>

namespace moeroute::kernels::gating_math {

/// NaN -> -FLT_MAX, +-Inf -> +-FLT_MAX (the reference's detail::sanitize).
__device__ __forceinline__ float sanitize(float x) {
  if (isnan(x)) return -FLT_MAX;
  return fminf(fmaxf(x, -FLT_MAX), FLT_MAX);
}

/// expf, rounded once from double.
__device__ __noinline__ inline float exp_f(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}

/// log1pf, rounded once from double.
__device__ __noinline__ inline float log1p_f(float x) {
  return static_cast<float>(log1p(static_cast<double>(x)));
}

/// Per-expert score functions (softmax needs the row and is done by the kernel).
__device__ __noinline__ inline float score_one(score_function f, float x) {
  if (f == score_function::sigmoid) return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f(-x)));
  if (f == score_function::sqrt_softplus) {
    const float sp = x > 0.0f ? __fadd_rn(x, log1p_f(exp_f(-x))) : log1p_f(exp_f(x));
    return __fsqrt_rn(sp);
  }
  return x;
}

// ---------------------------------------------------------------------------------------------
// Loads: element type -> float, exactly.

__device__ __forceinline__ float to_float_dev(float x) { return x; }
__device__ __forceinline__ float to_float_dev(half_bits x) {
  return __half2float(__ushort_as_half(x.bits));
}
__device__ __forceinline__ float to_float_dev(bf16_bits x) {
  return __uint_as_float(static_cast<std::uint32_t>(x.bits) << 16);
}

__device__ __forceinline__ float load_one(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load_one(const half_bits* p) {
  return to_float_dev(half_bits{__ldg(reinterpret_cast<const unsigned short*>(p))});
}
__device__ __forceinline__ float load_one(const bf16_bits* p) {
  return to_float_dev(bf16_bits{__ldg(reinterpret_cast<const unsigned short*>(p))});
}

/// Elements per 16-byte vector load for element type In.
template <class In>
inline constexpr int vec16 = static_cast<int>(16 / sizeof(In));

/// @brief Loads Vec consecutive elements at p (16-byte aligned when Vec * sizeof(In) == 16).
template <class In, int Vec>
__device__ __forceinline__ void load_vec(const In* p, float (&out)[Vec]) {
  if constexpr (Vec * sizeof(In) == 16) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
    if constexpr (sizeof(In) == 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(w[i]);
    } else {
#pragma unroll
      for (int i = 0; i < Vec; ++i) {
        const auto bits = static_cast<unsigned short>((w[i / 2] >> (16 * (i % 2))) & 0xffffu);
        out[i] = to_float_dev(In{bits});
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < Vec; ++i) out[i] = load_one(p + i);
  }
}

}  // namespace moeroute::kernels::gating_math
