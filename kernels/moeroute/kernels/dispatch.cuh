// SPDX-License-Identifier: Apache-2.0
// Capacity assignment kernels (reference::dispatch on the GPU). Every ordering decision other
// than the counting grant's (token- and choice-major, dispatch_count.cuh) is a stable radix sort
// of (group, priority key) pairs whose input is in assignment order, so ties fall to the lower
// assignment index a = t * k + j (lower token, then lower rank), exactly as the CPU reference's
// stable_sort. Ranks inside a sorted segment come from binary searches, competitor ranks from
// an inclusive scan; the only atomics are integer counters whose final value does not depend
// on the order they land in.
//
// Every kernel takes the dispatch_state (shapes, inputs, outputs, scratch) by value, plus the
// few values that change from launch to launch (the sorted arrays of the last sort, a target).
#pragma once

#include <cfloat>
#include <cstdint>

#include <cub/block/block_reduce.cuh>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/dispatch_plan.hpp>
#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/kernels/shared_memory.cuh>
#include <moeroute/rng.hpp>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

/// Shapes, inputs, outputs and scratch of one dispatch call.
struct dispatch_state {
  std::int64_t tokens = 0, n = 0;  ///< T and n = T * k
  std::int32_t k = 0, experts = 0, total_experts = 0;
  /// Capacity groups (capacity.group_tokens): `groups` of `group_tokens` tokens each; the grant
  /// segments are (group, expert) pairs, segment q * experts + e. One group: the batch
  /// (group_tokens = T).
  std::int64_t groups = 1, group_tokens = 0;
  std::int32_t reroute = 0;             ///< R
  const_gating_result gated{};          ///< d_ids, d_gates [T, k]; d_reroute_ids [T, R]
  const std::uint8_t* valid = nullptr;  ///< [T] or null
  /// [1] or null: tokens [*token_count, T) are padding (a count only the device knows)
  const std::int64_t* token_count = nullptr;
  const std::uint8_t* given_valid = nullptr;  ///< the caller's [T] validity (null: all real)
  dispatch_result out{};
  dispatch_scratch scratch{};
};

namespace dispatch_detail {

// Divisions of indices are 32-bit (validate() bounds T * k below 2^31): a 64-bit one is a
// called subroutine, dozens of instructions, and made its callers spill.

/// Token of assignment a.
__device__ inline std::int64_t token_of(const dispatch_state& s, std::int64_t a) {
  return static_cast<std::int32_t>(a) / s.k;
}

/// Capacity group of token t (0 without groups).
__device__ inline std::int64_t group_of_token(const dispatch_state& s, std::int64_t t) {
  return s.groups > 1 ? static_cast<std::int32_t>(t) / static_cast<std::int32_t>(s.group_tokens)
                      : 0;
}

/// Capacity group of assignment a (0 without groups).
__device__ inline std::int64_t group_of(const dispatch_state& s, std::int64_t a) {
  return group_of_token(s, token_of(s, a));
}

/// A real token (not padding).
__device__ inline bool token_valid(const dispatch_state& s, std::int64_t t) {
  return s.valid == nullptr || s.valid[t] != 0;
}

/// A second choice that lost NLLB's "random" draw: dropped before any capacity is counted.
__device__ inline bool second_skipped(const dispatch_state& s, std::int64_t a) {
  if (s.gated.d_second_skipped == nullptr) return false;
  const std::int64_t t = token_of(s, a);
  return a - t * s.k == 1 && s.gated.d_second_skipped[t] != 0;
}

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

/// Slots still free at an expert with capacity `cap` (-1 = unbounded) holding `load`.
__device__ inline bool has_room(std::int64_t cap, std::int64_t load, std::int64_t rank) {
  return cap < 0 || rank < cap - load;
}

/// How many of `wanted` new holders fit at an expert with capacity `cap` holding `load`.
__device__ inline std::int64_t granted_count(std::int64_t cap, std::int64_t load,
                                             std::int64_t wanted) {
  if (cap < 0) return wanted;
  const std::int64_t room = cap - load > 0 ? cap - load : 0;
  return wanted < room ? wanted : room;
}

}  // namespace dispatch_detail

// ----- check: the given ids and gates -----------------------------------------------------

