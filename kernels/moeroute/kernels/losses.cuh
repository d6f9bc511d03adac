// SPDX-License-Identifier: Apache-2.0
// Loss values from the gating sums: Switch/GShard aux loss, DeepSeek sequence-level aux loss
// and the ST-MoE z-loss (docs/numerics.md, "Losses"; reference/losses.hpp). One block; every
// sum runs in a fixed order in double, with the products and quotients rounded one at a time
// (no fma), so the batch-level values equal the CPU reference's bit for bit given equal sums.
// Sequence level: each sequence's sum in expert order, the sequences' in a fixed order of warps
// (deterministic; within 1e-12 of the reference).
#pragma once

#include <cstdint>

#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

struct loss_kernel_args {
  const_gating_sums sums{};  // the gating's sums; seq_* only when sequences > 0
  std::int64_t sequences = 0;
  bool sequence_sum = false;  // sequence_reduction::sum: no mean over the used sequences
  std::int32_t experts = 0;
  double aux_coefficient = 0.0, aux_scale = 0.0, z_coefficient = 0.0;
  double* aux_loss = nullptr;           // [1] or null
  double* sequence_aux_loss = nullptr;  // [1] or null
  double* z_loss = nullptr;             // [1] or null
};

/// @brief Grid: 1 block of Threads threads (a multiple of 32).
///
/// Each expert's term (count / T) * (score / T) is computed by its own thread into shared
/// memory and thread 0 adds the terms in expert order: the reference's rounding and order, with
/// the global loads in parallel (a single thread loading them one after another cost ~0.2 us
/// per expert on an H200). Sequences: one warp each, its lanes computing the terms, lane 0
/// adding them in expert order; the warps' totals then add in warp order.
template <int Threads>
__global__ void __launch_bounds__(Threads) loss_kernel(const loss_kernel_args a) {
  enter_after_prior_grid();
  static_assert(Threads % 32 == 0, "whole warps");
  constexpr int Warps = Threads / 32;
  __shared__ double s_term[Threads];
  __shared__ double s_total[Warps];
  __shared__ long long s_used[Warps];
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int E = a.experts;
  const std::int64_t n = *a.sums.d_valid_tokens;
  const double T = static_cast<double>(n);
  if (a.aux_loss != nullptr) {
    double s = 0.0;
    for (int e0 = 0; e0 < E && n > 0; e0 += Threads) {  // block-uniform
      const int e = e0 + tid;
      if (e < E)
        s_term[tid] = __dmul_rn(__ddiv_rn(static_cast<double>(a.sums.d_aux_count[e]), T),
                                __ddiv_rn(a.sums.d_aux_score_sum[e], T));
      __syncthreads();
      if (tid == 0) {
        const int m = E - e0 < Threads ? E - e0 : Threads;
        for (int i = 0; i < m; ++i) s = __dadd_rn(s, s_term[i]);
      }
      __syncthreads();
    }
    if (tid == 0)
      *a.aux_loss = n > 0 ? __dmul_rn(__dmul_rn(a.aux_coefficient, a.aux_scale), s) : 0.0;
  }
  if (tid == 0 && a.z_loss != nullptr)
    *a.z_loss = n > 0 && a.z_coefficient != 0.0
                    ? __ddiv_rn(__dmul_rn(a.z_coefficient, *a.sums.d_z_sum_squares), T)
                    : 0.0;
  if (a.sequence_aux_loss == nullptr) return;
  double* w_term = s_term + warp * 32;  // this warp's 32 terms (the aux loop above is done)
  double total = 0.0;
  long long used = 0;
  for (std::int64_t s = warp; s < a.sequences; s += Warps) {
    const std::int64_t ns = a.sums.d_seq_tokens[s];
    if (ns == 0) continue;  // warp-uniform
    const double L = static_cast<double>(ns);
    double acc = 0.0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      if (e < E)
        w_term[lane] = __dmul_rn(__ddiv_rn(static_cast<double>(a.sums.d_seq_count[s * E + e]), L),
                                 __ddiv_rn(a.sums.d_seq_score_sum[s * E + e], L));
      __syncwarp();
      if (lane == 0) {
        const int m = E - e0 < 32 ? E - e0 : 32;
        for (int i = 0; i < m; ++i) acc = __dadd_rn(acc, w_term[i]);
      }
      __syncwarp();
    }
    total = __dadd_rn(total, __dmul_rn(a.aux_scale, acc));  // lane 0's is the one kept
    ++used;
  }
  if (lane == 0) {
    s_total[warp] = total;
    s_used[warp] = used;
  }
  __syncthreads();
  if (tid == 0) {
    double t = 0.0;
    long long u = 0;
    for (int w = 0; w < Warps; ++w) {
      t = __dadd_rn(t, s_total[w]);
      u += s_used[w];
    }
    const double v = __dmul_rn(a.aux_coefficient, t);
    *a.sequence_aux_loss = u == 0 ? 0.0 : a.sequence_sum ? v : __ddiv_rn(v, static_cast<double>(u));
  }
}

}  // namespace moeroute::kernels
