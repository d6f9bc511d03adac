// SPDX-License-Identifier: Apache-2.0
// Capacity assignment kernels. Every ordering decision is a stable radix sort of
// (group, priority key) pairs whose input is in assignment order, so ties fall to the lower
// assignment index a = t * k + j (lower token, then lower rank), exactly as the CPU reference's
// stable_sort. Ranks inside a sorted segment come from binary searches, competitor ranks from
// an inclusive scan; the only atomics are integer counters whose final value does not depend
// on the order they land in.
#pragma once

#include <cfloat>
#include <cstdint>

#include <cub/block/block_reduce.cuh>

#include <moeroute/cuda/dispatch_workspace.hpp>
#include <moeroute/rng.hpp>

namespace moeroute::kernels {

namespace dispatch_detail {

inline constexpr std::uint8_t fate_kept = 0, fate_rerouted = 1, fate_dropped = 2, fate_masked = 3;

/// Priority modes, as passed to the kernels (same order as moeroute::priority).
inline constexpr int prio_token_major = 0, prio_choice_major = 1, prio_score = 2, prio_random = 3;

/// Ascending in the key <=> descending in f; -0 and +0 map to the same key (they compare equal).
__device__ inline std::uint32_t descending_key(float f) {
  if (f == 0.0f) f = 0.0f;
  const std::uint32_t u = __float_as_uint(f);
  const std::uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ascending;
}

/// First index i in [0, n) with (keys[i] >> shift) >= g (keys sorted ascending).
__device__ inline std::int64_t lower_bound_group(const std::uint64_t* keys, std::int64_t n,
                                                 int shift, std::uint64_t g) {
  std::int64_t lo = 0, hi = n;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if ((keys[mid] >> shift) < g) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__device__ inline std::int64_t grid_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}
__device__ inline std::int64_t global_id() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ inline void add_count(std::int64_t* p, std::int64_t v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

}  // namespace dispatch_detail

/// Priority key of every assignment and the phase-1 sort input:
/// key = (group << key_bits) | key32, group = chosen expert (E for padding tokens).
template <int Threads>
__global__ void __launch_bounds__(Threads)
dispatch_keys_kernel(const std::int32_t* __restrict__ d_ids,   // [T, k]
                                     const float* __restrict__ d_gates,        // [T, k]
                                     const std::uint8_t* __restrict__ d_valid,  // [T] or null
                                     std::int64_t tokens, std::int32_t k, std::int32_t experts,
                                     int prio, std::uint64_t seed, std::uint64_t offset,
                                     int key_bits,
                                     std::uint32_t* __restrict__ d_key32,  // [T, k]
                                     std::uint64_t* __restrict__ d_keys,   // [T, k]
                                     std::int32_t* __restrict__ d_vals) {  // [T, k]
  using namespace dispatch_detail;
  const std::int64_t n = tokens * k;
  for (std::int64_t a = global_id(); a < n; a += grid_stride()) {
    const std::int64_t t = a / k;
    const std::int64_t j = a - t * k;
    const std::int32_t e = d_ids[a];
    std::uint32_t key = 0;
    switch (prio) {
      case prio_choice_major: key = static_cast<std::uint32_t>(j * tokens + t); break;
      case prio_score: key = descending_key(d_gates[a]); break;
      case prio_random: {
        const auto r = rng::draw(seed, offset, rng::stream_random_priority,
                                 static_cast<std::uint64_t>(t) * static_cast<std::uint64_t>(experts) +
                                     static_cast<std::uint64_t>(e));
        key = descending_key(rng::uniform_open(r.v[0]));
        break;
      }
      default: break;  // token_major: the assignment index itself (stable sort input order)
    }
    const bool valid = d_valid == nullptr || d_valid[t] != 0;
    const std::uint64_t group = valid ? static_cast<std::uint64_t>(e) : static_cast<std::uint64_t>(experts);
    d_key32[a] = key;
    d_keys[a] = (group << key_bits) | key;
    d_vals[a] = static_cast<std::int32_t>(a);
  }
}

/// seg[g] = first position of group g in the sorted keys, for g in [0, groups].
template <int Threads>
__global__ void __launch_bounds__(Threads)
segment_starts_kernel(const std::uint64_t* __restrict__ d_sorted_keys,  // [n]
                                      std::int64_t n, int shift, std::int32_t groups,
                                      std::int32_t* __restrict__ d_seg) {  // [groups + 1]
  using namespace dispatch_detail;
  for (std::int64_t g = global_id(); g <= groups; g += grid_stride())
    d_seg[g] = static_cast<std::int32_t>(lower_bound_group(d_sorted_keys, n, shift, static_cast<std::uint64_t>(g)));
}

/// How the capacity is found: a host value, or the max_load rule on the device.
struct capacity_rule {
  bool from_max_load = false;
  std::int64_t value = 0;         ///< C when !from_max_load (-1 = unbounded)
  std::int64_t min_capacity = 0;  ///< max_load: C = max(max requested, min_capacity)
  bool clamp_to_tokens = false;   ///< max_load: then C = min(C, T)
  std::int64_t tokens = 0;
  std::int64_t fallback_capacity = 0;
};

/// One block: requested[e] from the segment starts, C (max_load needs the largest request),
/// load after phase 1 = min(requested, C), and the capacity fields of the totals.
template <int Threads>
__global__ void __launch_bounds__(Threads)
dispatch_capacity_kernel(const std::int32_t* __restrict__ d_seg,  // [E + 1]
                         std::int32_t experts, std::int32_t total_experts, capacity_rule rule,
                         std::int64_t* __restrict__ d_requested,  // [E]
                         std::int64_t* __restrict__ d_load,       // [total_experts]
                         cuda::dispatch_totals* __restrict__ d_totals) {
  using reduce = cub::BlockReduce<std::int64_t, Threads>;
  __shared__ typename reduce::TempStorage tmp;
  __shared__ std::int64_t s_cap;
  std::int64_t local_max = 0;
  for (std::int32_t e = threadIdx.x; e < experts; e += Threads) {
    const std::int64_t req = d_seg[e + 1] - d_seg[e];
    d_requested[e] = req;
    local_max = local_max > req ? local_max : req;
  }
  const std::int64_t max_load = reduce(tmp).Reduce(local_max, [](std::int64_t x, std::int64_t y) { return x > y ? x : y; });
  if (threadIdx.x == 0) {
    std::int64_t C = rule.value;
    if (rule.from_max_load) {  // expert_capacity(): max(max_load, min_capacity), clamp, >= 0
      C = max_load > rule.min_capacity ? max_load : rule.min_capacity;
      if (rule.clamp_to_tokens && C > rule.tokens) C = rule.tokens;
      if (C < 0) C = 0;
    }
    s_cap = C;
    d_totals->capacity = C;
    d_totals->fallback_capacity = rule.fallback_capacity;
  }
  __syncthreads();
  const std::int64_t C = s_cap;
  for (std::int32_t e = threadIdx.x; e < total_experts; e += Threads) {
    if (e < experts) {
      const std::int64_t req = d_seg[e + 1] - d_seg[e];
      d_load[e] = (C < 0 || req < C) ? req : C;
    } else {
      d_load[e] = 0;  // dedicated fallback: filled by the reroute phase
    }
  }
}

/// Phase 1: the first C requests of each expert (in priority order) are kept, slot = rank.
template <int Threads>
__global__ void __launch_bounds__(Threads)
dispatch_grant_kernel(const std::uint64_t* __restrict__ d_sorted_keys,  // [n]
                                      const std::int32_t* __restrict__ d_sorted_vals,   // [n]
                                      std::int64_t n, int key_bits, std::int32_t experts,
                                      const std::int32_t* __restrict__ d_seg,  // [E + 1]
                                      const cuda::dispatch_totals* __restrict__ d_totals,
                                      std::uint8_t* __restrict__ d_fate,     // [T, k]
                                      std::int32_t* __restrict__ d_expert,   // [T, k]
                                      std::int32_t* __restrict__ d_slot,     // [T, k]
                                      std::uint8_t* __restrict__ d_holder) {  // [T, k]
  using namespace dispatch_detail;
  const std::int64_t C = d_totals->capacity;
  for (std::int64_t i = global_id(); i < n; i += grid_stride()) {
    const std::int32_t a = d_sorted_vals[i];
    const std::int64_t group = static_cast<std::int64_t>(d_sorted_keys[i] >> key_bits);
    std::uint8_t f = fate_masked;
    std::int32_t e = -1, s = -1;
    if (group < experts) {
      const std::int64_t rank = i - d_seg[group];
      if (C < 0 || rank < C) {
        f = fate_kept;
        e = static_cast<std::int32_t>(group);
        s = static_cast<std::int32_t>(rank);
      } else {
        f = fate_dropped;
      }
    }
    d_fate[a] = f;
    d_expert[a] = e;
    d_slot[a] = s;
    d_holder[a] = f == fate_kept ? 1 : 0;
  }
}

/// Sort input for the global reroute order: dropped assignments first, by priority key.
template <int Threads>
__global__ void __launch_bounds__(Threads)
pending_keys_kernel(const std::uint8_t* __restrict__ d_fate,
                                    const std::uint32_t* __restrict__ d_key32, std::int64_t n,
                                    int key_bits, std::uint64_t* __restrict__ d_keys,
                                    std::int32_t* __restrict__ d_vals) {
  using namespace dispatch_detail;
  for (std::int64_t a = global_id(); a < n; a += grid_stride()) {
    const std::uint64_t not_dropped = d_fate[a] == fate_dropped ? 0u : 1u;
    d_keys[a] = (not_dropped << key_bits) | d_key32[a];
    d_vals[a] = static_cast<std::int32_t>(a);
  }
}

/// pending[i] = i-th assignment in reroute order; pos[a] = its position if dropped, else -1.
template <int Threads>
__global__ void __launch_bounds__(Threads)
pending_scatter_kernel(const std::uint64_t* __restrict__ d_sorted_keys,
                                       const std::int32_t* __restrict__ d_sorted_vals,
                                       std::int64_t n, int key_bits,
                                       std::int32_t* __restrict__ d_pending,
                                       std::int32_t* __restrict__ d_pos) {
  using namespace dispatch_detail;
  for (std::int64_t i = global_id(); i < n; i += grid_stride()) {
    const std::int32_t a = d_sorted_vals[i];
    d_pending[i] = a;
    d_pos[a] = (d_sorted_keys[i] >> key_bits) == 0 ? static_cast<std::int32_t>(i) : -1;
  }
}

/// *d_out = number of sorted keys whose group (key >> shift) is below g.
template <int Threads>
__global__ void __launch_bounds__(Threads)
count_below_kernel(const std::uint64_t* __restrict__ d_sorted_keys, std::int64_t n,
                                   int shift, std::uint64_t g, std::int64_t* __restrict__ d_out) {
  if (blockIdx.x == 0 && threadIdx.x == 0)
    *d_out = dispatch_detail::lower_bound_group(d_sorted_keys, n, shift, g);
}

// ----- fallback policy ---------------------------------------------------------------------

/// per_token[t] = the token's first dropped assignment in reroute order (-1 if none).
template <int Threads>
__global__ void __launch_bounds__(Threads)
fallback_first_kernel(const std::int32_t* __restrict__ d_pos, std::int64_t tokens,
                                      std::int32_t k, std::int32_t* __restrict__ d_first) {
  using namespace dispatch_detail;
  for (std::int64_t t = global_id(); t < tokens; t += grid_stride()) {
    std::int32_t best = -1, best_pos = 0;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int32_t p = d_pos[t * k + j];
      if (p >= 0 && (best < 0 || p < best_pos)) {
        best = static_cast<std::int32_t>(t * k + j);
        best_pos = p;
      }
    }
    d_first[t] = best;
  }
}

/// Classifies every dropped assignment: 2 = its token already holds the target (shares that
/// slot), 1 = the token's first dropped assignment (competes for a new slot), 0 = a later one
/// of the same token (follows the first). flags[p] = (class == 1) for the scan.
template <int Threads>
__global__ void __launch_bounds__(Threads)
fallback_classify_kernel(const std::int32_t* __restrict__ d_pending,
                                         const std::int64_t* __restrict__ d_num_pending,
                                         std::int64_t n, std::int32_t k, std::int32_t target,
                                         const std::uint8_t* __restrict__ d_fate,
                                         const std::int32_t* __restrict__ d_expert,
                                         const std::int32_t* __restrict__ d_first,
                                         std::int32_t* __restrict__ d_class,
                                         std::int32_t* __restrict__ d_flags) {
  using namespace dispatch_detail;
  const std::int64_t np = *d_num_pending;
  for (std::int64_t p = global_id(); p < n; p += grid_stride()) {
    std::int32_t cls = 0;
    if (p < np) {
      const std::int32_t a = d_pending[p];
      const std::int64_t t = a / k;
      bool covered = false;
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int64_t b = t * k + j;
        if (d_fate[b] == fate_kept && d_expert[b] == target) covered = true;
      }
      cls = covered ? 2 : (d_first[t] == a ? 1 : 0);
    }
    d_class[p] = cls;
    d_flags[p] = cls == 1 ? 1 : 0;
  }
}