namespace dispatch_detail {

/// A real token by the caller's validity and token count (before the checks).
__device__ inline bool given_real(const dispatch_state& s, std::int64_t t) {
  return (s.given_valid == nullptr || s.given_valid[t] != 0) &&
         (s.token_count == nullptr || t < *s.token_count);
}

/// Checks token t (see dispatch_check_kernel) and writes d_usable[t].
__device__ inline void check_token(const dispatch_state& s, std::int64_t t, bool priority_read) {
  const std::int32_t k = s.k, reroute = s.reroute;
  const auto candidate = [&](std::int32_t i) {
    return i < k ? s.gated.d_ids[t * k + i] : s.gated.d_reroute_ids[t * reroute + (i - k)];
  };
  bool ok = true;
  for (std::int32_t i = 0; i < k + reroute && ok; ++i) {
    const std::int32_t e = candidate(i);
    ok = e >= 0 && e < s.experts;
    for (std::int32_t j = 0; j < i && ok; ++j) ok = candidate(j) != e;
  }
  for (std::int32_t j = 0; j < k; ++j) ok = ok && isfinite(s.gated.d_gates[t * k + j]);
  if (priority_read) ok = ok && isfinite(s.gated.d_token_priority[t]);
  s.scratch.d_usable[t] = given_real(s, t) && ok ? 1 : 0;
}

}  // namespace dispatch_detail

/// The host backends' checks of dispatch's inputs, on the device: a real token whose ids leave
/// [0, E) or repeat among its k ids and R reroute candidates, or whose gates (or batch
/// priority, when read) are not finite, is masked for the rest of dispatch — no later kernel
/// indexes with its ids — and counted in totals.invalid_tokens (by the counts kernel, which
/// finds it real and not usable). d_usable[t] = real and well-formed: the validity every later
/// kernel reads. The first kernel of a call, it also zeroes the counters later kernels add to
/// (per expert kept, rerouted, dropped, received; the totals): no memset before it.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    dispatch_check_kernel(const dispatch_state s, bool priority_read) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const dispatch_result& o = s.out;
  for (std::int64_t e = global_id(); e < s.total_experts; e += grid_stride()) {
    if (e < s.experts) o.d_kept[e] = o.d_rerouted[e] = o.d_dropped[e] = 0;
    o.d_received[e] = 0;
  }
  if (global_id() == 0) *o.d_totals = dispatch_totals{};
  for (std::int64_t t = global_id(); t < s.tokens; t += grid_stride())
    check_token(s, t, priority_read);
}

// ----- grant: priority keys, capacity, the first C of each expert -------------------------

/// Priority key of every assignment and the grant sort input:
/// key = (segment << key_bits) | [rank << 32 |] key32, segment = q * E + chosen expert for a
/// token of capacity group q (groups * E for padding tokens); batch_prioritized puts the
/// choice rank above the 32-bit key so every first choice sorts first.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    dispatch_keys_kernel(const dispatch_state s, priority prio, std::uint64_t seed,
                         std::uint64_t offset, int key_bits) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const std::int32_t k = s.k;
  for (std::int64_t a = global_id(); a < s.n; a += grid_stride()) {
    const std::int64_t t = token_of(s, a);
    const std::int64_t j = a - t * k;
    const std::int32_t e = s.gated.d_ids[a];
    std::uint32_t key = 0;
    switch (prio) {
      case priority::choice_major:
        key = static_cast<std::uint32_t>(j * s.tokens + t);
        break;
      case priority::score_per_expert:
        key = descending_key(s.gated.d_gates[a]);
        break;
      case priority::random: {
        key = descending_key(rng::random_priority(seed, offset, t, s.experts, e));
        break;
      }
      case priority::batch_prioritized:
        key = descending_key(s.gated.d_token_priority[t]);
        break;
      case priority::token_major:
        break;  // the assignment index itself (stable sort order)
    }
    // padding tokens and skipped second choices sort past every segment
    const bool competes = token_valid(s, t) && !second_skipped(s, a);
    const std::int64_t q = group_of(s, a);
    const std::uint64_t group = static_cast<std::uint64_t>(
        competes ? q * s.experts + e : s.groups * static_cast<std::int64_t>(s.experts));
    const std::uint64_t rank =
        prio == priority::batch_prioritized ? static_cast<std::uint64_t>(j) << 32 : 0u;
    s.scratch.d_key32[a] = key;
    s.scratch.d_keys_a[a] = (group << key_bits) | rank | key;
    s.scratch.d_vals_a[a] = static_cast<std::int32_t>(a);
  }
}

/// seg[g] = first position of group g in the sorted keys, for g in [0, groups].
template <int Threads>
__global__ void __launch_bounds__(Threads)
    segment_starts_kernel(const std::uint64_t* __restrict__ d_sorted_keys, std::int64_t n,
                          int shift, std::int64_t groups, std::int32_t* __restrict__ d_seg) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  for (std::int64_t g = global_id(); g <= groups; g += grid_stride())
    d_seg[g] = static_cast<std::int32_t>(
        lower_bound_group(d_sorted_keys, n, shift, static_cast<std::uint64_t>(g)));
}

