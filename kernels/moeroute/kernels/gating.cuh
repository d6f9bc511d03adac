// SPDX-License-Identifier: Apache-2.0
// Fused gating: router logits [T, E] -> top-k ids and gates, reroute candidates, logsumexp and
// per-chunk partial sums of the aux-loss inputs, in one pass; then a fixed-order reduction of
// those partials. Semantics: reference::gate (include/moeroute/reference/gating.hpp).
//
// Work split. The token axis is cut into chunks (gating_plan, a pure host function); block c
// owns chunk c. Inside a block each group of Lanes threads (a warp, or 1/2 or 1/4 of one for
// E <= 16) routes one token at a time with the row in registers: lane l holds the experts
//   e(l, s) = (s / Vec) * Lanes * Vec + l * Vec + s % Vec,   s in [0, Slots)
// (Vec consecutive experts per lane, so a row is read with 16-byte loads when aligned). The
// top-k is k + R rounds of a group arg-max, ties to the lower expert index.
//
// Determinism. No float atomics anywhere: each group accumulates its tokens' P into its own row
// of shared memory (owner lane per expert), the rows are added in group order, and the chunk
// partials are added in chunk order by gating_reduce_kernel. Counts use integer atomics only.
#pragma once

#include <cfloat>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/cuda/gating_workspace.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/kernels/gating_math.cuh>
#include <moeroute/kernels/warp_topk.cuh>
#include <moeroute/rng.hpp>

namespace moeroute::kernels {

/// Everything the gating kernel reads, flattened from routing_config and the launch params.
struct gating_kernel_args {
  const void* logits = nullptr;           // [T, E] In
  const float* bias = nullptr;            // [E] or null
  const std::uint8_t* valid = nullptr;    // [T] or null (all valid)
  std::int32_t* ids = nullptr;            // [T, k]
  float* gates = nullptr;                 // [T, k]
  std::int32_t* reroute_ids = nullptr;    // [T, R]
  float* logsumexp = nullptr;             // [T]
  double* part_scores = nullptr;          // [chunks, E]
  std::int32_t* part_counts = nullptr;    // [chunks, E]
  double* part_z = nullptr;               // [chunks]
  std::int64_t* part_valid = nullptr;     // [chunks]
  std::int64_t* part_nonfinite = nullptr; // [chunks]

  std::int64_t tokens = 0;
  std::int32_t experts = 0, k = 0, reroute = 0;
  std::int32_t slots = 0;  // slots a lane actually uses (the generic kernel; <= Slots)

  score_function score = score_function::softmax;
  bool select_scores = false;
  bool softmax_after = false;
  renormalize renorm = renormalize::none;
  float renorm_epsilon = 0.0f;
  float scaling = 1.0f;

  std::int32_t groups = 1, group_topk = 1, per_group = 0, group_take = 0;

  bool noise = false;
  bool gaussian = true;
  bool noisy_gates = false;
  float noise_scale = 0.0f;
  std::uint64_t noise_seed = 0, noise_offset = 0;

  std::int32_t counted = 1;  // assignments counted per token (1 or k)
  bool fresh_counts = false;

