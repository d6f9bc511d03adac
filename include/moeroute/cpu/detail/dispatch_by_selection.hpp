// SPDX-License-Identifier: Apache-2.0
// CPU backend: cpu::dispatch when the kept set alone decides every output (keeps_by_selection:
// one capacity group, no reroutes, and token-major priority — the plain loop of Switch,
// Mixtral, Qwen3, OLMoE, DeepSeek-V3 with a capacity — or choice-major priority with slots in
// grant order — GShard / DeepSpeed / Tutel top-2 — or a value-keyed priority with slots by
// token index: Megatron's "probs" dropping, DeepSpeed's score priority). Each expert then keeps
// its C first requests in priority order: under token- and choice-major priority those of rank
// < C (by assignment index; by choice rank, then token), the rank being the slot; under a value
// key its C smallest (key, assignment) pairs (all of them when it has room). Nothing needs a global
// order, so the work splits two ways, both fixed by the shapes:
//   - over tokens (tasks of consecutive tokens): checking, counting the requests of each
//     expert per task, then writing every assignment — a request's rank among its expert's
//     (the slot of a kept one) is known from the counts of the tasks before it;
//   - value keys only: over the over-subscribed experts, a selection of the C smallest pairs,
//     then one walk of the expert's requests in assignment order to number the kept ones.
// Counts are integers summed per expert over tasks, so every output is the same for any number
// of threads, and bit-identical to reference::dispatch.
#pragma once

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/dispatch.hpp>
#include <moeroute/rng.hpp>
#include <moeroute/types.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cpu::detail {

/// True when the kept set alone decides every output (see the file comment): an expert's
/// kept requests are then its C first in priority order, found by rank or by selection, not
/// by sorting.
[[nodiscard]] inline bool keeps_by_selection(const routing_config& cfg, std::int64_t tokens) {
  const auto& d = cfg.dispatch;
  const bool random_second = cfg.gating.second_expert.policy == second_expert_policy::random;
  const bool keyed_by_token_index =
      (d.prio == priority::score_per_expert || d.prio == priority::random) &&
      d.slots == slot_order::token_index;
  const bool choices_in_grant_order =
      d.prio == priority::choice_major && d.slots == slot_order::priority;
  return (d.prio == priority::token_major || choices_in_grant_order || keyed_by_token_index) &&
         cfg.capacity_groups(tokens) == 1 && !random_second &&
         (d.dropped == drop_policy::zero_weight || d.dropped == drop_policy::residual);
}

/// A float as a 32-bit key whose unsigned order is the float order *descending* (larger value
/// first); -0 and +0 are one key, as they compare equal.
[[nodiscard]] inline std::uint32_t descending_key(float x) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x + 0.0f);
  const std::uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ascending;
}

/// The 32-bit priority key of assignment a (ascending = served first) for the value-keyed
/// priorities: its gate, its random draw, or its token's priority.
[[nodiscard]] inline std::uint32_t priority_key(const routing_config& cfg, const dispatch_params& p,
                                                std::int64_t a) {
  const auto& d = cfg.dispatch;
  const std::int32_t k = cfg.top_k;
  float v = 0.0f;
  if (d.prio == priority::score_per_expert) {
    v = p.gated.d_gates[a];
  } else if (d.prio == priority::random) {
    v = rng::random_priority(d.random_seed, d.random_offset, a / k, cfg.num_experts,
                             p.gated.d_ids[a]);
  } else {
    v = p.gated.d_token_priority[a / k];
  }
  return descending_key(v);
}

