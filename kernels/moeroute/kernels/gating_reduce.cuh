// SPDX-License-Identifier: Apache-2.0
// The second gating kernel: adds the per-chunk partial sums of gating_kernel in chunk order
// (so the totals do not depend on which block ran first) into the gating sums: per expert, per
// sequence, and the batch scalars.
#pragma once

#include <cstdint>

#include <moeroute/gating_plan.hpp>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

/// @brief Grid: ceil(E / Threads) blocks of Threads. Writes every sum of `out` (the sequence
///        sums only when they are non-null; d_nonfinite only when non-null); never adds to them.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    gating_reduce_kernel(const gating_partials part, std::int64_t segments, std::int64_t pieces,
                         std::int32_t experts, const gating_sums out) {
  const int E = experts;
  const int e = static_cast<int>(blockIdx.x) * Threads + static_cast<int>(threadIdx.x);
  const bool seq = out.d_seq_score_sum != nullptr;
  if (e < E) {
    double total = 0.0;
    std::int64_t count = 0;
    for (std::int64_t s = 0; s < segments; ++s) {
      double ss = 0.0;
      std::int64_t sc = 0;
      for (std::int64_t p = 0; p < pieces; ++p) {
        const std::int64_t c = s * pieces + p;
        const double v = part.d_scores[c * E + e];
        const std::int32_t n = part.d_counts[c * E + e];
        ss += v;
        total += v;
        sc += n;
        count += n;
      }
      if (seq) {
        out.d_seq_score_sum[s * E + e] = ss;
        out.d_seq_count[s * E + e] = sc;
      }
    }
    out.d_aux_score_sum[e] = total;
    out.d_aux_count[e] = count;
  }
  if (blockIdx.x != 0) return;
  if (seq) {
    for (std::int64_t s = threadIdx.x; s < segments; s += Threads) {
      std::int64_t n = 0;
      for (std::int64_t p = 0; p < pieces; ++p) n += part.d_valid[s * pieces + p];
      out.d_seq_tokens[s] = n;
    }
  }
  if (threadIdx.x == 0) {
    double z = 0.0;
    std::int64_t valid = 0, bad = 0;
    const std::int64_t chunks = segments * pieces;
    for (std::int64_t c = 0; c < chunks; ++c) {
      z += part.d_z[c];
      valid += part.d_valid[c];
      bad += part.d_nonfinite[c];
    }
    *out.d_z_sum_squares = z;
    *out.d_valid_tokens = valid;
    if (out.d_nonfinite != nullptr) *out.d_nonfinite = bad;
  }
}

}  // namespace moeroute::kernels
