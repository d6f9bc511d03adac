// SPDX-License-Identifier: Apache-2.0
// CPU backend: capacity assignment. Every (token, choice) assignment gets a fate, a final
// expert, a slot and a combine weight, with the per-expert counts and the batch totals: the
// operation and params of cuda::dispatch, the results of reference::dispatch, bit for bit.
//
// How: the valid assignments are put in priority order once — a stable LSD radix sort of
// their 32-bit priority value (score, random draw or token priority) over the base order
// (token-major or choice-major), then a stable counting sort by choice rank
// (batch_prioritized) and by capacity group — O(T k) with a fixed number of passes. Walking
// that order grants slots (each expert's queue is its sub-sequence, already in order); the
// dropped ones, in the same order, are the reroute order. No comparison sort anywhere.
//
// When nothing else reads that order — one capacity group, no reroutes, and token-major
// priority, choice-major with slots in grant order, or a value-keyed one (score_per_expert,
// random) with slots by token index (Megatron's "probs" dropping) — only *which* C requests
// each expert keeps matters: dispatch_by_selection.hpp, no sort at all, parallel over tokens
// (and over experts). The ordered path runs on the calling thread.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/cpu/dispatch_by_selection.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/dispatch.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cpu {

using moeroute::dispatch_params;

namespace detail {

/// validate() without the values: config, shapes, pointers, the assignment limit.
[[nodiscard]] inline status validate_shapes(const routing_config& cfg, const dispatch_params& p) {
  if (auto s = check_params(cfg, p); !s) return s;
  const std::int64_t n = p.tokens * cfg.top_k;
  if (n > std::numeric_limits<std::int32_t>::max() - 1)
    return status::make(status_code::unsupported,
                        "tokens * top_k = " + std::to_string(n) +
                            ": cpu::dispatch handles at most 2^31 - 2 assignments");
  return status::success();
}

/// validate()'s checks of the values (shapes already checked).
[[nodiscard]] inline status validate_values(const routing_config& cfg, const dispatch_params& p) {
  const std::int64_t n = p.tokens * cfg.top_k;
  const std::int32_t E = cfg.num_experts;
  const auto bad = [](const char* what, std::int64_t i, const char* why) {
    return status::make(status_code::invalid_argument,
                        std::string(what) + "[" + std::to_string(i) + "] " + why);
  };
  for (std::int64_t a = 0; a < n; ++a) {
    if (p.gated.d_ids[a] < 0 || p.gated.d_ids[a] >= E)
      return bad("gated.d_ids", a, "is outside [0, num_experts)");
    if (!std::isfinite(p.gated.d_gates[a])) return bad("gated.d_gates", a, "is not finite");
  }
  const std::int64_t R = cfg.candidates_per_token() - cfg.top_k;
  for (std::int64_t i = 0; i < p.tokens * R; ++i)
    if (p.gated.d_reroute_ids[i] < 0 || p.gated.d_reroute_ids[i] >= E)
      return bad("gated.d_reroute_ids", i, "is outside [0, num_experts)");
  if (cfg.dispatch.prio == priority::batch_prioritized)
    for (std::int64_t t = 0; t < p.tokens; ++t)
      if (!std::isfinite(p.gated.d_token_priority[t]))
        return bad("gated.d_token_priority", t, "is not finite");
  return status::success();
}

}  // namespace detail

/// @brief Checks config, shapes and pointers (check_params), at most 2^31 - 2 assignments, and
///        the gating outputs it reads: ids and reroute ids in [0, E), finite gates and token
///        priorities. Names the first bad field and element.
[[nodiscard]] inline status validate(const routing_config& cfg, const dispatch_params& p) {
  if (auto s = detail::validate_shapes(cfg, p); !s) return s;
  return detail::validate_values(cfg, p);
}