/// @brief The (n + 1)-th smallest of m distinct pairs (key << 32 | assignment), 0 <= n < m:
///        a histogram of 2^11 buckets over the span of their keys finds the bucket that holds
///        it, and nth_element orders that bucket's pairs only (copied to scratch, room for m).
///        The same pair as nth_element over all of them, in three linear passes and a small
///        selection: a Zipf batch's over-subscribed experts (Megatron's top-2 of 64, T = 16384,
///        one thread) ~220 -> ~85 us.
[[nodiscard]] inline std::uint64_t nth_smallest(const std::uint64_t* pairs, std::int64_t m,
                                                std::int64_t n, std::uint64_t* scratch) {
  constexpr int bucket_bits = 11;
  std::uint32_t lo = UINT32_MAX, hi = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    const auto key = static_cast<std::uint32_t>(pairs[i] >> 32);
    lo = std::min(lo, key);
    hi = std::max(hi, key);
  }
  const int width = std::bit_width(hi - lo);
  const int shift = width > bucket_bits ? width - bucket_bits : 0;
  const auto bucket_of = [&](std::uint64_t q) {
    return (static_cast<std::uint32_t>(q >> 32) - lo) >> shift;
  };
  std::uint32_t count[std::int64_t{1} << bucket_bits] = {};  // (m < 2^32: the pairs' 32 bits)
  for (std::int64_t i = 0; i < m; ++i) ++count[bucket_of(pairs[i])];
  std::int64_t below = 0;  // pairs in the buckets before b
  std::uint32_t b = 0;
  while (below + count[b] <= n) below += count[b++];
  std::int64_t c = 0;
  for (std::int64_t i = 0; i < m; ++i)
    if (bucket_of(pairs[i]) == b) scratch[c++] = pairs[i];
  std::nth_element(scratch, scratch + (n - below), scratch + c);
  return scratch[n - below];
}

/// @brief One token's combine weights under renormalize::after_drop: its gates over the sum of
///        those that hold a row (in rank order, the reference's arithmetic), 0 for the others.
inline void renormalized_weights(const routing_config& cfg, const fate* fates, const float* gates,
                                 float* weight) noexcept {
  const std::int32_t k = cfg.top_k;
  float sum = 0.0f;
  for (std::int32_t j = 0; j < k; ++j)
    if (holds_row(fates[j])) sum += gates[j];
  for (std::int32_t j = 0; j < k; ++j)
    weight[j] = holds_row(fates[j])
                    ? gates[j] / std::max(sum, FLT_EPSILON) * cfg.gating.scaling_factor
                    : 0.0f;
}

/// True when a request's rank among its expert's decides whether it is kept (token-major and
/// choice-major priority: no pairs, no selection); else value keys pick the kept ones.
[[nodiscard]] inline bool kept_by_rank(const routing_config& cfg) noexcept {
  return cfg.dispatch.prio == priority::token_major || cfg.dispatch.prio == priority::choice_major;
}

/// Count rows per task: one per choice rank under choice-major priority (a request's rank
/// among its expert's counts every lower choice rank first), else one.
[[nodiscard]] inline std::int32_t count_rows(const routing_config& cfg) noexcept {
  return cfg.dispatch.prio == priority::choice_major ? cfg.top_k : 1;
}

/// Tasks of consecutive tokens for the selection path (fixed by T alone).
[[nodiscard]] inline std::int64_t selection_tasks(std::int64_t tokens) noexcept {
  return task_count(tokens, 1024, 64);
}

/// The selection path's workspace.
struct selection_space {
  // per task, task_gap_bytes apart (cpu/parallel.hpp: each task counts every token)
  std::int64_t* counts = nullptr;  // [tasks, counts_stride] requests per (choice rank or 1,
                                   // expert), then offsets: count_rows * E used
  std::int64_t* stamps = nullptr;  // [tasks, stamps_stride] the last token of the task naming
                                   // each expert: E used
  std::int64_t* masked = nullptr;  // [tasks, masked_stride] masked tokens per task; -1: the
                                   // task saw bad input
  std::size_t counts_stride = 0, stamps_stride = 0, masked_stride = 0;
  std::uint64_t* pairs = nullptr;   // [n] (key << 32 | assignment) of over-subscribed experts
  std::uint64_t* picked = nullptr;  // [n] scratch of the selection (nth_smallest)
  std::int64_t* bucket = nullptr;   // [E + 1] first pair of each expert
  std::int32_t* heavy = nullptr;    // [E] over-subscribed experts, most requests first
};

inline selection_space carve_selection_space(workspace_carver& w, const routing_config& cfg,
                                             std::int64_t tokens) {
  const std::size_t n = static_cast<std::size_t>(tokens * cfg.top_k);
  const std::size_t E = static_cast<std::size_t>(cfg.num_experts);
  const std::size_t tasks = static_cast<std::size_t>(selection_tasks(tokens));
  const std::size_t keyed = kept_by_rank(cfg) ? 0 : n;  // pairs
  selection_space s;
  s.counts_stride = task_stride<std::int64_t>(static_cast<std::size_t>(count_rows(cfg)) * E);
  s.stamps_stride = task_stride<std::int64_t>(E);
  s.masked_stride = task_stride<std::int64_t>(1);
  s.counts = w.take<std::int64_t>(tasks * s.counts_stride);
  s.stamps = w.take<std::int64_t>(tasks * s.stamps_stride);
  s.masked = w.take<std::int64_t>(tasks * s.masked_stride);
  s.pairs = w.take<std::uint64_t>(keyed);
  s.picked = w.take<std::uint64_t>(keyed);
  s.bucket = w.take<std::int64_t>(E + 1);
  s.heavy = w.take<std::int32_t>(E);
  return s;
}