/// Grants: the first `room` competitors (inclusive scan rank) get new slots; shares and
/// followers take their outcome from the token. Slots of shares are resolved later.
template <int Threads>
__global__ void __launch_bounds__(Threads)
fallback_grant_kernel(const std::int32_t* __restrict__ d_pending,
                                      const std::int64_t* __restrict__ d_num_pending,
                                      std::int32_t k, std::int32_t target, bool dedicated,
                                      const std::int32_t* __restrict__ d_class,
                                      const std::int32_t* __restrict__ d_scan,  // inclusive
                                      const std::int32_t* __restrict__ d_pos,
                                      const std::int32_t* __restrict__ d_first,
                                      const std::int64_t* __restrict__ d_load,
                                      const cuda::dispatch_totals* __restrict__ d_totals,
                                      std::uint8_t* __restrict__ d_fate,
                                      std::int32_t* __restrict__ d_expert,
                                      std::int32_t* __restrict__ d_slot,
                                      std::uint8_t* __restrict__ d_holder) {
  using namespace dispatch_detail;
  const std::int64_t np = *d_num_pending;
  const std::int64_t cap = dedicated ? d_totals->fallback_capacity : d_totals->capacity;
  const std::int64_t load = d_load[target];
  const auto granted = [&](std::int64_t rank) { return cap < 0 || rank < cap - load; };
  for (std::int64_t p = global_id(); p < np; p += grid_stride()) {
    const std::int32_t a = d_pending[p];
    const std::int32_t cls = d_class[p];
    if (cls == 2) {
      d_fate[a] = fate_rerouted;
      d_expert[a] = target;
    } else if (cls == 1) {
      const std::int64_t rank = d_scan[p] - 1;
      if (granted(rank)) {
        d_fate[a] = fate_rerouted;
        d_expert[a] = target;
        d_slot[a] = static_cast<std::int32_t>(load + rank);
        d_holder[a] = 1;
      }
    } else {
      const std::int32_t first = d_first[a / k];
      if (granted(d_scan[d_pos[first]] - 1)) {
        d_fate[a] = fate_rerouted;
        d_expert[a] = target;
      }
    }
  }
}

