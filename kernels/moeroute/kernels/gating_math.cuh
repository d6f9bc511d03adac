// SPDX-License-Identifier: Apache-2.0
// Device scalar formulas of the gating stage (docs/numerics.md, "GPU gating and losses"). Every
// float operation is an explicit _rn intrinsic where the reference rounds each one (never fused
// into an fma). exp is moeroute::exp_fma, the CPU backend's exp (float, fused multiply-adds,
// within 2 ulp of the correctly rounded exp, inlined); log1p (sqrt-softplus only) is evaluated
// in double and rounded once to float, out of line.
#pragma once

#include <cfloat>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/exp_fma.hpp>

namespace moeroute::kernels::gating_math {

/// NaN -> -FLT_MAX, +-Inf -> +-FLT_MAX (the reference's detail::sanitize).
__device__ __forceinline__ float sanitize(float x) {
  if (isnan(x)) return -FLT_MAX;
  return fminf(fmaxf(x, -FLT_MAX), FLT_MAX);
}

/// exp of a float: moeroute::exp_fma (about 20 operations, no double; the CPU backend's bits).
/// Until 2026-12 this was a double exp rounded once, out of line: a call and ~40 instructions,
/// two of them per logit on the training path (the logsumexp's and the softmax's).
__device__ __forceinline__ float exp_f(float x) { return exp_fma(x); }

/// log1pf, rounded once from double.
__device__ __noinline__ inline float log1p_f(float x) {
  return static_cast<float>(log1p(static_cast<double>(x)));
}

/// sqrt(softplus(x)), out of line (its log1p in double is long, and no preset of a model in
/// bench/shapes.hpp takes it).
__device__ __noinline__ inline float sqrt_softplus(float x) {
  const float sp = x > 0.0f ? __fadd_rn(x, log1p_f(exp_f(-x))) : log1p_f(exp_f(x));
  return __fsqrt_rn(sp);
}

/// Per-expert score functions (softmax needs the row and is done by the kernel). The sigmoid
/// inline: 1 / (1 + exp(-x)), the CPU backend's scalar formula.
__device__ __forceinline__ float score_one(score_function f, float x) {
  if (f == score_function::sigmoid) return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f(-x)));
  if (f == score_function::sqrt_softplus) return sqrt_softplus(x);
  return x;
}

}  // namespace moeroute::kernels::gating_math