namespace detail {

/// The dispatch workspace, carved in one fixed sequence (sizing and carving passes agree).
struct dispatch_space {
  std::int32_t* order = nullptr;         // [n] valid assignments in priority order
  std::int32_t* scratch = nullptr;       // [n] radix sort ping-pong
  std::uint32_t* key = nullptr;          // [n] 32-bit priority keys (ascending = first)
  std::uint32_t* key_scratch = nullptr;  // [n]
  std::int64_t* held = nullptr;          // [Q * ET] slots held in (group, expert)
  std::int64_t* base = nullptr;          // [Q * ET] first slot of (group, expert)
  std::uint8_t* owns = nullptr;          // [n] 1 = the assignment owns its slot (not shared)
  std::int32_t* next = nullptr;          // [T] next reroute candidate per token
  std::int64_t* histogram = nullptr;  // [max(radix_passes * (radix_digits + 1), Q + 1, k + 1, E)]
  selection_space selection;          // keeps_by_selection only (nothing else is carved)
};

inline constexpr int radix_bits = 11;  // three passes of 11 bits cover a 32-bit key
inline constexpr int radix_passes = 3;
inline constexpr std::int64_t radix_digits = std::int64_t{1} << radix_bits;

inline dispatch_space carve_dispatch_space(workspace_carver& w, const routing_config& cfg,
                                           std::int64_t tokens) {
  const std::size_t n = static_cast<std::size_t>(tokens * cfg.top_k);
  const std::size_t cells =
      static_cast<std::size_t>(cfg.capacity_groups(tokens) * cfg.total_experts());
  const std::size_t hist = static_cast<std::size_t>(
      std::max<std::int64_t>({radix_passes * (radix_digits + 1), cfg.capacity_groups(tokens) + 1,
                              cfg.top_k + 1, cfg.num_experts}));
  dispatch_space s;
  if (keeps_by_selection(cfg, tokens)) {
    s.selection = carve_selection_space(w, cfg, tokens);
    return s;
  }
  s.order = w.take<std::int32_t>(n);
  s.scratch = w.take<std::int32_t>(n);
  s.key = w.take<std::uint32_t>(n);
  s.key_scratch = w.take<std::uint32_t>(n);
  s.held = w.take<std::int64_t>(cells);
  s.base = w.take<std::int64_t>(cells);
  s.owns = w.take<std::uint8_t>(n);
  s.next = w.take<std::int32_t>(static_cast<std::size_t>(tokens));
  s.histogram = w.take<std::int64_t>(hist);
  return s;
}

/// Stable counting sort of m items by digit(item) in [0, digits): from `in` to `out`.
template <class Digit, class Move>
void counting_pass(std::int64_t m, std::int64_t digits, std::int64_t* count, Digit digit,
                   Move move) {
  std::fill(count, count + digits + 1, std::int64_t{0});
  for (std::int64_t i = 0; i < m; ++i) ++count[digit(i) + 1];
  for (std::int64_t d = 0; d < digits; ++d) count[d + 1] += count[d];
  for (std::int64_t i = 0; i < m; ++i) move(i, count[digit(i)]++);
}

/// @brief invalid_argument naming the first repeated expert of a token: among its ids, or
///        its reroute candidates and ids. `stamp` [E] is scratch (ids are in range: validate()).
[[nodiscard]] inline status check_distinct(const dispatch_params& p, std::int64_t T, std::int32_t E,
                                           std::int32_t k, std::int32_t R, std::int64_t* stamp) {
  const std::int32_t* ids = p.gated.d_ids;
  const std::int32_t* reroute = p.gated.d_reroute_ids;
  std::fill(stamp, stamp + E, std::int64_t{-1});
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int32_t e = ids[t * k + j];
      if (stamp[e] == t)
        return status::make(status_code::invalid_argument,
                            "gated.d_ids[" + std::to_string(t * k + j) +
                                "] = " + std::to_string(e) + ": token " + std::to_string(t) +
                                " names that expert twice (a token's k experts are distinct)");
      stamp[e] = t;
    }
    for (std::int32_t r = 0; r < R; ++r) {
      const std::int32_t e = reroute[t * R + r];
      if (stamp[e] == t)
        return status::make(status_code::invalid_argument,
                            "gated.d_reroute_ids[" + std::to_string(t * R + r) +
                                "] = " + std::to_string(e) + ": token " + std::to_string(t) +
                                " already names that expert (its k + R candidates are distinct)");
      stamp[e] = t;
    }
  }
  return status::success();
}

}  // namespace detail