/// load[target] += competitors granted.
template <int Threads>
__global__ void __launch_bounds__(Threads)
fallback_load_kernel(const std::int64_t* __restrict__ d_num_pending,
                                     const std::int32_t* __restrict__ d_scan, std::int32_t target,
                                     bool dedicated, const cuda::dispatch_totals* __restrict__ d_totals,
                                     std::int64_t* __restrict__ d_load) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const std::int64_t np = *d_num_pending;
  if (np == 0) return;
  const std::int64_t competitors = d_scan[np - 1];
  const std::int64_t cap = dedicated ? d_totals->fallback_capacity : d_totals->capacity;
  const std::int64_t load = d_load[target];
  std::int64_t add = competitors;
  if (cap >= 0) {
    const std::int64_t room = cap - load > 0 ? cap - load : 0;
    add = competitors < room ? competitors : room;
  }
  d_load[target] = load + add;
}

// ----- next_choice policy ------------------------------------------------------------------

/// One reroute round, step 1: each still-dropped assignment (in reroute order) takes its
/// token's next untried candidate. The m-th still-dropped assignment of a token in this round
/// gets candidate next[t] + m, if that is < R. Sort input: key = target (E = no attempt).
template <int Threads>
__global__ void __launch_bounds__(Threads)
next_choice_attempt_kernel(const std::int32_t* __restrict__ d_pending,
                                           const std::int64_t* __restrict__ d_num_pending,
                                           std::int64_t n, std::int32_t k, std::int32_t R,
                                           std::int32_t experts,
                                           const std::int32_t* __restrict__ d_pos,
                                           const std::uint8_t* __restrict__ d_fate,
                                           const std::int32_t* __restrict__ d_next,
                                           const std::int32_t* __restrict__ d_reroute_ids,  // [T, R]
                                           std::uint64_t* __restrict__ d_keys,
                                           std::int32_t* __restrict__ d_vals) {
  using namespace dispatch_detail;
  const std::int64_t np = *d_num_pending;
  for (std::int64_t p = global_id(); p < n; p += grid_stride()) {
    std::uint64_t target = static_cast<std::uint64_t>(experts);
    if (p < np) {
      const std::int32_t a = d_pending[p];
      if (d_fate[a] == fate_dropped) {
        const std::int64_t t = a / k;
        std::int32_t m = 0;
        for (std::int32_t j = 0; j < k; ++j) {
          const std::int64_t b = t * k + j;
          const std::int32_t pb = d_pos[b];
          if (b != a && pb >= 0 && pb < p && d_fate[b] == fate_dropped) ++m;
        }
        const std::int64_t idx = static_cast<std::int64_t>(d_next[t]) + m;
        if (idx < R) target = static_cast<std::uint64_t>(d_reroute_ids[t * R + idx]);
      }
    }
    d_keys[p] = target;
    d_vals[p] = static_cast<std::int32_t>(p);
  }
}

