// SPDX-License-Identifier: Apache-2.0
// Device scalar formulas of the gating stage (docs/numerics.md, "Gating"), written to round
// like the CPU reference: every float operation is an explicit _rn intrinsic (never fused into
// an fma), and exp / log1p are evaluated in double and rounded once to float, which gives the
// correctly rounded result. glibc's expf / log1pf (what the reference calls) are not always
// correctly rounded: they differ from it in the last bit for ~0.06% / ~1% of arguments
// (docs/numerics.md, "GPU gating and losses").
#pragma once

#include <cfloat>
#include <cstdint>

#include <moeroute/config.hpp>

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

}  // namespace moeroute::kernels::gating_math