  std::int64_t segment_tokens = 0, pieces = 1, piece_tokens = 0;
  bool vector_loads = false;
};

namespace gating_detail {

template <int Lanes, int Vec>
__device__ __forceinline__ int expert_of(int lane, int s) {
  return (s / Vec) * (Lanes * Vec) + lane * Vec + (s % Vec);
}
template <int Lanes, int Vec>
__device__ __forceinline__ int owner_lane(int e) {
  return (e / Vec) % Lanes;
}
template <int Lanes, int Vec>
__device__ __forceinline__ int owner_slot(int e) {
  return (e / (Lanes * Vec)) * Vec + (e % Vec);
}

/// arr[slot] for a slot index known only at run time: a select chain over registers for the
/// register kernels, a plain local-memory read for the generic one.
template <int Slots, bool Generic, class T>
__device__ __forceinline__ T pick(const T (&arr)[Slots], int slot) {
  if constexpr (Generic) {
    return arr[slot];
  } else {
    T v = arr[0];
#pragma unroll
    for (int s = 1; s < Slots; ++s)
      if (s == slot) v = arr[s];
    return v;
  }
}
template <int Slots, bool Generic, class T>
__device__ __forceinline__ void put(T (&arr)[Slots], int slot, T v) {
  if constexpr (Generic) {
    arr[slot] = v;
  } else {
#pragma unroll
    for (int s = 0; s < Slots; ++s)
      if (s == slot) arr[s] = v;
  }
}

}  // namespace gating_detail

/// @brief The fused gating kernel. Grid: one block per chunk; Warps * 32 threads.
/// Dynamic shared memory: Groups*E doubles (unless Generic) + Groups doubles + E ints, where
/// Groups = Warps * 32 / Lanes.
template <class In, int Lanes, int Slots, int Warps, bool Generic>
__global__ void __launch_bounds__(Warps * 32)
gating_kernel(const gating_kernel_args a) {
  using namespace gating_detail;
  namespace gm = gating_math;
  constexpr int Vec = (Slots * sizeof(In) >= 16) ? gm::vec16<In> : 1;
  constexpr int Subs = 32 / Lanes;
  constexpr int Groups = Warps * Subs;
  constexpr int Unroll = Generic ? 1 : Slots;

  const int E = a.experts;
  const int ns = Generic ? a.slots : Slots;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % Lanes;
  const int grp = tid / Lanes;  // token group inside the block

  extern __shared__ double smem[];
  double* s_acc = smem;                                // [Groups, E] (register kernels)
  double* s_z = smem + (Generic ? 0 : Groups * E);     // [Groups]
  int* s_counts = reinterpret_cast<int*>(s_z + Groups);  // [E]
  __shared__ unsigned long long s_valid, s_nonfinite;

  const std::int64_t c = blockIdx.x;
  std::int64_t begin, end;
  cuda::gating_chunk_range(a.segment_tokens, a.pieces, a.piece_tokens, c, begin, end);

  double* g_acc = a.part_scores + c * E;  // the generic kernel accumulates here (lane-owned)
  if constexpr (!Generic) {
    for (int i = tid; i < Groups * E; i += Warps * 32) s_acc[i] = 0.0;
  } else {
    for (int i = tid; i < E; i += Warps * 32) g_acc[i] = 0.0;
  }
  for (int i = tid; i < E; i += Warps * 32) s_counts[i] = 0;
  if (tid < Groups) s_z[tid] = 0.0;
  if (tid == 0) {
    s_valid = 0;
    s_nonfinite = 0;
  }
  __syncthreads();

  const In* logits = static_cast<const In*>(a.logits);
  const bool softmax = a.score == score_function::softmax;

  float x[Slots];     // clean, sanitised logits
  float sel[Slots];   // selection values; after the top-k: the aux P
  float gsrc[Slots];  // gate scores (or the gate logits for softmax after top-k)
  float rv[Slots];    // rank j at lane j % Lanes, slot j / Lanes: gate; first: group scores
  int ri[Slots];      // rank j: expert id; first: chosen-group flags
  warp::slot_mask<Slots> taken, gtaken, allowed;
  double z_acc = 0.0;

  // softmax over the in-range slots of v, in place (max-subtracted, sum in double)
  auto softmax_slots = [&](float (&v)[Slots]) {
    float m = -FLT_MAX;
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (s >= ns) break;
      if (expert_of<Lanes, Vec>(lane, s) < E) m = fmaxf(m, v[s]);
    }
    m = warp::group_max<Lanes>(m);
    double sum = 0.0;
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (s >= ns) break;
      if (expert_of<Lanes, Vec>(lane, s) < E) {
        v[s] = gm::exp_f(__fsub_rn(v[s], m));
        sum += static_cast<double>(v[s]);
      } else {
        v[s] = 0.0f;
      }
    }
    sum = warp::group_sum<Lanes>(sum);
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (s >= ns) break;
      v[s] = static_cast<float>(static_cast<double>(v[s]) / sum);
    }
  };
  auto scores_slots = [&](float (&v)[Slots]) {
    if (softmax) {
      softmax_slots(v);
    } else {
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        v[s] = gm::score_one(a.score, v[s]);
      }
    }
  };
  // best not-taken, allowed (value, expert) of this lane; slots ascend in expert index
  auto lane_best = [&](const float (&v)[Slots], const warp::slot_mask<Slots>& tk,
                       const warp::slot_mask<Slots>& ok, float& bv, int& bi) {
    bv = -INFINITY;
    bi = warp::no_index;
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (s >= ns) break;
      if (ok.test(s) && !tk.test(s) && (bi == warp::no_index || v[s] > bv)) {
        bv = v[s];
        bi = expert_of<Lanes, Vec>(lane, s);
      }
    }
  };

  for (std::int64_t base = begin; base < end; base += Groups) {  // block-uniform trip count
    const std::int64_t t_raw = base + grp;
    const bool active = t_raw < end;
    const std::int64_t t = active ? t_raw : begin;  // idle groups recompute a real row
    const In* row = logits + t * E;

    // 1. load, sanitise, logsumexp of the clean logits
    int nonfinite = 0;
#pragma unroll Unroll
    for (int s0 = 0; s0 < Slots; s0 += Vec) {
      if (s0 >= ns) break;
      const int e0 = expert_of<Lanes, Vec>(lane, s0);
      float raw[Vec];
      if (Vec > 1 && a.vector_loads && e0 + Vec <= E) {
        gm::load_vec<In, Vec>(row + e0, raw);
      } else {
#pragma unroll
        for (int i = 0; i < Vec; ++i) raw[i] = e0 + i < E ? gm::load_one(row + e0 + i) : -FLT_MAX;
      }
#pragma unroll
      for (int i = 0; i < Vec; ++i) {
        if (e0 + i < E && !isfinite(raw[i])) ++nonfinite;
        x[s0 + i] = gm::sanitize(raw[i]);
      }
    }
    float m = -FLT_MAX;
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (s >= ns) break;
      m = fmaxf(m, x[s]);  // out-of-range slots hold -FLT_MAX
    }
    m = warp::group_max<Lanes>(m);
    double se = 0.0;
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (s >= ns) break;
      if (expert_of<Lanes, Vec>(lane, s) < E)
        se += exp(static_cast<double>(x[s]) - static_cast<double>(m));
    }
    se = warp::group_sum<Lanes>(se);
    const float lse = static_cast<float>(static_cast<double>(m) + log(se));
    nonfinite = warp::group_sum<Lanes>(nonfinite);

    // 2. noise (Philox per (token, expert)); sel starts as the noisy logits
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (s >= ns) break;
      sel[s] = x[s];
      const int e = expert_of<Lanes, Vec>(lane, s);
      if (a.noise && e < E) {
        const auto r = rng::draw(a.noise_seed, a.noise_offset, rng::stream_gating_noise,
                                 static_cast<std::uint64_t>(t) * static_cast<std::uint64_t>(E) +
                                     static_cast<std::uint64_t>(e));
        const float z = a.gaussian ? rng::normal(r.v[0], r.v[1]) : rng::gumbel(r.v[0]);
        sel[s] = gm::sanitize(__fadd_rn(x[s], __fmul_rn(a.noise_scale, z)));
      }
      gsrc[s] = a.noisy_gates ? sel[s] : x[s];
    }

    // 3. gate scores and selection values (+ bias)
    if (!a.softmax_after) scores_slots(gsrc);
    if (a.select_scores) {
      if (a.noise && !a.noisy_gates) {
        scores_slots(sel);
      } else {
#pragma unroll Unroll
        for (int s = 0; s < Slots; ++s) {
          if (s >= ns) break;
          sel[s] = gsrc[s];
        }
      }
    }
    allowed.clear();
    taken.clear();
    gtaken.clear();
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (s >= ns) break;
      const int e = expert_of<Lanes, Vec>(lane, s);
      if (e < E) {
        if (a.bias != nullptr) sel[s] = gm::sanitize(__fadd_rn(sel[s], __ldg(a.bias + e)));
        if (a.groups <= 1) allowed.set(s);
      }
    }

    // 4. group limit: group score = sum (double, descending) of its top group_take values
    if (a.groups > 1) {
      for (int g = 0; g < a.groups; ++g) {
        double gsum = 0.0;
        for (int r = 0; r < a.group_take; ++r) {
          float bv = -INFINITY;
          int bi = warp::no_index;
#pragma unroll Unroll
          for (int s = 0; s < Slots; ++s) {
            if (s >= ns) break;
            const int e = expert_of<Lanes, Vec>(lane, s);
            if (e < E && e / a.per_group == g && !gtaken.test(s) && (bi == warp::no_index || sel[s] > bv)) {
              bv = sel[s];
              bi = e;
            }
          }
          warp::group_argmax<Lanes>(bv, bi);
          gsum += static_cast<double>(bv);
          if (owner_lane<Lanes, Vec>(bi) == lane) gtaken.set(owner_slot<Lanes, Vec>(bi));
        }
        if (g % Lanes == lane) put<Slots, Generic>(rv, g / Lanes, static_cast<float>(gsum));
      }
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        ri[s] = 0;
      }
      for (int q = 0; q < a.group_topk; ++q) {
        float bv = -INFINITY;
        int bi = warp::no_index;
#pragma unroll Unroll
        for (int s = 0; s < Slots; ++s) {
          if (s >= ns) break;
          const int g = s * Lanes + lane;
          // group scores may be +-inf (a double sum beyond the float range): test the index
          if (g < a.groups && ri[s] == 0 && (bi == warp::no_index || rv[s] > bv)) {
            bv = rv[s];
            bi = g;
          }
        }
        warp::group_argmax<Lanes>(bv, bi);
        if (bi % Lanes == lane) put<Slots, Generic>(ri, bi / Lanes, 1);
#pragma unroll Unroll
        for (int s = 0; s < Slots; ++s) {
          if (s >= ns) break;
          const int e = expert_of<Lanes, Vec>(lane, s);
          if (e < E && e / a.per_group == bi) allowed.set(s);
        }
      }
    }

    // 5. top-(k + R), best first; gather each winner's gate value from its owner lane
    float lbv;
    int lbi;
    lane_best(sel, taken, allowed, lbv, lbi);
    float gate_sum = 0.0f;   // in rank order, as the reference
    float chosen_max = -FLT_MAX;
    const int n_rank = a.k + a.reroute;
    for (int j = 0; j < n_rank; ++j) {
      float bv = lbv;
      int bi = lbi;
      warp::group_argmax<Lanes>(bv, bi);
      const int owner = owner_lane<Lanes, Vec>(bi), oslot = owner_slot<Lanes, Vec>(bi);
      const float mine = pick<Slots, Generic>(gsrc, oslot);
      const float gv = __shfl_sync(warp::full_mask, mine, owner, Lanes);
      if (owner == lane) {
        taken.set(oslot);
        lane_best(sel, taken, allowed, lbv, lbi);
      }
      if (j < a.k) {
        if (j % Lanes == lane) {
          put<Slots, Generic>(ri, j / Lanes, bi);
          put<Slots, Generic>(rv, j / Lanes, gv);
        }
        gate_sum = __fadd_rn(gate_sum, gv);
        chosen_max = fmaxf(chosen_max, gv);
      } else if (active && lane == 0) {
        a.reroute_ids[t * a.reroute + (j - a.k)] = bi;
      }
    }

    // 6. gates
    if (a.softmax_after) {
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        if (s * Lanes + lane < a.k) rv[s] = gm::exp_f(__fsub_rn(rv[s], chosen_max));
      }
      double sum = 0.0;  // rank order, as the reference's softmax_row
      for (int s = 0; s < ns && s * Lanes < a.k; ++s) {
        const float mine = pick<Slots, Generic>(rv, s);
        for (int l = 0; l < Lanes && s * Lanes + l < a.k; ++l)
          sum += static_cast<double>(__shfl_sync(warp::full_mask, mine, l, Lanes));
      }
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        if (s * Lanes + lane < a.k) rv[s] = static_cast<float>(static_cast<double>(rv[s]) / sum);
      }
    } else if (a.renorm == renormalize::before_drop) {
      const float denom = __fadd_rn(gate_sum, a.renorm_epsilon);
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        rv[s] = denom > 0.0f ? __fdiv_rn(rv[s], denom) : 0.0f;
      }
    }
    if (a.renorm != renormalize::after_drop) {
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        rv[s] = __fmul_rn(rv[s], a.scaling);
      }
    }
    if (active) {
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        const int j = s * Lanes + lane;
        if (j < a.k) {
          a.ids[t * a.k + j] = ri[s];
          a.gates[t * a.k + j] = rv[s];
        }
      }
      if (lane == 0) a.logsumexp[t] = lse;
    }

    // 7. aux-loss inputs: P = softmax of the clean logits, or normalised clean scores
    const bool counts_here = active && (a.valid == nullptr || a.valid[t] != 0);
    const bool gsrc_is_clean_scores = !a.noisy_gates && !a.softmax_after;
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (s >= ns) break;
      sel[s] = gsrc_is_clean_scores ? gsrc[s] : x[s];
    }
    if (softmax) {
      if (!gsrc_is_clean_scores) softmax_slots(sel);
    } else {
      float ssum = 0.0f;
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        if (!gsrc_is_clean_scores) sel[s] = gm::score_one(a.score, sel[s]);
        if (expert_of<Lanes, Vec>(lane, s) < E) ssum = __fadd_rn(ssum, sel[s]);
      }
      const float denom = __fadd_rn(warp::group_sum<Lanes>(ssum), 1e-20f);
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        sel[s] = __fdiv_rn(sel[s], denom);
      }
    }
    if (counts_here) {
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        const int e = expert_of<Lanes, Vec>(lane, s);
        if (e < E) {
          if constexpr (Generic) {
            g_acc[e] += static_cast<double>(sel[s]);
          } else {
            s_acc[grp * E + e] += static_cast<double>(sel[s]);
          }
        }
      }
      if (lane == 0) {
        z_acc += static_cast<double>(lse) * static_cast<double>(lse);
        atomicAdd(&s_valid, 1ull);
      }
    }
    if (active && lane == 0 && nonfinite) atomicAdd(&s_nonfinite, static_cast<unsigned long long>(nonfinite));
    if (a.fresh_counts) {
      // a fresh top-(counted) on P over all experts, no bias, no group limit
      warp::slot_mask<Slots> ftaken, all;
      ftaken.clear();
      all.clear();
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        if (expert_of<Lanes, Vec>(lane, s) < E) all.set(s);
      }
      lane_best(sel, ftaken, all, lbv, lbi);
      for (int j = 0; j < a.counted; ++j) {
        float bv = lbv;
        int bi = lbi;
        warp::group_argmax<Lanes>(bv, bi);
        if (owner_lane<Lanes, Vec>(bi) == lane) {
          ftaken.set(owner_slot<Lanes, Vec>(bi));
          lane_best(sel, ftaken, all, lbv, lbi);
        }
        if (counts_here && lane == 0) atomicAdd(&s_counts[bi], 1);
      }
    } else if (counts_here) {
#pragma unroll Unroll
      for (int s = 0; s < Slots; ++s) {
        if (s >= ns) break;
        if (s * Lanes + lane < a.counted) atomicAdd(&s_counts[ri[s]], 1);
      }
    }
  }

  // chunk partials, each summed in a fixed order
  if (lane == 0) s_z[grp] = z_acc;
  __syncthreads();
  for (int e = tid; e < E; e += Warps * 32) {
    if constexpr (!Generic) {
      double v = 0.0;
      for (int g = 0; g < Groups; ++g) v += s_acc[g * E + e];
      a.part_scores[c * E + e] = v;
    }
    a.part_counts[c * E + e] = s_counts[e];
  }
  if (tid == 0) {
    double z = 0.0;
    for (int g = 0; g < Groups; ++g) z += s_z[g];
    a.part_z[c] = z;
    a.part_valid[c] = static_cast<std::int64_t>(s_valid);
    a.part_nonfinite[c] = static_cast<std::int64_t>(s_nonfinite);
  }
}