/// @brief Workspace bytes cpu::dispatch needs for `tokens` tokens under `cfg` (0 for T <= 0).
[[nodiscard]] inline std::size_t dispatch_workspace_bytes(const routing_config& cfg,
                                                          std::int64_t tokens) {
  if (tokens <= 0) return 0;
  workspace_carver w;
  (void)detail::carve_dispatch_space(w, cfg, tokens);
  return w.bytes();
}

/// @brief Capacity assignment for a batch on the CPU: bit-identical to reference::dispatch
///        (fates, experts, slots, counts, totals and weights), with the params of
///        cuda::dispatch (host pointers).
/// @param workspace at least dispatch_workspace_bytes(cfg, p.tokens) bytes, 8-byte aligned
/// @param ex        runs the selection path's tasks (keeps_by_selection: over tokens, then over
///                  the over-subscribed experts); the ordered path runs on the calling thread
/// @return success; invalid_* naming the field (validate()); unsupported beyond 2^31 - 2
///         assignments; workspace_too_small.
/// @note Synchronous; never allocates or throws. T = 0: success, nothing written. Grants in
///       priority order per expert (ties: lower token, then lower choice rank), reroutes in
///       the same order group by group, slots dense per expert over the capacity groups.
[[nodiscard]] inline status dispatch(const routing_config& cfg, const dispatch_params& p,
                                     void* workspace, std::size_t workspace_bytes,
                                     const executor& ex = {}) {
  if (auto s = detail::validate_shapes(cfg, p); !s) return s;
  // the selection path checks the values in its parallel pass, the ordered one first
  const bool select = detail::keeps_by_selection(cfg, p.tokens);
  if (!select)
    if (auto s = detail::validate_values(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  if (auto s = param_checks::validate_workspace("dispatch", "dispatch_workspace_bytes", p.tokens,
                                                dispatch_workspace_bytes(cfg, p.tokens), workspace,
                                                workspace_bytes);
      !s)
    return s;
  workspace_carver carver(workspace, workspace_bytes);
  const detail::dispatch_space w = detail::carve_dispatch_space(carver, cfg, p.tokens);
  if (select) {
    if (detail::count_rows(cfg) > 1 ? detail::dispatch_by_selection<true>(cfg, p, w.selection, ex)
                                    : detail::dispatch_by_selection<false>(cfg, p, w.selection, ex))
      return status::success();
    // bad input, nothing written: the serial checks name it
    if (auto s = detail::validate_values(cfg, p); !s) return s;
    if (auto s =
            detail::check_distinct(p, p.tokens, cfg.num_experts, cfg.top_k, 0, w.selection.counts);
        !s)
      return s;
    return status::make(status_code::invalid_argument, "gated: a value cpu::dispatch rejects");
  }

  const std::int64_t T = p.tokens;
  const std::int32_t k = cfg.top_k, E = cfg.num_experts, ET = cfg.total_experts();
  const std::int64_t n = T * k;
  const auto& d = cfg.dispatch;
  const std::int64_t Q = cfg.capacity_groups(T);
  const std::int64_t GT = std::max<std::int64_t>(cfg.capacity_group_tokens(T), 1);
  const std::int32_t* ids = p.gated.d_ids;
  const float* gates = p.gated.d_gates;
  const dispatch_result& o = p.out;
  const auto valid = [&](std::int64_t t) { return p.d_valid == nullptr || p.d_valid[t] != 0; };
  // (64-bit divisions are costly: the common cases avoid them)
  const bool random_second = cfg.gating.second_expert.policy == second_expert_policy::random &&
                             p.gated.d_second_skipped != nullptr && k > 1;
  const auto skipped = [&](std::int64_t a) {
    return random_second && a % k == 1 && p.gated.d_second_skipped[a / k] != 0;
  };
  const std::int64_t per_group = std::int64_t{k} * GT;
  const auto group_of = [&](std::int64_t a) -> std::int64_t { return Q == 1 ? 0 : a / per_group; };

  // 0. a token's experts (its k ids and R reroute candidates) are distinct, as gating makes
  //    them; ids an engine chose itself may not be (O(T (k + R)), `held` as the stamp of the
  //    last token that named each expert, before anything is written)
  if (auto s = detail::check_distinct(p, T, E, k, cfg.candidates_per_token() - k, w.held); !s)
    return s;

  // 1. outputs cleared; fates; requests; valid assignments in the base order
  std::fill(o.d_requested, o.d_requested + E, std::int64_t{0});
  std::fill(o.d_kept, o.d_kept + E, std::int64_t{0});
  std::fill(o.d_rerouted, o.d_rerouted + E, std::int64_t{0});
  std::fill(o.d_received, o.d_received + ET, std::int64_t{0});
  std::fill(o.d_load, o.d_load + ET, std::int64_t{0});
  const std::size_t cells = static_cast<std::size_t>(Q * ET);
  std::fill(w.held, w.held + cells, std::int64_t{0});
  dispatch_totals totals{};
  std::int64_t m = 0;  // valid assignments
  const auto visit = [&](std::int64_t a, std::int64_t t) {
    o.d_expert[a] = -1;
    o.d_slot[a] = -1;
    o.d_weight[a] = 0.0f;
    w.owns[a] = 0;
    if (!valid(t)) {
      o.d_fate[a] = fate::masked;
      ++totals.masked;
      return;
    }
    o.d_fate[a] = fate::dropped;
    ++o.d_requested[ids[a]];
    w.order[m++] = static_cast<std::int32_t>(a);
  };
  if (d.prio == priority::choice_major) {
    for (std::int32_t j = 0; j < k; ++j)
      for (std::int64_t t = 0; t < T; ++t) visit(t * k + j, t);
  } else {
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int32_t j = 0; j < k; ++j) visit(t * k + j, t);
  }

  // 2. priority order: radix by the 32-bit value key, then by choice rank, then by group
  std::int32_t* order = w.order;
  std::int32_t* spare = w.scratch;
  const bool keyed = d.prio == priority::score_per_expert || d.prio == priority::random ||
                     d.prio == priority::batch_prioritized;
  if (keyed) {
    for (std::int64_t i = 0; i < m; ++i) w.key[i] = detail::priority_key(cfg, p, order[i]);
    // the three digit histograms in one read of the keys; a pass whose digit is the same for
    // every key would move nothing (the sort is stable), so it is skipped
    constexpr std::int64_t D = detail::radix_digits;
    constexpr std::uint32_t mask = D - 1;
    std::int64_t* hist = w.histogram;  // [radix_passes][D + 1], counts at digit + 1
    std::fill(hist, hist + detail::radix_passes * (D + 1), std::int64_t{0});
    for (std::int64_t i = 0; i < m; ++i)
      for (int pass = 0; pass < detail::radix_passes; ++pass)
        ++hist[pass * (D + 1) + ((w.key[i] >> (pass * detail::radix_bits)) & mask) + 1];
    std::uint32_t* key = w.key;
    std::uint32_t* key_spare = w.key_scratch;
    for (int pass = 0; pass < detail::radix_passes && m > 0; ++pass) {
      const int shift = pass * detail::radix_bits;
      std::int64_t* count = hist + pass * (D + 1);
      if (count[((key[0] >> shift) & mask) + 1] == m) continue;
      for (std::int64_t dg = 0; dg < D; ++dg) count[dg + 1] += count[dg];
      for (std::int64_t i = 0; i < m; ++i) {
        const std::int64_t to = count[(key[i] >> shift) & mask]++;
        spare[to] = order[i];
        key_spare[to] = key[i];
      }
      std::swap(order, spare);
      std::swap(key, key_spare);
    }
  }
  if (d.prio == priority::batch_prioritized && k > 1) {
    detail::counting_pass(
        m, k, w.histogram, [&](std::int64_t i) { return static_cast<std::int64_t>(order[i] % k); },
        [&](std::int64_t i, std::int64_t to) { spare[to] = order[i]; });
    std::swap(order, spare);
  }
  if (Q > 1) {
    detail::counting_pass(
        m, Q, w.histogram, [&](std::int64_t i) { return group_of(order[i]); },
        [&](std::int64_t i, std::int64_t to) { spare[to] = order[i]; });
    std::swap(order, spare);
  }

  // 3. capacity (capacity_mode::max_load: from the largest queue per group and expert); then
  //    grants in order
  std::int64_t max_load = 0;
  if (capacity_needs_loads(cfg)) {
    for (std::int64_t i = 0; i < m; ++i) {
      const std::int64_t a = order[i];
      if (skipped(a)) continue;
      max_load = std::max(max_load, ++w.held[group_of(a) * ET + ids[a]]);
    }
    std::fill(w.held, w.held + cells, std::int64_t{0});
  }
  const std::int64_t C = expert_capacity(cfg, T, max_load);
  totals.capacity = C;
  totals.fallback_capacity = cfg.has_dedicated_fallback() ? d.fallback.capacity : 0;
  const auto room = [&](std::int64_t q, std::int32_t e) {
    const std::int64_t cap = e < E ? C : totals.fallback_capacity;
    return cap < 0 || w.held[q * ET + e] < cap;
  };
  const auto take = [&](std::int64_t a, std::int32_t e) {  // o.d_slot: local slot for now
    std::int64_t& h = w.held[group_of(a) * ET + e];
    o.d_expert[a] = e;
    o.d_slot[a] = static_cast<std::int32_t>(h++);
    w.owns[a] = 1;
    ++o.d_load[e];
  };
  // grants in priority order (branch-free: under skew, which of an expert's requests
  // still find room is a coin toss to the branch predictor; every store below rewrites what
  // step 1 wrote when there is none)
  for (std::int64_t i = 0; i < m; ++i) {
    const std::int64_t a = order[i];
    const std::int32_t e = ids[a];
    std::int64_t& h = w.held[group_of(a) * ET + e];
    const bool ok = !skipped(a) && room(group_of(a), e);
    o.d_fate[a] = ok ? fate::kept : fate::dropped;
    o.d_expert[a] = ok ? e : -1;
    o.d_slot[a] = ok ? static_cast<std::int32_t>(h) : -1;  // local slot for now
    w.owns[a] = ok ? 1 : 0;
    h += ok ? 1 : 0;
    o.d_load[e] += ok ? 1 : 0;
    o.d_kept[e] += ok ? 1 : 0;
  }

  // 4. reroutes of the dropped ones, in the same order (group by group)
  const auto held_slot = [&](std::int64_t t, std::int32_t e) -> std::int32_t {
    for (std::int32_t j = 0; j < k; ++j)
      if (o.d_expert[t * k + j] == e) return o.d_slot[t * k + j];
    return -1;
  };
  const auto grant_reroute = [&](std::int64_t a, std::int32_t target) {
    const std::int64_t t = a / k;
    const std::int32_t shared = held_slot(t, target);
    if (shared < 0 && !room(group_of(a), target)) return;
    o.d_fate[a] = fate::rerouted;
    if (shared >= 0) {
      o.d_expert[a] = target;
      o.d_slot[a] = shared;
    } else {
      take(a, target);
    }
    ++o.d_received[target];
    ++o.d_rerouted[ids[a]];
  };
  if (d.dropped == drop_policy::fallback) {
    const std::int32_t target = d.fallback.expert < 0 ? E : d.fallback.expert;
    for (std::int64_t i = 0; i < m; ++i)
      if (o.d_fate[order[i]] == fate::dropped) grant_reroute(order[i], target);
  } else if (d.dropped == drop_policy::next_choice) {
    const std::int32_t R = cfg.candidates_per_token() - k;
    std::fill(w.next, w.next + T, 0);
    for (std::int32_t round = 0; round < R; ++round) {
      bool any = false;
      for (std::int64_t i = 0; i < m; ++i) {
        const std::int64_t a = order[i];
        if (o.d_fate[a] != fate::dropped) continue;
        const std::int64_t t = a / k;
        if (w.next[t] >= R) continue;
        any = true;
        grant_reroute(a, p.gated.d_reroute_ids[t * R + w.next[t]++]);
      }
      if (!any) break;
      ++totals.reroute_rounds;
    }
  }

  // 5. counts: every valid assignment was requested of its first choice and is kept there,
  //    rerouted from it or dropped, so the drops per expert follow from the other counts;
  //    slot numbering dense per expert over the groups (base = earlier groups' holders)
  for (std::int32_t e = 0; e < E; ++e) {
    o.d_dropped[e] = o.d_requested[e] - o.d_kept[e] - o.d_rerouted[e];
    totals.kept += o.d_kept[e];
    totals.rerouted += o.d_rerouted[e];
    totals.dropped += o.d_dropped[e];
  }
  for (std::int32_t e = 0; e < ET; ++e) {
    std::int64_t b = 0;
    for (std::int64_t q = 0; q < Q; ++q) {
      w.base[q * ET + e] = b;
      b += w.held[q * ET + e];
    }
  }
  if (d.slots == slot_order::token_index) {
    // owners get base + their rank by assignment index; a shared slot then takes the final
    // slot of its token's owner at that expert (a token owns at most one slot per expert)
    std::fill(w.held, w.held + cells, std::int64_t{0});
    for (std::int64_t a = 0; a < n; ++a) {  // (branch-free, as the grants)
      const bool own = w.owns[a] != 0;
      const std::int64_t cell = group_of(a) * ET + (own ? o.d_expert[a] : 0);
      const std::int64_t h = w.held[cell];
      o.d_slot[a] = own ? static_cast<std::int32_t>(w.base[cell] + h) : o.d_slot[a];
      w.held[cell] = h + (own ? 1 : 0);
    }
    for (std::int64_t a = 0; a < n; ++a) {
      if (!((w.owns[a] == 0) & (o.d_expert[a] >= 0))) continue;  // one branch, rarely taken
      const std::int64_t t0 = a / k * k;
      for (std::int64_t b = t0; b < t0 + k; ++b)
        if (w.owns[b] && o.d_expert[b] == o.d_expert[a]) o.d_slot[a] = o.d_slot[b];
    }
  } else if (Q > 1) {  // one group: every base is 0, the local slots are final
    for (std::int64_t a = 0; a < n; ++a)
      if (o.d_expert[a] >= 0)
        o.d_slot[a] =
            static_cast<std::int32_t>(w.base[group_of(a) * ET + o.d_expert[a]] + o.d_slot[a]);
  }

  // 6. combine weights (the reference's arithmetic, in rank order)
  if (cfg.gating.renorm == renormalize::after_drop) {
    for (std::int64_t t = 0; t < T; ++t)
      detail::renormalized_weights(cfg, o.d_fate + t * k, gates + t * k, o.d_weight + t * k);
  } else {
    for (std::int64_t a = 0; a < n; ++a) o.d_weight[a] = holds_row(o.d_fate[a]) ? gates[a] : 0.0f;
  }
  *o.d_totals = totals;
  return status::success();
}

}  // namespace moeroute::cpu