/// How the capacity is found: a host value, or the max_load rule on the device.
struct capacity_rule {
  /// C from group_capacity on the device: capacity_mode::max_load (it needs the requests), or
  /// a token count only the device knows. Otherwise C = value, from the host.
  bool on_device = false;
  capacity_config cap{};  ///< the config's rule, and its E, k and active factor
  std::int32_t experts = 0, k = 0;
  double factor = 0.0;
  const std::int64_t* d_token_count = nullptr;  ///< [1] or null: C of that many tokens
  std::int64_t value = 0;                       ///< C from the host (-1 = unbounded)
  std::int64_t fallback_capacity = 0;
};

/// The capacity of a batch and the load its first grant leaves, run by one block of Threads:
/// requested[e] = sum over the capacity groups of requested(segment q * E + e), C (max_load
/// needs the largest request of any segment), load after the grant = sum over groups of
/// min(requested, C), and the capacity fields of the totals. The caller syncs the block first.
template <int Threads, class Requested>
__device__ void grant_capacity(const dispatch_state& s, const capacity_rule& rule,
                               Requested requested) {
  using reduce = cub::BlockReduce<std::int64_t, Threads>;
  __shared__ typename reduce::TempStorage tmp;
  __shared__ std::int64_t s_cap;
  const std::int64_t E = s.experts;
  std::int64_t local_max = 0;
  for (std::int32_t e = threadIdx.x; e < s.experts; e += Threads) {
    std::int64_t req = 0;
    for (std::int64_t q = 0; q < s.groups; ++q) {
      const std::int64_t r = requested(q * E + e);
      req += r;
      local_max = local_max > r ? local_max : r;
    }
    s.out.d_requested[e] = req;
  }
  const std::int64_t max_load =
      reduce(tmp).Reduce(local_max, [](std::int64_t x, std::int64_t y) { return x > y ? x : y; });
  if (threadIdx.x == 0) {
    std::int64_t C = rule.value;
    if (rule.on_device) {  // expert_capacity()'s rule: the same function as the host's
      std::int64_t group = s.group_tokens;
      if (rule.d_token_count != nullptr) {  // clamped to [0, T], as the token mask is
        const std::int64_t n = *rule.d_token_count;
        group = n < 0 ? 0 : (n > s.tokens ? s.tokens : n);
      }
      C = group_capacity(rule.cap, group, rule.experts, rule.k, rule.factor, max_load);
    }
    s_cap = C;
    s.out.d_totals->capacity = C;
    s.out.d_totals->fallback_capacity = rule.fallback_capacity;
  }
  __syncthreads();
  const std::int64_t C = s_cap;
  const std::int64_t ET = s.total_experts;
  for (std::int32_t e = threadIdx.x; e < s.total_experts; e += Threads) {
    std::int64_t load = 0;  // a dedicated fallback's is filled by the reroute phase
    for (std::int64_t q = 0; q < s.groups; ++q) {
      std::int64_t granted = 0;
      if (e < s.experts) {
        const std::int64_t req = requested(q * E + e);
        granted = (C < 0 || req < C) ? req : C;
      }
      s.scratch.d_vload[q * ET + e] = granted;
      load += granted;
    }
    s.out.d_load[e] = load;
  }
}

/// One block: the capacity from the sorted segments' starts (grant_capacity).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    dispatch_capacity_kernel(const dispatch_state s, capacity_rule rule) {
  enter_after_prior_grid();
  const std::int32_t* seg = s.scratch.d_seg;
  grant_capacity<Threads>(s, rule,
                          [seg](std::int64_t g) -> std::int64_t { return seg[g + 1] - seg[g]; });
}