/// Step 2: next[t] advances by the token's still-dropped assignments, up to R.
template <int Threads>
__global__ void __launch_bounds__(Threads)
next_choice_advance_kernel(std::int64_t tokens, std::int32_t k, std::int32_t R,
                                           const std::int32_t* __restrict__ d_pos,
                                           const std::uint8_t* __restrict__ d_fate,
                                           std::int32_t* __restrict__ d_next) {
  using namespace dispatch_detail;
  for (std::int64_t t = global_id(); t < tokens; t += grid_stride()) {
    std::int64_t nd = 0;
    for (std::int32_t j = 0; j < k; ++j)
      if (d_pos[t * k + j] >= 0 && d_fate[t * k + j] == fate_dropped) ++nd;
    const std::int64_t next = d_next[t] + nd;
    d_next[t] = static_cast<std::int32_t>(next < R ? next : R);
  }
}

/// Step 3 (after a stable sort by target): the first room(c) attempts at c get new slots.
template <int Threads>
__global__ void __launch_bounds__(Threads)
next_choice_grant_kernel(const std::uint64_t* __restrict__ d_sorted_keys,
                                         const std::int32_t* __restrict__ d_sorted_vals,
                                         std::int64_t n, std::int32_t experts,
                                         const std::int32_t* __restrict__ d_seg,  // [E + 1]
                                         const std::int32_t* __restrict__ d_pending,
                                         const std::int64_t* __restrict__ d_load,
                                         const cuda::dispatch_totals* __restrict__ d_totals,
                                         std::uint8_t* __restrict__ d_fate,
                                         std::int32_t* __restrict__ d_expert,
                                         std::int32_t* __restrict__ d_slot,
                                         std::uint8_t* __restrict__ d_holder) {
  using namespace dispatch_detail;
  const std::int64_t C = d_totals->capacity;
  const std::int64_t attempts = d_seg[experts];
  for (std::int64_t i = global_id(); i < attempts; i += grid_stride()) {
    const std::int32_t c = static_cast<std::int32_t>(d_sorted_keys[i]);
    const std::int64_t rank = i - d_seg[c];
    const std::int64_t load = d_load[c];
    if (C < 0 || rank < C - load) {
      const std::int32_t a = d_pending[d_sorted_vals[i]];
      d_fate[a] = fate_rerouted;
      d_expert[a] = c;
      d_slot[a] = static_cast<std::int32_t>(load + rank);
      d_holder[a] = 1;
    }
  }
}

