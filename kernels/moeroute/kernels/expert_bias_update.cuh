// SPDX-License-Identifier: Apache-2.0
// The expert-bias update of aux-loss-free balancing (reference::expert_bias_update on the GPU).
#pragma once

#include <cstdint>

#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/kernels/warp_topk.cuh>

namespace moeroute::kernels {

/// Largest E the kernel holds in shared memory (moeroute::max_experts).
inline constexpr int bias_update_max_experts = 8192;

/// bias[e] += rate * sign(mean load - load[e]), then optionally bias -= mean(bias), bitwise as
/// reference::expert_bias_update. One block of Threads threads (a multiple of 32): the loads'
/// total is an integer sum (exact, so any order equals the reference's sequential double sum of
/// counts below 2^53); the per-expert updates run in parallel; the recentring mean adds the
/// biases in expert order in one thread, from shared memory. (A single thread doing all of it,
/// as this kernel began, took ~0.1 us per expert on an H200: serial global loads.)
template <int Threads>
__global__ void __launch_bounds__(Threads)
    expert_bias_update_kernel(float* __restrict__ bias, const std::int64_t* __restrict__ load,
                              std::int32_t experts, float rate, bool recenter) {
  enter_after_prior_grid();
  static_assert(Threads % 32 == 0, "whole warps");
  __shared__ float s_bias[bias_update_max_experts];
  __shared__ long long s_part[Threads / 32];
  __shared__ double s_mean;
  const int tid = static_cast<int>(threadIdx.x);
  long long part = 0;
  for (std::int32_t e = tid; e < experts; e += Threads) part += load[e];
  part = warp::group_sum<32>(part);
  if (tid % 32 == 0) s_part[tid / 32] = part;
  __syncthreads();
  if (tid == 0) {
    long long total = 0;
    for (int w = 0; w < Threads / 32; ++w) total += s_part[w];
    s_mean = static_cast<double>(total) / experts;
  }
  __syncthreads();
  const double mean = s_mean;
  for (std::int32_t e = tid; e < experts; e += Threads) {
    const double off = mean - static_cast<double>(load[e]);
    const float sgn = off > 0.0 ? 1.0f : (off < 0.0 ? -1.0f : 0.0f);
    const float b = __fadd_rn(bias[e], __fmul_rn(rate, sgn));
    if (recenter) {
      s_bias[e] = b;
    } else {
      bias[e] = b;
    }
  }
  if (!recenter) return;  // uniform
  __syncthreads();
  if (tid == 0) {
    double sum = 0.0;
    for (std::int32_t e = 0; e < experts; ++e) sum += s_bias[e];
    s_mean = sum / experts;
  }
  __syncthreads();
  const double mb = s_mean;
  for (std::int32_t e = tid; e < experts; e += Threads)
    bias[e] = static_cast<float>(static_cast<double>(s_bias[e]) - mb);
}

}  // namespace moeroute::kernels