/// The first C requests of each (group, expert) segment (in priority order) are kept; slot =
/// rank in the segment (local to the group until rebase_kernel).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    dispatch_grant_kernel(const dispatch_state s, const std::uint64_t* __restrict__ d_sorted_keys,
                          const std::int32_t* __restrict__ d_sorted_vals, int key_bits) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const std::int64_t C = s.out.d_totals->capacity;
  for (std::int64_t i = global_id(); i < s.n; i += grid_stride()) {
    const std::int32_t a = d_sorted_vals[i];
    const std::int64_t group = static_cast<std::int64_t>(d_sorted_keys[i] >> key_bits);
    fate f = fate::masked;
    std::int32_t e = -1, slot = -1;
    if (group < s.groups * s.experts) {
      const std::int64_t rank = i - s.scratch.d_seg[group];
      if (C < 0 || rank < C) {
        f = fate::kept;
        e = static_cast<std::int32_t>(group % s.experts);
        slot = static_cast<std::int32_t>(rank);
      } else {
        f = fate::dropped;
      }
    } else if (token_valid(s, a / s.k) && second_skipped(s, a)) {
      f = fate::dropped;  // lost the draw: dropped without competing
    }
    s.out.d_fate[a] = f;
    s.out.d_expert[a] = e;
    s.out.d_slot[a] = slot;
    s.scratch.d_holder[a] = f == fate::kept ? 1 : 0;
  }
}

// ----- the global reroute order ------------------------------------------------------------

/// Sort input for the reroute order: dropped assignments first, capacity group by group, each
/// by priority key: (not_dropped << (key_bits + group_bits)) | (group << key_bits) | key.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    pending_keys_kernel(const dispatch_state s, int key_bits, int group_bits, bool ranked) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  for (std::int64_t a = global_id(); a < s.n; a += grid_stride()) {
    const std::uint64_t not_dropped = s.out.d_fate[a] == fate::dropped ? 0u : 1u;
    // batch_prioritized: the choice rank above the 32-bit key, as in the grant sort
    const std::uint64_t rank = ranked ? static_cast<std::uint64_t>(a % s.k) << 32 : 0u;
    const auto q = static_cast<std::uint64_t>(group_of(s, a));
    s.scratch.d_keys_a[a] =
        (not_dropped << (key_bits + group_bits)) | (q << key_bits) | rank | s.scratch.d_key32[a];
    s.scratch.d_vals_a[a] = static_cast<std::int32_t>(a);
  }
}

/// pending[i] = i-th assignment in reroute order; pos[a] = its position if dropped, else -1;
/// thread 0 also counts the dropped ones (num_pending).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    pending_scatter_kernel(const dispatch_state s, const std::uint64_t* __restrict__ d_sorted_keys,
                           const std::int32_t* __restrict__ d_sorted_vals, int key_bits) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  for (std::int64_t i = global_id(); i < s.n; i += grid_stride()) {
    const std::int32_t a = d_sorted_vals[i];
    s.scratch.d_pending[i] = a;
    s.scratch.d_pos[a] = (d_sorted_keys[i] >> key_bits) == 0 ? static_cast<std::int32_t>(i) : -1;
  }
  if (global_id() == 0)
    *s.scratch.d_num_pending = lower_bound_group(d_sorted_keys, s.n, key_bits, 1);
}

/// group_first[q] / group_last[q] = the first / last position of capacity group q's dropped
/// assignments in the reroute order (left at -1 for a group with none).
template <int Threads>
__global__ void __launch_bounds__(Threads) pending_groups_kernel(const dispatch_state s) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const dispatch_scratch& w = s.scratch;
  const std::int64_t np = *w.d_num_pending;
  for (std::int64_t p = global_id(); p < np; p += grid_stride()) {
    const std::int64_t q = group_of(s, w.d_pending[p]);
    if (p == 0 || group_of(s, w.d_pending[p - 1]) != q)
      w.d_group_first[q] = static_cast<std::int32_t>(p);
    if (p == np - 1 || group_of(s, w.d_pending[p + 1]) != q)
      w.d_group_last[q] = static_cast<std::int32_t>(p);
  }
}

// ----- fallback policy ---------------------------------------------------------------------

/// per_token[t] = the token's first dropped assignment in reroute order (-1 if none).
template <int Threads>
__global__ void __launch_bounds__(Threads) fallback_first_kernel(const dispatch_state s) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const std::int32_t k = s.k;
  for (std::int64_t t = global_id(); t < s.tokens; t += grid_stride()) {
    std::int32_t best = -1, best_pos = 0;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int32_t p = s.scratch.d_pos[t * k + j];
      if (p >= 0 && (best < 0 || p < best_pos)) {
        best = static_cast<std::int32_t>(t * k + j);
        best_pos = p;
      }
    }
    s.scratch.d_per_token[t] = best;
  }
}

