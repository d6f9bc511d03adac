// SPDX-License-Identifier: Apache-2.0
// The second gating kernel: adds the per-chunk partial sums of gating_kernel in chunk order
// (so the totals do not depend on which block ran first) into the gating sums: per expert, per
// sequence, and the batch scalars.
#pragma once

#include <cstdint>

#include <moeroute/gating_plan.hpp>
#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/kernels/warp_topk.cuh>
#include <moeroute/macros.hpp>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

/// Blocks of gating_reduce_kernel<Threads> for E experts: one warp per expert, plus one block for
/// the batch scalars and the sequences' token counts.
template <int Threads>
MOEROUTE_HOST_DEVICE constexpr unsigned gating_reduce_blocks(std::int32_t experts) {
  return static_cast<unsigned>((experts + Threads / 32 - 1) / (Threads / 32)) + 1;
}

/// @brief Grid: gating_reduce_blocks<Threads>(E) blocks of Threads (a multiple of 32). Writes
///        every non-null sum of `out` (the sequence sums all or none); never adds to them.
///
/// Parallel over chunks, so its time does not grow with the chunk count (one thread adding
/// 1024 chunks one after another cost ~0.25 us per chunk on an H200). The order of every sum
/// is a function of (segments, pieces) alone: with 32 pieces or more per segment the lanes of
/// a warp split a segment's pieces and a fixed tree joins them; with fewer, each lane owns
/// whole segments. Same inputs, same bits; within rounding of the sequential sum.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    gating_reduce_kernel(const gating_partials part, std::int64_t segments, std::int64_t pieces,
                         std::int32_t experts, const gating_sums out) {
  enter_after_prior_grid();
  static_assert(Threads % 32 == 0, "whole warps");
  constexpr int Warps = Threads / 32;
  const int E = experts;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const bool seq = out.d_seq_score_sum != nullptr;
  const bool wide = pieces >= 32;  // lanes split a segment's pieces, else own whole segments
  const unsigned scalar_block = gating_reduce_blocks<Threads>(E) - 1;
  if (blockIdx.x != scalar_block) {
    const int e = static_cast<int>(blockIdx.x) * Warps + warp;
    if (e >= E) return;  // whole warps
    if (!seq && out.d_aux_score_sum == nullptr && out.d_aux_count == nullptr) return;
    double total = 0.0;
    std::int64_t count = 0;
    if (wide) {
      for (std::int64_t s = 0; s < segments; ++s) {
        double ss = 0.0;
        std::int64_t sc = 0;
        for (std::int64_t p = lane; p < pieces; p += 32) {
          const std::int64_t c = s * pieces + p;
          ss += part.d_scores[c * E + e];
          sc += part.d_counts[c * E + e];
        }
        ss = warp::group_sum<32>(ss);
        sc = warp::group_sum<32>(sc);
        if (seq && lane == 0) {
          out.d_seq_score_sum[s * E + e] = ss;
          out.d_seq_count[s * E + e] = sc;
        }
        total += ss;
        count += sc;
      }
    } else {
      for (std::int64_t s = lane; s < segments; s += 32) {
        double ss = 0.0;
        std::int64_t sc = 0;
        for (std::int64_t p = 0; p < pieces; ++p) {
          const std::int64_t c = s * pieces + p;
          ss += part.d_scores[c * E + e];
          sc += part.d_counts[c * E + e];
        }
        if (seq) {
          out.d_seq_score_sum[s * E + e] = ss;
          out.d_seq_count[s * E + e] = sc;
        }
        total += ss;
        count += sc;
      }
      total = warp::group_sum<32>(total);
      count = warp::group_sum<32>(count);
    }
    if (lane == 0) {
      if (out.d_aux_score_sum != nullptr) out.d_aux_score_sum[e] = total;
      if (out.d_aux_count != nullptr) out.d_aux_count[e] = count;
    }
    return;
  }
  // the scalar block: sequences' token counts, then z / valid / non-finite over all chunks
  if (seq) {
    if (wide) {
      for (std::int64_t s = warp; s < segments; s += Warps) {
        std::int64_t n = 0;
        for (std::int64_t p = lane; p < pieces; p += 32) n += part.d_valid[s * pieces + p];
        n = warp::group_sum<32>(n);
        if (lane == 0) out.d_seq_tokens[s] = n;
      }
    } else {
      for (std::int64_t s = tid; s < segments; s += Threads) {
        std::int64_t n = 0;
        for (std::int64_t p = 0; p < pieces; ++p) n += part.d_valid[s * pieces + p];
        out.d_seq_tokens[s] = n;
      }
    }
  }
  __shared__ double s_z[Warps];
  __shared__ long long s_valid[Warps], s_bad[Warps];
  const std::int64_t chunks = segments * pieces;
  double z = 0.0;
  long long valid = 0, bad = 0;
  for (std::int64_t c = tid; c < chunks; c += Threads) {
    z += part.d_z[c];
    valid += part.d_valid[c];
    bad += part.d_nonfinite[c];
  }
  z = warp::group_sum<32>(z);
  valid = warp::group_sum<32>(valid);
  bad = warp::group_sum<32>(bad);
  if (lane == 0) {
    s_z[warp] = z;
    s_valid[warp] = valid;
    s_bad[warp] = bad;
  }
  __syncthreads();
  if (tid == 0) {
    double zt = 0.0;
    long long vt = 0, bt = 0;
    for (int w = 0; w < Warps; ++w) {
      zt += s_z[w];
      vt += s_valid[w];
      bt += s_bad[w];
    }
    if (out.d_z_sum_squares != nullptr) *out.d_z_sum_squares = zt;
    if (out.d_valid_tokens != nullptr) *out.d_valid_tokens = vt;
    if (out.d_nonfinite != nullptr) *out.d_nonfinite = bt;
  }
}

}  // namespace moeroute::kernels
