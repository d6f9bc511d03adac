// SPDX-License-Identifier: Apache-2.0
// The fused gating kernel: router logits [T, E] -> top-k ids and gates, reroute candidates,
// logsumexp (when asked for) and per-chunk partial sums of the aux-loss inputs, in one pass.
// Semantics: reference::gating (include/moeroute/reference/gating.hpp); the per-token arithmetic is
// gating_agent.cuh, the fixed-order reduction of the partials gating_reduce.cuh.
//
// Work split. The token axis is cut into chunks (moeroute/gating_plan.hpp); block c owns chunk
// c. Inside a block each group of Lanes threads (a warp, or 1/2 or 1/4 of one for E <= 16)
// routes one token at a time with the row in registers.
//
// Determinism. No float atomics: each group accumulates its tokens' P into its own row of shared
// memory (one owner lane per expert), the rows are added in group order, and the chunk partials
// are added in a fixed order by gating_reduce_kernel. Counts use integer atomics only.
#pragma once

#include <cstddef>
#include <cstdint>

#include <moeroute/gating_plan.hpp>
#include <moeroute/kernels/gating_agent.cuh>
#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/kernels/shared_memory.cuh>

namespace moeroute::kernels {

/// @brief Bytes of dynamic shared memory gating_kernel<..., Lanes, Slots, Warps, Generic> uses:
///        Groups * Lanes * Slots doubles (unless Generic) + Groups doubles + E ints, Groups =
///        Warps * 32 / Lanes.
inline std::size_t gating_kernel_smem(int lanes, int slots, int warps, bool generic, int experts) {
  const std::size_t groups = static_cast<std::size_t>(warps) * (32 / lanes);
  const std::size_t row = static_cast<std::size_t>(lanes) * static_cast<std::size_t>(slots);
  const std::size_t e = static_cast<std::size_t>(experts);
  return (generic ? 0 : groups * row * sizeof(double)) + groups * sizeof(double) + e * sizeof(int);
}

/// @brief Where a register kernel's group keeps the running P sum of slot s of lane l:
///        slot-major, so that a slot's add touches consecutive doubles across the lanes. In
///        expert order a lane's Vec experts sit side by side and the lanes' adds hit the same
///        banks (16-way for bf16 rows: 80 % of the kernel's shared wavefronts).
template <int Lanes>
__device__ __forceinline__ int gating_acc_position(int s, int l) {
  return s * Lanes + l;
}

/// @brief The gating kernel. Grid: one block per chunk; Warps * 32 threads; dynamic shared
///        memory gating_kernel_smem(Lanes, Slots, Warps, Generic, E).
///        The arguments are __grid_constant__: the agent keeps a reference to them, which
///        otherwise makes nvcc copy the whole struct into local memory in every thread.
/// (At least two blocks an SM where the row takes up to 8 slots a lane: without the bound ptxas
/// gave E = 128 with the inlined exps 80 registers and spilled in the token loop; with it, 99
/// and none. The 16-slot kernel needs its ~250.)
template <class Element, int Lanes, int Slots, int Warps, bool Generic>
__global__ void __launch_bounds__(Warps * 32, Slots <= 8 ? 2 : 1)
    gating_kernel(const __grid_constant__ gating_kernel_args<Element> a) {
  enter_after_prior_grid();
  constexpr int Groups = Warps * (32 / Lanes);
  constexpr int Row = Lanes * Slots;  // a group's accumulator row (register kernels)
  using agent_type = gating_agent<Element, Lanes, Slots, Generic>;
  const int E = a.sem.experts;
  const int tid = static_cast<int>(threadIdx.x);
  const int grp = tid / Lanes;  // token group inside the block

  double* s_acc = dynamic_shared<double>();              // [Groups, Row] (register kernels)
  double* s_z = s_acc + (Generic ? 0 : Groups * Row);    // [Groups]
  int* s_counts = reinterpret_cast<int*>(s_z + Groups);  // [E]
  __shared__ unsigned long long s_valid, s_nonfinite, s_replaced, s_invalid;

  const std::int64_t c = blockIdx.x;
  std::int64_t begin, end;
  gating_chunk_range(a.plan.segment_tokens, a.plan.pieces, a.plan.piece_tokens, c, begin, end);

  double* g_acc = a.part.d_scores + c * E;  // the generic kernel accumulates here (lane-owned)
  if constexpr (!Generic) {
    for (int i = tid; i < Groups * Row; i += Warps * 32) s_acc[i] = 0.0;
  } else {
    for (int i = tid; i < E; i += Warps * 32) g_acc[i] = 0.0;
  }
  for (int i = tid; i < E; i += Warps * 32) s_counts[i] = 0;
  if (tid < Groups) s_z[tid] = 0.0;
  if (tid == 0) {
    s_valid = 0;
    s_nonfinite = 0;
    s_replaced = 0;
    s_invalid = 0;
  }
  __syncthreads();

  agent_type agent(a, tid % Lanes);
  double z_acc = 0.0;
  // the logsumexp only where written or summed (configs without a z-loss skip it)
  const bool wants_lse = a.out.d_logsumexp != nullptr || a.out.sums.d_z_sum_squares != nullptr;
  // a softmax of the clean logits as the gate scores makes the logsumexp's exps and sum: one
  // exp per logit, not two
  const bool lse_from_scores = agent.lse_from_scores();
  for (std::int64_t base = begin; base < end; base += Groups) {  // block-uniform trip count
    const std::int64_t v = base + grp;
    const bool active = v < end;
    const std::int64_t t = a.plan.token(active ? v : base);  // idle groups recompute a real row

    const int nonfinite = agent.load_row(t);
    float lse = wants_lse && !lse_from_scores ? agent.logsumexp() : 0.0f;
    const auto gate_exps = agent.noise_and_scores(t);
    if (wants_lse && lse_from_scores) lse = agent_type::logsumexp(gate_exps);
    if (a.sem.groups > 1) agent.group_limit();
    if (a.sem.second_sampling) agent.sample_second(t);
    const bool counts_here = active && (a.valid == nullptr || a.valid[t] != 0);
    if (a.replay.d_ids != nullptr) {
      int replaced = 0, invalid = 0;
      agent.replay_select_and_gate(t, active, counts_here, replaced, invalid);
      if (replaced != 0) atomicAdd(&s_replaced, static_cast<unsigned long long>(replaced));
      if (invalid != 0) atomicAdd(&s_invalid, static_cast<unsigned long long>(invalid));
    } else {
      agent.select_and_gate(t, active);
    }
    if (active) agent.write(t, lse);

    if (a.aux || a.sem.token_priority) agent.aux_scores();  // (block-uniform)
    if (a.sem.token_priority) {
      const float pr = agent.priority();
      if (active && agent.lane == 0) a.out.d_token_priority[t] = pr;
    }
    if (counts_here) {
      if (a.aux)
        agent.for_slots([&](int s) {
          if (!agent.in_row(s)) return;
          if constexpr (Generic) {
            g_acc[agent.expert(s)] += static_cast<double>(agent.sel[s]);
          } else {
            s_acc[grp * Row + gating_acc_position<Lanes>(s, agent.lane)] +=
                static_cast<double>(agent.sel[s]);
          }
        });
      if (agent.lane == 0) {
        z_acc += static_cast<double>(lse) * static_cast<double>(lse);
        atomicAdd(&s_valid, 1ull);
      }
    }
    if (active && agent.lane == 0 && nonfinite)
      atomicAdd(&s_nonfinite, static_cast<unsigned long long>(nonfinite));
    if (!a.aux) continue;
    if (counts_here) agent.write_aux_scores(t);
    if (active && !counts_here) agent.write_uncounted(t);
    std::int32_t* count_ids =
        a.out.d_aux_count_ids != nullptr ? a.out.d_aux_count_ids + t * a.sem.counted : nullptr;
    agent.aux_counts(counts_here, [&](int j, int e) {
      atomicAdd(&s_counts[e], 1);
      if (count_ids != nullptr) count_ids[j] = e;
    });
  }

  // chunk partials, each summed in a fixed order
  if (agent.lane == 0) s_z[grp] = z_acc;
  __syncthreads();
  for (int e = tid; e < E; e += Warps * 32) {
    if constexpr (!Generic) {
      double v = 0.0;
      using row = typename agent_type::row_layout;
      const int at = gating_acc_position<Lanes>(row::owner_slot(e), row::owner_lane(e));
      for (int g = 0; g < Groups; ++g) v += s_acc[g * Row + at];
      a.part.d_scores[c * E + e] = v;
    }
    a.part.d_counts[c * E + e] = s_counts[e];
  }
  if (tid == 0) {
    double z = 0.0;
    for (int g = 0; g < Groups; ++g) z += s_z[g];
    a.part.d_z[c] = z;
    a.part.d_valid[c] = static_cast<std::int64_t>(s_valid);
    a.part.d_nonfinite[c] = static_cast<std::int64_t>(s_nonfinite);
    // replay counts: integer adds into outputs the launcher zeroed (any order, same total)
    if (a.replay.d_replaced != nullptr && s_replaced != 0)
      atomicAdd(reinterpret_cast<unsigned long long*>(a.replay.d_replaced), s_replaced);
    if (a.replay.d_invalid != nullptr && s_invalid != 0)
      atomicAdd(reinterpret_cast<unsigned long long*>(a.replay.d_invalid), s_invalid);
  }
}

}  // namespace moeroute::kernels