/// Step 4: load[c] += granted at c; a round with any attempt counts in reroute_rounds.
template <int Threads>
__global__ void __launch_bounds__(Threads)
next_choice_load_kernel(std::int32_t experts, const std::int32_t* __restrict__ d_seg,
                                        std::int64_t* __restrict__ d_load,
                                        cuda::dispatch_totals* __restrict__ d_totals) {
  using namespace dispatch_detail;
  const std::int64_t C = d_totals->capacity;
  for (std::int64_t c = global_id(); c < experts; c += grid_stride()) {
    const std::int64_t cnt = d_seg[c + 1] - d_seg[c];
    const std::int64_t load = d_load[c];
    std::int64_t add = cnt;
    if (C >= 0) {
      const std::int64_t room = C - load > 0 ? C - load : 0;
      add = cnt < room ? cnt : room;
    }
    d_load[c] = load + add;
  }
  if (global_id() == 0 && d_seg[experts] > 0) d_totals->reroute_rounds += 1;
}

// ----- slot numbering, shares, weights, counts ---------------------------------------------

/// Sort input for token-index numbering: holders keyed by their expert (others last).
template <int Threads>
__global__ void __launch_bounds__(Threads)
holder_keys_kernel(const std::uint8_t* __restrict__ d_holder,
                                   const std::int32_t* __restrict__ d_expert, std::int64_t n,
                                   std::int32_t total_experts, std::uint64_t* __restrict__ d_keys,
                                   std::int32_t* __restrict__ d_vals) {
  using namespace dispatch_detail;
  for (std::int64_t a = global_id(); a < n; a += grid_stride()) {
    d_keys[a] = d_holder[a] ? static_cast<std::uint64_t>(d_expert[a]) : static_cast<std::uint64_t>(total_experts);
    d_vals[a] = static_cast<std::int32_t>(a);
  }
}