/// Classifies every dropped assignment: 2 = its token already holds the target (shares that
/// slot), 1 = the token's first dropped assignment (competes for a new slot), 0 = a later one
/// of the same token (follows the first). class -> vals_a, flags[p] = (class == 1) for the scan.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    fallback_classify_kernel(const dispatch_state s, std::int32_t target) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const std::int32_t k = s.k;
  const std::int64_t np = *s.scratch.d_num_pending;
  for (std::int64_t p = global_id(); p < s.n; p += grid_stride()) {
    std::int32_t cls = 0;
    if (p < np) {
      const std::int32_t a = s.scratch.d_pending[p];
      const std::int64_t t = a / k;
      bool covered = false;
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int64_t b = t * k + j;
        if (s.out.d_fate[b] == fate::kept && s.out.d_expert[b] == target) covered = true;
      }
      cls = covered ? 2 : (s.scratch.d_per_token[t] == a ? 1 : 0);
    }
    s.scratch.d_vals_a[p] = cls;
    s.scratch.d_flags[p] = cls == 1 ? 1 : 0;
  }
}

/// Competitors of capacity group q before the reroute-order position of its first dropped
/// assignment: subtracted from the inclusive scan to rank competitors inside their group.
__device__ inline std::int64_t competitors_before(const dispatch_state& s, std::int64_t q) {
  const std::int32_t first = s.scratch.d_group_first[q];
  return first > 0 ? s.scratch.d_flags[first - 1] : 0;
}

/// Grants: in each capacity group the first `room` competitors (inclusive scan rank in flags,
/// less the competitors of earlier groups) get new slots; shares and followers take their
/// outcome from the token. Slots of shares are resolved later.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    fallback_grant_kernel(const dispatch_state s, std::int32_t target, bool dedicated) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const dispatch_scratch& w = s.scratch;
  const std::int64_t np = *w.d_num_pending;
  const std::int64_t cap = dedicated ? s.out.d_totals->fallback_capacity : s.out.d_totals->capacity;
  for (std::int64_t p = global_id(); p < np; p += grid_stride()) {
    const std::int32_t a = w.d_pending[p];
    const std::int32_t cls = w.d_vals_a[p];
    const std::int64_t q = group_of(s, a);
    const std::int64_t load = w.d_vload[q * s.total_experts + target];
    const std::int64_t before = competitors_before(s, q);
    bool rerouted = cls == 2;
    if (cls == 1) {
      const std::int64_t rank = w.d_flags[p] - 1 - before;
      if (has_room(cap, load, rank)) {
        rerouted = true;
        s.out.d_slot[a] = static_cast<std::int32_t>(load + rank);
        w.d_holder[a] = 1;
      }
    } else if (cls == 0) {
      const std::int32_t first = w.d_per_token[a / s.k];
      rerouted = has_room(cap, load, w.d_flags[w.d_pos[first]] - 1 - before);
    }
    if (rerouted) {
      s.out.d_fate[a] = fate::rerouted;
      s.out.d_expert[a] = target;
    }
  }
}

/// Per capacity group: load[group, target] += competitors granted; load[target] gets the sum
/// (integer atomics: the total does not depend on the order they land in).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    fallback_load_kernel(const dispatch_state s, std::int32_t target, bool dedicated) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const dispatch_scratch& w = s.scratch;
  const std::int64_t cap = dedicated ? s.out.d_totals->fallback_capacity : s.out.d_totals->capacity;
  for (std::int64_t q = global_id(); q < s.groups; q += grid_stride()) {
    if (w.d_group_first[q] < 0) continue;
    const std::int64_t competitors = w.d_flags[w.d_group_last[q]] - competitors_before(s, q);
    std::int64_t& load = w.d_vload[q * s.total_experts + target];
    const std::int64_t granted = granted_count(cap, load, competitors);
    load += granted;
    if (granted > 0) add_count(&s.out.d_load[target], granted);
  }
}

// ----- next_choice policy ------------------------------------------------------------------

/// One reroute round, step 1: each still-dropped assignment (in reroute order) takes its
/// token's next untried candidate. The m-th still-dropped assignment of a token in this round
/// gets candidate next[t] + m, if that is < R. Sort input: key = the (capacity group, target)
/// segment q * ET + c (groups * ET = no attempt).
template <int Threads>
__global__ void __launch_bounds__(Threads) next_choice_attempt_kernel(const dispatch_state s) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const dispatch_scratch& w = s.scratch;
  const std::int32_t k = s.k, R = s.reroute;
  const std::int64_t ET = s.total_experts;
  const std::int64_t np = *w.d_num_pending;
  for (std::int64_t p = global_id(); p < s.n; p += grid_stride()) {
    auto target = static_cast<std::uint64_t>(s.groups * ET);
    if (p < np) {
      const std::int32_t a = w.d_pending[p];
      if (s.out.d_fate[a] == fate::dropped) {
        const std::int64_t t = a / k;
        std::int32_t m = 0;
        for (std::int32_t j = 0; j < k; ++j) {
          const std::int64_t b = t * k + j;
          const std::int32_t pb = w.d_pos[b];
          if (b != a && pb >= 0 && pb < p && s.out.d_fate[b] == fate::dropped) ++m;
        }
        const std::int64_t idx = static_cast<std::int64_t>(w.d_per_token[t]) + m;
        if (idx < R)
          target = static_cast<std::uint64_t>(group_of_token(s, t) * ET +
                                              s.gated.d_reroute_ids[t * R + idx]);
      }
    }
    w.d_keys_a[p] = target;
    w.d_vals_a[p] = static_cast<std::int32_t>(p);
  }
}