/// @brief Bytes of dynamic shared memory gating_kernel<..., Lanes, Slots, Warps, Generic> uses.
inline std::size_t gating_kernel_smem(int lanes, int warps, bool generic, int experts) {
  const std::size_t groups = static_cast<std::size_t>(warps) * (32 / lanes);
  const std::size_t e = static_cast<std::size_t>(experts);
  return (generic ? 0 : groups * e * sizeof(double)) + groups * sizeof(double) + e * sizeof(int);
}

/// Outputs of gating_reduce_kernel (all written, never added to).
struct gating_reduce_args {
  const double* part_scores = nullptr;          // [chunks, E]
  const std::int32_t* part_counts = nullptr;    // [chunks, E]
  const double* part_z = nullptr;               // [chunks]
  const std::int64_t* part_valid = nullptr;     // [chunks]
  const std::int64_t* part_nonfinite = nullptr; // [chunks]
  std::int64_t segments = 1, pieces = 1;
  std::int32_t experts = 0;
  double* aux_score_sum = nullptr;      // [E]
  std::int64_t* aux_count = nullptr;    // [E]
  double* z_sum = nullptr;              // [1]
  std::int64_t* valid_tokens = nullptr; // [1]
  std::int64_t* nonfinite = nullptr;    // [1] or null
  double* seq_score_sum = nullptr;      // [S, E] or null
  std::int64_t* seq_count = nullptr;    // [S, E] or null
  std::int64_t* seq_tokens = nullptr;   // [S] or null
};