/// @brief The selection path of cpu::dispatch (keeps_by_selection(cfg, T), T > 0, shapes
///        checked), PerChoice = (count_rows(cfg) > 1): compiled apart, as a count row looked
///        up per assignment slowed the token-major walk by a quarter. Checks the values it reads
///        as it counts; on bad input returns false with nothing written, and the caller names
///        the fault with the serial checks.
template <bool PerChoice>
[[nodiscard]] bool dispatch_by_selection(const routing_config& cfg, const dispatch_params& p,
                                         const selection_space& w, const executor& ex) {
  const std::int64_t T = p.tokens;
  const std::int32_t k = cfg.top_k, E = cfg.num_experts, ET = cfg.total_experts();
  const std::int64_t tasks = selection_tasks(T);
  const std::int64_t K = PerChoice ? k : 1;
  const std::int32_t* ids = p.gated.d_ids;
  const float* gates = p.gated.d_gates;
  const dispatch_result& o = p.out;
  const bool renorm_after = cfg.gating.renorm == renormalize::after_drop;

  // 1. per task: check ids (in range, distinct per token) and gates (finite) of every token,
  //    count the requests of the valid ones per expert. The range and finiteness checks are
  //    one branch-free pass over the task's assignments (vectorised), ahead of the counting:
  //    per token they were nearly half of Megatron's top-2 of 64 experts (this step 65 -> 32-40
  //    us of a 140 us dispatch at T = 16384, one thread; docs/performance.md, session 38).
  parallel_for(ex, tasks, [&](std::int64_t task) {
    std::int64_t t0 = 0, t1 = 0;
    task_range(T, tasks, task, t0, t1);
    std::int64_t* const count = w.counts + task * w.counts_stride;
    std::int64_t* const stamp = w.stamps + task * w.stamps_stride;
    const std::int32_t* const id_of = ids;
    const float* const gate_of = gates;
    const std::uint8_t* const valid_of = p.d_valid;
    const std::int32_t kk = k;
    const auto experts = static_cast<std::uint32_t>(E);
    std::fill(count, count + K * E, std::int64_t{0});
    std::fill(stamp, stamp + E, std::int64_t{-1});
    std::uint32_t bad = 0;
    for (std::int64_t a = t0 * kk; a < t1 * kk; ++a) {
      const std::uint32_t exponent = std::bit_cast<std::uint32_t>(gate_of[a]) & 0x7f800000u;
      bad |= static_cast<std::uint32_t>(static_cast<std::uint32_t>(id_of[a]) >= experts) |
             static_cast<std::uint32_t>(exponent == 0x7f800000u);
    }
    if (bad != 0) {
      w.masked[task * w.masked_stride] = -1;
      return;
    }
    std::int64_t masked = 0;
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int32_t* id = id_of + t * kk;
      // distinct when the ids' bits mod 64 are (else by stamps: the last token to name each
      // expert, O(k))
      std::uint64_t seen = 0;
      for (std::int32_t j = 0; j < kk; ++j) seen |= std::uint64_t{1} << (id[j] & 63);
      if (std::popcount(seen) != kk) {
        bool ok = true;
        for (std::int32_t j = 0; j < kk; ++j) {
          ok &= stamp[id[j]] != t;
          stamp[id[j]] = t;
        }
        if (!ok) {
          w.masked[task * w.masked_stride] = -1;
          return;
        }
      }
      if (valid_of != nullptr && valid_of[t] == 0) {
        ++masked;
        continue;
      }
      for (std::int32_t j = 0; j < kk; ++j) ++count[(PerChoice ? j * E : 0) + id[j]];
    }
    w.masked[task * w.masked_stride] = masked;
  });
  dispatch_totals totals{};
  for (std::int64_t task = 0; task < tasks; ++task) {
    if (w.masked[task * w.masked_stride] < 0) return false;
    totals.masked += w.masked[task * w.masked_stride] * k;
  }

  // 2. requests per expert; capacity; each (task, expert) count becomes where that task's
  //    requests of the expert start: its first slot (an expert with room keeps all, in
  //    assignment order), or its first pair (an over-subscribed one)
  std::int64_t max_load = 0;
  for (std::int32_t e = 0; e < E; ++e) {
    std::int64_t r = 0;
    for (std::int64_t task = 0; task < tasks; ++task)
      for (std::int64_t j = 0; j < K; ++j) r += w.counts[task * w.counts_stride + j * E + e];
    o.d_requested[e] = r;
    max_load = std::max(max_load, r);
  }
  const std::int64_t C = expert_capacity(cfg, T, max_load);
  totals.capacity = C;
  totals.fallback_capacity = cfg.has_dedicated_fallback() ? cfg.dispatch.fallback.capacity : 0;
  // (token- and choice-major: no pairs; every request's rank decides, an over-subscribed
  // expert keeping those below C)
  const bool by_rank = kept_by_rank(cfg);
  const auto over = [&](std::int32_t e) { return C >= 0 && o.d_requested[e] > C; };
  const auto paired = [&](std::int32_t e) { return !by_rank && over(e); };
  std::int32_t heavy = 0;
  w.bucket[0] = 0;
  for (std::int32_t e = 0; e < E; ++e) {
    std::int64_t at = paired(e) ? w.bucket[e] : 0;  // choice rank outer, then task
    for (std::int64_t j = 0; j < K; ++j)
      for (std::int64_t task = 0; task < tasks; ++task) {
        std::int64_t& c = w.counts[task * w.counts_stride + j * E + e];
        const std::int64_t here = c;
        c = at;
        at += here;
      }
    w.bucket[e + 1] = w.bucket[e] + (paired(e) ? o.d_requested[e] : 0);
    if (paired(e)) w.heavy[heavy++] = e;
    const std::int64_t kept = over(e) ? C : o.d_requested[e];
    o.d_kept[e] = kept;
    o.d_rerouted[e] = 0;
    o.d_dropped[e] = o.d_requested[e] - kept;
    totals.kept += kept;
    totals.dropped += o.d_requested[e] - kept;
  }
  for (std::int32_t e = 0; e < ET; ++e) {
    o.d_received[e] = 0;
    o.d_load[e] = e < E ? o.d_kept[e] : 0;
  }
  // the largest selections first, so that threads taking tasks in turn finish together
  std::stable_sort(w.heavy, w.heavy + heavy, [&](std::int32_t a, std::int32_t b) {
    return o.d_requested[a] > o.d_requested[b];
  });

  // 3. per task: every assignment written; token-major: kept while its rank is below C; value
  //    keys: an over-subscribed expert's requests become pairs (dropped until the selection
  //    keeps them)
  parallel_for(ex, tasks, [&](std::int64_t task) {
    std::int64_t t0 = 0, t1 = 0;
    task_range(T, tasks, task, t0, t1);
    std::int64_t* const at_task = w.counts + task * w.counts_stride;
    // the walk's pointers and bounds as locals: a fate is one byte, and a byte store may alias
    // anything reached through the closure, so GCC reloaded every captured pointer after each
    // (the token-major walk ~1.5x slower: 20.6 -> 14.9 % of Mixtral's routing call, profiled)
    fate* const fates = o.d_fate;
    std::int32_t* const experts = o.d_expert;
    std::int32_t* const slots = o.d_slot;
    float* const weights = o.d_weight;
    const std::int32_t* const id_of = ids;
    const float* const gate_of = gates;
    const std::uint8_t* const valid_of = p.d_valid;
    const std::int32_t kk = k;
    const std::int64_t* const requested = o.d_requested;
    const std::int64_t room = C < 0 ? INT64_MAX : C;  // slots of an expert (over(e): more asked)
    // assignment a of expert e at `rank`, kept or lost: branch-free, by masks (under skew
    // whether a request is kept is a coin toss to the branch predictor, and GCC turns
    // `keep ? x : y` here into branches)
    const auto write = [&](std::int64_t a, std::int32_t e, std::int64_t rank, bool keep,
                           std::uint32_t lost) {
      const std::uint32_t all = 0u - static_cast<std::uint32_t>(keep);  // every bit when kept
      static_assert(static_cast<std::uint32_t>(fate::kept) == 0);
      fates[a] = static_cast<fate>(lost & ~all);
      experts[a] = static_cast<std::int32_t>((static_cast<std::uint32_t>(e) & all) | ~all);
      slots[a] = static_cast<std::int32_t>((static_cast<std::uint32_t>(rank) & all) | ~all);
      weights[a] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(gate_of[a]) & all);
    };
    // (by token: no 64-bit division per assignment; a loop per kind of priority)
    if (by_rank) {
      for (std::int64_t t = t0; t < t1; ++t) {
        const bool valid = valid_of == nullptr || valid_of[t] != 0;
        const std::int64_t step = valid ? 1 : 0;
        const auto lost = static_cast<std::uint32_t>(valid ? fate::dropped : fate::masked);
        for (std::int64_t a = t * kk; a < (t + 1) * kk; ++a) {
          std::int64_t* at = PerChoice ? at_task + (a - t * kk) * E : at_task;
          const std::int32_t e = id_of[a];
          const std::int64_t rank = at[e];
          write(a, e, rank, valid & (rank < room), lost);
          at[e] = rank + step;
        }
      }
      return;
    }
    // value keys: an expert with room keeps every request, its rank the slot; an
    // over-subscribed one's requests become pairs, dropped until the selection keeps them.
    // Where many are pairs (under a Zipf batch most: a branch on whether one is would be
    // mispredicted a fifth of the time) every request's gate key is written, to `sink` when it
    // is not a pair; a branch where few are (uniform: the branch is always right, and the key
    // and its store cost more than it)
    std::uint64_t* const pairs = w.pairs;
    const bool sink_pairs =
        cfg.dispatch.prio == priority::score_per_expert && w.bucket[E] * 8 > T * k;
    std::uint64_t sink = 0;
    for (std::int64_t t = t0; t < t1; ++t) {
      const bool valid = valid_of == nullptr || valid_of[t] != 0;
      const std::int64_t step = valid ? 1 : 0;
      const auto lost = static_cast<std::uint32_t>(valid ? fate::dropped : fate::masked);
      for (std::int64_t a = t * kk; a < (t + 1) * kk; ++a) {
        const std::int32_t e = id_of[a];
        const std::int64_t rank = at_task[e];
        const bool paired_here = requested[e] > room;
        write(a, e, rank, valid & !paired_here, lost);
        if (sink_pairs) {  // (priority_key's gate key, without its switch)
          std::uint64_t* const to = (valid && paired_here) ? pairs + rank : &sink;
          *to = std::uint64_t{descending_key(gate_of[a])} << 32 | static_cast<std::uint64_t>(a);
        } else if (valid && paired_here) {
          pairs[rank] =
              std::uint64_t{priority_key(cfg, p, a)} << 32 | static_cast<std::uint64_t>(a);
        }
        at_task[e] = rank + step;
      }
    }
  });

  // 4. value keys, per over-subscribed expert: the C smallest pairs (unique: the assignment
  //    breaks ties, as the stable sort of the reference's base order would), then its requests
  //    in assignment order, the kept ones numbered
  parallel_for_uneven(ex, heavy, [&](std::int64_t i) {
    const std::int32_t e = w.heavy[i];
    if (C == 0) return;  // every request stays dropped
    const std::uint64_t* first = w.pairs + w.bucket[e];
    const std::uint64_t* last = w.pairs + w.bucket[e + 1];
    const std::uint64_t threshold =
        nth_smallest(first, last - first, C - 1, w.picked + w.bucket[e]);
    std::int32_t slot = 0;
    for (const std::uint64_t* q = first; q != last; ++q) {
      if (*q > threshold) continue;
      const std::int64_t a = static_cast<std::int64_t>(*q & 0xffffffffu);
      o.d_fate[a] = fate::kept;
      o.d_expert[a] = e;
      o.d_slot[a] = slot++;
      o.d_weight[a] = gates[a];
    }
  });

  // 5. weights renormalised over the held gates (the reference's arithmetic, in rank order)
  if (renorm_after)
    parallel_for(ex, tasks, [&](std::int64_t task) {
      std::int64_t t0 = 0, t1 = 0;
      task_range(T, tasks, task, t0, t1);
      for (std::int64_t t = t0; t < t1; ++t)
        renormalized_weights(cfg, o.d_fate + t * k, gates + t * k, o.d_weight + t * k);
    });
  *o.d_totals = totals;
  return true;
}

}  // namespace moeroute::cpu::detail