/// Step 2: next[t] advances by the token's still-dropped assignments, up to R.
template <int Threads>
__global__ void __launch_bounds__(Threads) next_choice_advance_kernel(const dispatch_state s) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const std::int32_t k = s.k;
  for (std::int64_t t = global_id(); t < s.tokens; t += grid_stride()) {
    std::int64_t nd = 0;
    for (std::int32_t j = 0; j < k; ++j)
      if (s.scratch.d_pos[t * k + j] >= 0 && s.out.d_fate[t * k + j] == fate::dropped) ++nd;
    const std::int64_t next = s.scratch.d_per_token[t] + nd;
    s.scratch.d_per_token[t] = static_cast<std::int32_t>(next < s.reroute ? next : s.reroute);
  }
}

/// Step 3 (after a stable sort by segment): the first room attempts at (group, c) get new
/// slots (local to the group until rebase_kernel).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    next_choice_grant_kernel(const dispatch_state s,
                             const std::uint64_t* __restrict__ d_sorted_keys,
                             const std::int32_t* __restrict__ d_sorted_vals) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const std::int32_t* seg = s.scratch.d_seg;
  const std::int64_t C = s.out.d_totals->capacity;
  const std::int64_t attempts = seg[s.groups * s.total_experts];
  for (std::int64_t i = global_id(); i < attempts; i += grid_stride()) {
    const auto v = static_cast<std::int64_t>(d_sorted_keys[i]);
    const std::int64_t rank = i - seg[v];
    const std::int64_t load = s.scratch.d_vload[v];
    if (has_room(C, load, rank)) {
      const std::int32_t a = s.scratch.d_pending[d_sorted_vals[i]];
      s.out.d_fate[a] = fate::rerouted;
      s.out.d_expert[a] = static_cast<std::int32_t>(v % s.total_experts);
      s.out.d_slot[a] = static_cast<std::int32_t>(load + rank);
      s.scratch.d_holder[a] = 1;
    }
  }
}

/// Step 4: load[group, c] += granted there, load[c] += the same (integer atomics); a round
/// with any attempt counts in reroute_rounds.
template <int Threads>
__global__ void __launch_bounds__(Threads) next_choice_load_kernel(const dispatch_state s) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const std::int32_t* seg = s.scratch.d_seg;
  const std::int64_t C = s.out.d_totals->capacity;
  const std::int64_t ET = s.total_experts, segments = s.groups * ET;
  for (std::int64_t v = global_id(); v < segments; v += grid_stride()) {
    const std::int64_t granted = granted_count(C, s.scratch.d_vload[v], seg[v + 1] - seg[v]);
    s.scratch.d_vload[v] += granted;
    if (granted > 0) add_count(&s.out.d_load[v % ET], granted);
  }
  if (global_id() == 0 && seg[segments] > 0) s.out.d_totals->reroute_rounds += 1;
}

// ----- slot numbering, shares, weights, counts ---------------------------------------------

/// Capacity groups: group_base[q, e] = the slots expert e fills in groups before q.
template <int Threads>
__global__ void __launch_bounds__(Threads) group_base_kernel(const dispatch_state s) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const std::int64_t ET = s.total_experts;
  for (std::int64_t e = global_id(); e < ET; e += grid_stride()) {
    std::int64_t base = 0;
    for (std::int64_t q = 0; q < s.groups; ++q) {
      s.scratch.d_group_base[q * ET + e] = base;
      base += s.scratch.d_vload[q * ET + e];
    }
  }
}

/// Capacity groups: a holder's local slot becomes dense over the batch (group q's slots of an
/// expert follow those of groups < q), as reference::dispatch numbers them.
template <int Threads>
__global__ void __launch_bounds__(Threads) rebase_kernel(const dispatch_state s) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  for (std::int64_t a = global_id(); a < s.n; a += grid_stride()) {
    if (!s.scratch.d_holder[a]) continue;
    s.out.d_slot[a] = static_cast<std::int32_t>(
        s.out.d_slot[a] +
        s.scratch.d_group_base[group_of(s, a) * s.total_experts + s.out.d_expert[a]]);
  }
}