/// slot of a holder = its rank by assignment (= token) index inside its expert.
template <int Threads>
__global__ void __launch_bounds__(Threads)
renumber_kernel(const std::uint64_t* __restrict__ d_sorted_keys,
                                const std::int32_t* __restrict__ d_sorted_vals,
                                std::int32_t total_experts, const std::int32_t* __restrict__ d_seg,
                                std::int32_t* __restrict__ d_slot) {
  using namespace dispatch_detail;
  const std::int64_t holders = d_seg[total_experts];
  for (std::int64_t i = global_id(); i < holders; i += grid_stride()) {
    const std::int32_t e = static_cast<std::int32_t>(d_sorted_keys[i]);
    d_slot[d_sorted_vals[i]] = static_cast<std::int32_t>(i - d_seg[e]);
  }
}

/// A rerouted assignment that does not hold its slot shares the one its token holds there.
template <int Threads>
__global__ void __launch_bounds__(Threads)
follower_slot_kernel(std::int64_t n, std::int32_t k,
                                     const std::int32_t* __restrict__ d_expert,
                                     const std::uint8_t* __restrict__ d_holder,
                                     std::int32_t* __restrict__ d_slot) {
  using namespace dispatch_detail;
  for (std::int64_t a = global_id(); a < n; a += grid_stride()) {
    const std::int32_t e = d_expert[a];
    if (e < 0 || d_holder[a]) continue;
    const std::int64_t t = a / k;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t b = t * k + j;
      if (d_holder[b] && d_expert[b] == e) {
        d_slot[a] = d_slot[b];
        break;
      }
    }
  }
}

