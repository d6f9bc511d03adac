// SPDX-License-Identifier: Apache-2.0
// Loss values from the gating sums: Switch/GShard aux loss, DeepSeek sequence-level aux loss
// and the ST-MoE z-loss (docs/numerics.md, "Losses"; reference/losses.hpp). One block; every
// sum runs in a fixed order in double, with the products and quotients rounded one at a time
// (no fma), so the batch-level values equal the CPU reference's bit for bit given equal sums.
#pragma once

#include <cstdint>

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

/// @brief Grid: 1 block of Threads threads.
template <int Threads>
__global__ void __launch_bounds__(Threads) loss_kernel(const loss_kernel_args a) {
  __shared__ double s_total[Threads];
  __shared__ long long s_used[Threads];
  const int tid = static_cast<int>(threadIdx.x);
  const int E = a.experts;
  if (tid == 0) {
    const std::int64_t n = *a.sums.d_valid_tokens;
    const double T = static_cast<double>(n);
    if (a.aux_loss != nullptr) {
      double s = 0.0;
      if (n > 0)
        for (int e = 0; e < E; ++e)
          s = __dadd_rn(s, __dmul_rn(__ddiv_rn(static_cast<double>(a.sums.d_aux_count[e]), T),
                                     __ddiv_rn(a.sums.d_aux_score_sum[e], T)));
      *a.aux_loss = n > 0 ? __dmul_rn(__dmul_rn(a.aux_coefficient, a.aux_scale), s) : 0.0;
    }
    if (a.z_loss != nullptr)
      *a.z_loss = n > 0 ? __ddiv_rn(__dmul_rn(a.z_coefficient, *a.sums.d_z_sum_squares), T) : 0.0;
  }
  if (a.sequence_aux_loss == nullptr) return;
  // each thread: its sequences in order; then a fixed tree over the threads
  double total = 0.0;
  long long used = 0;
  if (a.sequences > 0) {
    for (std::int64_t s = tid; s < a.sequences; s += Threads) {
      const std::int64_t n = a.sums.d_seq_tokens[s];
      if (n == 0) continue;
      const double L = static_cast<double>(n);
      double acc = 0.0;
      for (int e = 0; e < E; ++e)
        acc = __dadd_rn(acc,
                        __dmul_rn(__ddiv_rn(static_cast<double>(a.sums.d_seq_count[s * E + e]), L),
                                  __ddiv_rn(a.sums.d_seq_score_sum[s * E + e], L)));
      total = __dadd_rn(total, __dmul_rn(a.aux_scale, acc));
      ++used;
    }
  }
  s_total[tid] = total;
  s_used[tid] = used;
  __syncthreads();
  for (int o = Threads / 2; o > 0; o >>= 1) {
    if (tid < o) {
      s_total[tid] = __dadd_rn(s_total[tid], s_total[tid + o]);
      s_used[tid] += s_used[tid + o];
    }
    __syncthreads();
  }
  if (tid == 0) {
    const double v = __dmul_rn(a.aux_coefficient, s_total[0]);
    *a.sequence_aux_loss = s_used[0] == 0   ? 0.0
                           : a.sequence_sum ? v
                                            : __ddiv_rn(v, static_cast<double>(s_used[0]));
  }
}

}  // namespace moeroute::kernels