/// Sort input for token-index numbering: holders keyed by their expert (others last). Capacity
/// groups are runs of tokens, so the rank by token index is dense across them too.
template <int Threads>
__global__ void __launch_bounds__(Threads) holder_keys_kernel(const dispatch_state s) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  for (std::int64_t a = global_id(); a < s.n; a += grid_stride()) {
    s.scratch.d_keys_a[a] =
        static_cast<std::uint64_t>(s.scratch.d_holder[a] ? s.out.d_expert[a] : s.total_experts);
    s.scratch.d_vals_a[a] = static_cast<std::int32_t>(a);
  }
}

/// slot of a holder = its rank by assignment (= token) index inside its expert.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    renumber_kernel(const dispatch_state s, const std::uint64_t* __restrict__ d_sorted_keys,
                    const std::int32_t* __restrict__ d_sorted_vals) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const std::int32_t* seg = s.scratch.d_seg;
  const std::int64_t holders = seg[s.total_experts];
  for (std::int64_t i = global_id(); i < holders; i += grid_stride()) {
    const std::int32_t e = static_cast<std::int32_t>(d_sorted_keys[i]);
    s.out.d_slot[d_sorted_vals[i]] = static_cast<std::int32_t>(i - seg[e]);
  }
}

/// A rerouted assignment that does not hold its slot shares the one its token holds there.
template <int Threads>
__global__ void __launch_bounds__(Threads) follower_slot_kernel(const dispatch_state s) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  const std::int32_t k = s.k;
  for (std::int64_t a = global_id(); a < s.n; a += grid_stride()) {
    const std::int32_t e = s.out.d_expert[a];
    if (e < 0 || s.scratch.d_holder[a]) continue;
    const std::int64_t t = a / k;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t b = t * k + j;
      if (s.scratch.d_holder[b] && s.out.d_expert[b] == e) {
        s.out.d_slot[a] = s.out.d_slot[b];
        break;
      }
    }
  }
}

namespace dispatch_detail {

/// Combine weights of token t: the surviving gates, renormalised after drop when asked. The
/// sum runs in rank order in float; every operation is a single rounding (as the reference).
__device__ inline void token_weights(const dispatch_state& s, std::int64_t t, bool after_drop,
                                     float scaling) {
  const std::int32_t k = s.k;
  const float* gates = s.gated.d_gates;
  float sum = 0.0f;
  for (std::int32_t j = 0; j < k; ++j)
    if (holds_row(s.out.d_fate[t * k + j])) sum = __fadd_rn(sum, gates[t * k + j]);
  const float denom = sum < FLT_EPSILON ? FLT_EPSILON : sum;  // std::max(sum, FLT_EPSILON)
  for (std::int32_t j = 0; j < k; ++j) {
    const std::int64_t a = t * k + j;
    float w = 0.0f;
    if (holds_row(s.out.d_fate[a]))
      w = after_drop ? __fmul_rn(__fdiv_rn(gates[a], denom), scaling) : gates[a];
    s.out.d_weight[a] = w;
  }
}

}  // namespace dispatch_detail

/// Combine weights of every token (token_weights).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    dispatch_weights_kernel(const dispatch_state s, bool after_drop, float scaling) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  for (std::int64_t t = global_id(); t < s.tokens; t += grid_stride())
    token_weights(s, t, after_drop, scaling);
}

/// Per-block tallies of the final fates, added to the global counters once per block.
struct fate_tally {
  // [E] each: kept, rerouted away from, dropped at, skipped-second requests at the chosen
  // expert; [ET]: rerouted to. Null: straight to the global counters (too many experts for
  // shared memory).
  std::int32_t *kept = nullptr, *rerouted = nullptr, *dropped = nullptr, *skipped = nullptr,
               *received = nullptr;
  int totals[5] = {0, 0, 0, 0, 0};  // kept, rerouted, dropped, masked, invalid tokens: this
                                    // thread's
};

/// Shared-memory bytes of a block's tallies (dispatch_stats_kernel's dynamic shared memory).
[[nodiscard]] constexpr std::size_t fate_tally_bytes(std::int32_t experts,
                                                     std::int32_t total_experts) {
  return (4 * static_cast<std::size_t>(experts) + static_cast<std::size_t>(total_experts)) * 4;
}