/// Combine weights: the surviving gates, renormalised after drop when asked. The sum runs in
/// rank order in float; every operation is a single rounding (as the -ffp-contract=off host).
template <int Threads>
__global__ void __launch_bounds__(Threads)
dispatch_weights_kernel(std::int64_t tokens, std::int32_t k,
                                        const float* __restrict__ d_gates,
                                        const std::uint8_t* __restrict__ d_fate, bool after_drop,
                                        float scaling, float* __restrict__ d_weight) {
  using namespace dispatch_detail;
  for (std::int64_t t = global_id(); t < tokens; t += grid_stride()) {
    float sum = 0.0f;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::uint8_t f = d_fate[t * k + j];
      if (f == fate_kept || f == fate_rerouted) sum = __fadd_rn(sum, d_gates[t * k + j]);
    }
    const float denom = sum < FLT_EPSILON ? FLT_EPSILON : sum;  // std::max(sum, FLT_EPSILON)
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      const std::uint8_t f = d_fate[a];
      float w = 0.0f;
      if (f == fate_kept || f == fate_rerouted)
        w = after_drop ? __fmul_rn(__fdiv_rn(d_gates[a], denom), scaling) : d_gates[a];
      d_weight[a] = w;
    }
  }
}

/// Per-expert and total counts from the final fates (integer atomics: order-independent).
/// Counters must be zeroed beforehand; requested is written by the capacity kernel.
template <int Threads>
__global__ void __launch_bounds__(Threads)
dispatch_stats_kernel(std::int64_t n, const std::int32_t* __restrict__ d_ids,
                      const std::uint8_t* __restrict__ d_fate,
                      const std::int32_t* __restrict__ d_expert,
                      std::int64_t* __restrict__ d_kept, std::int64_t* __restrict__ d_rerouted,
                      std::int64_t* __restrict__ d_dropped, std::int64_t* __restrict__ d_received,
                      cuda::dispatch_totals* __restrict__ d_totals) {
  using namespace dispatch_detail;
  const std::int64_t stride = grid_stride();
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * Threads; base < n; base += stride) {
    const std::int64_t a = base + threadIdx.x;
    int kept = 0, rer = 0, drop = 0, mask = 0;
    if (a < n) {
      const std::uint8_t f = d_fate[a];
      const std::int32_t e = d_ids[a];
      if (f == fate_kept) {
        kept = 1;
        add_count(&d_kept[e], 1);
      } else if (f == fate_rerouted) {
        rer = 1;
        add_count(&d_rerouted[e], 1);
        add_count(&d_received[d_expert[a]], 1);
      } else if (f == fate_dropped) {
        drop = 1;
        add_count(&d_dropped[e], 1);
      } else {
        mask = 1;
      }
    }
    // one atomic per warp for the totals (the loop is warp-uniform: base steps by blocks)
    kept = __reduce_add_sync(0xffffffffu, kept);
    rer = __reduce_add_sync(0xffffffffu, rer);
    drop = __reduce_add_sync(0xffffffffu, drop);
    mask = __reduce_add_sync(0xffffffffu, mask);
    if ((threadIdx.x & 31) == 0) {
      if (kept) add_count(&d_totals->kept, kept);
      if (rer) add_count(&d_totals->rerouted, rer);
      if (drop) add_count(&d_totals->dropped, drop);
      if (mask) add_count(&d_totals->masked, mask);
    }
  }
}

}  // namespace moeroute::kernels