/// @brief Adds the chunk partials in chunk order. Grid: ceil(E / Threads) blocks.
template <int Threads>
__global__ void __launch_bounds__(Threads) gating_reduce_kernel(const gating_reduce_args a) {
  const int E = a.experts;
  const int e = static_cast<int>(blockIdx.x) * Threads + static_cast<int>(threadIdx.x);
  const bool seq = a.seq_score_sum != nullptr;
  if (e < E) {
    double total = 0.0;
    std::int64_t count = 0;
    for (std::int64_t s = 0; s < a.segments; ++s) {
      double ss = 0.0;
      std::int64_t sc = 0;
      for (std::int64_t p = 0; p < a.pieces; ++p) {
        const std::int64_t c = s * a.pieces + p;
        const double v = a.part_scores[c * E + e];
        const std::int32_t n = a.part_counts[c * E + e];
        ss += v;
        total += v;
        sc += n;
        count += n;
      }
      if (seq) {
        a.seq_score_sum[s * E + e] = ss;
        a.seq_count[s * E + e] = sc;
      }
    }
    a.aux_score_sum[e] = total;
    a.aux_count[e] = count;
  }
  if (blockIdx.x == 0) {
    if (seq) {
      for (std::int64_t s = threadIdx.x; s < a.segments; s += Threads) {
        std::int64_t n = 0;
        for (std::int64_t p = 0; p < a.pieces; ++p) n += a.part_valid[s * a.pieces + p];
        a.seq_tokens[s] = n;
      }
    }
    if (threadIdx.x == 0) {
      double z = 0.0;
      std::int64_t valid = 0, bad = 0;
      const std::int64_t chunks = a.segments * a.pieces;
      for (std::int64_t c = 0; c < chunks; ++c) {
        z += a.part_z[c];
        valid += a.part_valid[c];
        bad += a.part_nonfinite[c];
      }
      *a.z_sum = z;
      *a.valid_tokens = valid;
      if (a.nonfinite != nullptr) *a.nonfinite = bad;
    }
  }
}

}  // namespace moeroute::kernels