/// Widest expert count whose tallies go through shared memory (24 KiB at 1024 + 1 experts).
inline constexpr std::int32_t tally_max_experts = 1024;

namespace dispatch_detail {

/// Carves the tallies from `smem` (null: no shared tallies) and zeroes them. Block-wide; the
/// caller syncs before the first count.
__device__ inline fate_tally begin_tally(const dispatch_state& s, std::int32_t* smem, int threads) {
  fate_tally t;
  if (smem == nullptr) return t;
  const std::int32_t E = s.experts;
  t.kept = smem;
  t.rerouted = smem + E;
  t.dropped = smem + 2 * E;
  t.skipped = smem + 3 * E;
  t.received = smem + 4 * E;
  for (std::int32_t i = threadIdx.x; i < 4 * E + s.total_experts; i += threads) smem[i] = 0;
  return t;
}

__device__ inline void bump(std::int32_t* shared, std::int64_t* global, std::int32_t e) {
  if (shared != nullptr) {
    atomicAdd(&shared[e], 1);
  } else {
    add_count(&global[e], 1);
  }
}

/// Counts token t if it is real but the checks masked it (totals.invalid_tokens).
__device__ inline void tally_invalid(const dispatch_state& s, fate_tally& t, std::int64_t token) {
  if (given_real(s, token) && !token_valid(s, token)) ++t.totals[4];
}

/// Counts the final fate of assignment a (integer atomics: order-independent).
__device__ inline void tally(const dispatch_state& s, fate_tally& t, std::int64_t a) {
  const dispatch_result& o = s.out;
  const fate f = o.d_fate[a];
  const std::int32_t e = s.gated.d_ids[a];
  if (f == fate::kept) {
    ++t.totals[0];
    bump(t.kept, o.d_kept, e);
  } else if (f == fate::rerouted) {
    ++t.totals[1];
    bump(t.rerouted, o.d_rerouted, e);
    bump(t.received, o.d_received, o.d_expert[a]);
  } else if (f == fate::dropped) {
    ++t.totals[2];
    bump(t.dropped, o.d_dropped, e);
    if (second_skipped(s, a)) bump(t.skipped, o.d_requested, e);  // not in any segment
  } else {
    ++t.totals[3];
  }
}

/// Adds a block's tallies to the global counters: one atomic per nonzero (block, expert), one
/// per warp for the totals. Block-wide, every thread of the block; syncs first.
__device__ inline void end_tally(const dispatch_state& s, fate_tally& t, int threads) {
  const dispatch_result& o = s.out;
#pragma unroll
  for (int i = 0; i < 5; ++i) t.totals[i] = __reduce_add_sync(0xffffffffu, t.totals[i]);
  if ((threadIdx.x & 31) == 0) {
    std::int64_t* total[5] = {&o.d_totals->kept, &o.d_totals->rerouted, &o.d_totals->dropped,
                              &o.d_totals->masked, &o.d_totals->invalid_tokens};
#pragma unroll
    for (int i = 0; i < 5; ++i)
      if (t.totals[i]) add_count(total[i], t.totals[i]);
  }
  if (t.kept == nullptr) return;
  __syncthreads();
  for (std::int32_t e = threadIdx.x; e < s.experts; e += threads) {
    if (t.kept[e]) add_count(&o.d_kept[e], t.kept[e]);
    if (t.rerouted[e]) add_count(&o.d_rerouted[e], t.rerouted[e]);
    if (t.dropped[e]) add_count(&o.d_dropped[e], t.dropped[e]);
    if (t.skipped[e]) add_count(&o.d_requested[e], t.skipped[e]);
  }
  for (std::int32_t e = threadIdx.x; e < s.total_experts; e += threads)
    if (t.received[e]) add_count(&o.d_received[e], t.received[e]);
}

}  // namespace dispatch_detail

/// Per-expert and total counts from the final fates, tallied per block in shared memory when
/// `shared` (dynamic shared memory: fate_tally_bytes). The check kernel zeroed the counters;
/// requested is written by the capacity kernel.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    dispatch_stats_kernel(const dispatch_state s, bool shared) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  fate_tally t = begin_tally(s, shared ? dynamic_shared<std::int32_t>() : nullptr, Threads);
  __syncthreads();
  for (std::int64_t a = global_id(); a < s.n; a += grid_stride()) tally(s, t, a);
  for (std::int64_t token = global_id(); token < s.tokens; token += grid_stride())
    tally_invalid(s, t, token);
  end_tally(s, t, Threads);
}

}  // namespace moeroute::kernels
