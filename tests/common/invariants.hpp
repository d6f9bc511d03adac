// SPDX-License-Identifier: Apache-2.0
// The routing invariants the library promises (docs/reliability.md), checked on a gating,
// a dispatch and a layout. One checker for every caller: the reference tests, the fuzzers
// (tests/fuzz/fuzz_route.cpp, and its corpus replayed by reference_tests) and any test that
// wants to know a routing is well formed rather than equal to another one. Each function
// returns "" when every invariant holds, else a description of the first violation.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <moeroute/capacity.hpp>
#include <moeroute/reference.hpp>

namespace moeroute::test {

namespace detail {
inline std::string at(std::int64_t a, std::int32_t k) {
  return " at token " + std::to_string(a / k) + " choice " + std::to_string(a % k);
}
}  // namespace detail

/// @brief The gating output's own invariants: sizes, ids in range and distinct per token
///        (reroute candidates included), at most group_topk groups per token, finite gates and
///        logsumexp, non-negative gates bounded by the scaling factor where the score is, the
///        aux counts summing to valid tokens * counted.
inline std::string gating_violation(const routing_config& cfg, const reference::gating_output& g) {
  const std::int64_t T = g.tokens;
  const std::int32_t k = cfg.top_k, E = cfg.num_experts, R = cfg.reroute_candidates();
  if (g.k != k || g.experts != E || g.reroute_candidates != R) return "gating_output extents";
  if (static_cast<std::int64_t>(g.ids.size()) != T * k ||
      static_cast<std::int64_t>(g.gates.size()) != T * k ||
      static_cast<std::int64_t>(g.reroute_ids.size()) != T * R ||
      static_cast<std::int64_t>(g.valid.size()) != T)
    return "gating_output sizes";
  // softmax and sigmoid scores are in [0, 1]; sqrt-softplus ones only after renormalising
  const bool bounded = cfg.gating.score != score_function::sqrt_softplus ||
                       cfg.gating.renorm == renormalize::before_drop;
  const float hi = cfg.gating.renorm == renormalize::after_drop ? 1.0f : cfg.gating.scaling_factor;
  const std::int32_t G = cfg.gating.group_limit.groups > 1 ? cfg.gating.group_limit.groups : 1;
  std::int64_t valid = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    valid += g.valid[t] ? 1 : 0;
    std::vector<std::uint8_t> seen(static_cast<std::size_t>(E), 0);
    std::set<std::int32_t> groups;
    for (std::int32_t j = 0; j < k + R; ++j) {
      const std::int64_t a = t * k + j;
      const std::int32_t e = j < k ? g.ids[a] : g.reroute_ids[t * R + j - k];
      if (e < 0 || e >= E) return "id out of range" + detail::at(a, k);
      if (seen[e]) return "duplicate id at token " + std::to_string(t);
      seen[e] = 1;
      if (j >= k) continue;
      groups.insert(e / (E / G));
      const float gate = g.gates[a];
      if (!std::isfinite(gate) || gate < 0.0f)
        return "gate not finite or negative" + detail::at(a, k);
      if (bounded && gate > hi) return "gate above its bound" + detail::at(a, k);
    }
    if (G > 1 && static_cast<std::int32_t>(groups.size()) > cfg.gating.group_limit.group_topk)
      return "token " + std::to_string(t) + " uses more groups than group_topk";
    if (!std::isfinite(g.logsumexp[t])) return "logsumexp not finite at token " + std::to_string(t);
  }
  if (g.valid_tokens != valid) return "valid_tokens disagrees with the mask";
  const std::int64_t counted = cfg.aux_counts_per_token();
  std::int64_t sum = 0;
  for (std::int32_t e = 0; e < E; ++e) {
    sum += g.aux_count[e];
    if (!std::isfinite(g.aux_score_sum[e]) || g.aux_score_sum[e] < 0.0)
      return "aux score sum at expert " + std::to_string(e);
  }
  if (sum != valid * counted) return "aux counts do not sum to valid tokens * counted";
  return "";
}

/// @brief A dispatch's invariants against the gating it came from: every assignment kept,
///        rerouted (to a legal target), dropped or masked, and the counts say so, globally and
///        per expert; slots dense and unique, no expert over its capacity, one slot per token
///        and expert; capacity by the config's rule; weights finite, zero exactly when not
///        routed, equal to the gates unless renormalised after drop (then summing to the
///        scaling factor); requests turned away only by a full expert, in priority order;
///        dropless configs drop nothing; token_index slots ascend by token.
inline std::string dispatch_violation(const routing_config& cfg, const reference::gating_output& g,
                                      const reference::dispatch_output& d) {
  using detail::at;
  const std::int64_t T = d.tokens;
  const std::int32_t k = d.k, E = d.experts, ET = d.total_experts;
  const std::int32_t R = cfg.reroute_candidates();
  if (T != g.tokens || k != cfg.top_k || E != cfg.num_experts || ET != cfg.total_experts())
    return "dispatch_output extents";
  if (static_cast<std::int64_t>(d.fates.size()) != T * k ||
      static_cast<std::int64_t>(d.expert.size()) != T * k ||
      static_cast<std::int64_t>(d.slot.size()) != T * k ||
      static_cast<std::int64_t>(d.weight.size()) != T * k)
    return "dispatch_output sizes";
  // a second choice that lost NLLB's "random" draw never asked for a slot
  const auto skipped = [&](std::int64_t a) {
    return !g.second_skipped.empty() && a % k == 1 && g.second_skipped[a / k] != 0;
  };
  // capacity groups (capacity.group_tokens): each (group, expert) is its own competition
  const std::int64_t GT = std::max<std::int64_t>(cfg.capacity_group_tokens(T), 1);
  const std::int64_t Q = cfg.capacity_groups(T);
  std::vector<std::int64_t> req_qe(static_cast<std::size_t>(Q * E), 0),
      kept_qe(static_cast<std::size_t>(Q * E), 0), held_qe(static_cast<std::size_t>(Q * ET), 0);
  for (std::int64_t a = 0; a < T * k; ++a) {
    const std::int64_t q = a / k / GT;
    if (g.valid[a / k] && !skipped(a)) ++req_qe[q * E + g.ids[a]];
    if (d.fates[a] == fate::kept) ++kept_qe[q * E + g.ids[a]];
    bool first_at_expert = d.expert[a] >= 0;  // a token holds one row per expert
    for (std::int64_t b = a - a % k; b < a && first_at_expert; ++b)
      first_at_expert = d.expert[b] != d.expert[a];
    if (first_at_expert) ++held_qe[q * ET + d.expert[a]];
  }
  std::int64_t max_req = 0;
  for (auto r : req_qe) max_req = std::max(max_req, r);
  const std::int64_t C = d.capacity;
  if (C != expert_capacity(cfg, T, max_req)) return "capacity differs from expert_capacity()";
  for (std::int64_t q = 0; q < Q; ++q)
    for (std::int32_t e = 0; e < ET; ++e) {
      const std::int64_t cap = e < E ? C : d.fallback_capacity;
      if (cap >= 0 && held_qe[q * ET + e] > cap)
        return "above capacity in group " + std::to_string(q) + " at expert " + std::to_string(e);
    }
  const std::int32_t fallback_target =
      cfg.dispatch.dropped == drop_policy::fallback
          ? (cfg.dispatch.fallback.expert < 0 ? E : cfg.dispatch.fallback.expert)
          : -2;
  const float sf = cfg.gating.scaling_factor;
  const bool after_drop = cfg.gating.renorm == renormalize::after_drop;

  std::int64_t kept = 0, rer = 0, drop = 0, masked = 0;
  std::vector<std::int64_t> req(E, 0), kept_e(E, 0), rer_e(E, 0), drop_e(E, 0), recv(ET, 0);
  for (std::int64_t t = 0; t < T; ++t) {
    float wsum = 0.0f, gsum = 0.0f;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      const std::int32_t e = g.ids[a];
      const float w = d.weight[a];
      if (!std::isfinite(w) || w < 0.0f) return "bad weight" + at(a, k);
      if ((d.fates[a] == fate::masked) != (g.valid[t] == 0))
        return "masked exactly when padding, violated" + at(a, k);
      switch (d.fates[a]) {
        case fate::kept:
          ++kept, ++kept_e[e], ++req[e];
          if (d.expert[a] != e) return "kept at another expert" + at(a, k);
          break;
        case fate::rerouted: {
          ++rer, ++rer_e[e], ++req[e];
          const std::int32_t to = d.expert[a];
          if (to < 0 || to >= ET || to == e) return "bad reroute target" + at(a, k);
          bool legal = to == fallback_target;
          for (std::int32_t q = 0; cfg.dispatch.dropped == drop_policy::next_choice && q < R; ++q)
            legal = legal || g.reroute_ids[t * R + q] == to;
          if (!legal) return "reroute target not allowed by the drop policy" + at(a, k);
          ++recv[to];
          break;
        }
        case fate::dropped:
          ++drop, ++drop_e[e], ++req[e];
          break;
        case fate::masked:
          ++masked;
          break;
      }
      if (holds_row(d.fates[a])) {
        if (d.slot[a] < 0) return "routed without a slot" + at(a, k);
        if (!after_drop && w != g.gates[a]) return "weight differs from the gate" + at(a, k);
        wsum += w;
        gsum += g.gates[a];
      } else if (d.expert[a] != -1 || d.slot[a] != -1 || w != 0.0f) {
        return "not routed, but has an expert, slot or weight" + at(a, k);
      }
    }
    if (after_drop && gsum >= FLT_EPSILON &&
        std::fabs(wsum - sf) > 1e-5f * static_cast<float>(k) * sf)
      return "after-drop weights of token " + std::to_string(t) +
             " do not sum to the scaling factor";
  }
  if (kept + rer + drop + masked != T * k) return "kept + rerouted + dropped + masked != T * k";
  if (kept != d.total_kept || rer != d.total_rerouted || drop != d.total_dropped ||
      masked != d.total_masked)
    return "totals disagree with the fates";
  for (std::int32_t e = 0; e < E; ++e) {
    const std::string ex = " at expert " + std::to_string(e);
    if (d.requested[e] != req[e] || d.kept[e] != kept_e[e] || d.rerouted[e] != rer_e[e] ||
        d.dropped[e] != drop_e[e])
      return "per-expert counts disagree with the fates" + ex;
  }
  // an expert turns a request away only when it is full (in that request's group)
  for (std::int64_t a = 0; a < T * k; ++a) {
    if (d.fates[a] != fate::rerouted && d.fates[a] != fate::dropped) continue;
    if (skipped(a)) {
      if (d.fates[a] != fate::dropped) return "a skipped second choice was routed" + at(a, k);
      continue;
    }
    const std::int64_t q = a / k / GT;
    if (!(C >= 0 && kept_qe[q * E + g.ids[a]] == C))
      return "request turned away by a non-full expert" + at(a, k);
  }
  for (std::int32_t e = 0; e < ET; ++e)
    if (d.received[e] != recv[e]) return "received count at expert " + std::to_string(e);
  const bool dropless =
      cfg.capacity.mode == capacity_mode::max_load || cfg.capacity.mode == capacity_mode::unbounded;
  std::int64_t skipped_drops = 0;  // NLLB's random policy drops before any capacity
  for (std::int64_t a = 0; a < T * k; ++a)
    skipped_drops += skipped(a) && d.fates[a] == fate::dropped ? 1 : 0;
  if (dropless && (drop > skipped_drops || rer > 0)) return "a dropless config dropped or rerouted";
  if ((cfg.dispatch.dropped == drop_policy::zero_weight ||
       cfg.dispatch.dropped == drop_policy::residual) &&
      rer > 0)
    return "rerouted without a reroute policy";

  // slots: one token per (expert, slot), dense 0..load-1, none over capacity, one per token
  std::vector<std::map<std::int32_t, std::int64_t>> holder(ET);
  for (std::int64_t a = 0; a < T * k; ++a) {
    if (d.expert[a] < 0) continue;
    auto [it, fresh] = holder[d.expert[a]].emplace(d.slot[a], a / k);
    if (!fresh && it->second != a / k)
      return "slot used twice at expert " + std::to_string(d.expert[a]) + at(a, k);
    for (std::int32_t j2 = 0; j2 < a % k; ++j2) {
      const std::int64_t b = a - a % k + j2;
      if (d.expert[b] == d.expert[a] && d.slot[b] != d.slot[a])
        return "token holds two slots at one expert" + at(a, k);
    }
  }
  for (std::int32_t e = 0; e < ET; ++e) {
    const std::string ex = " at expert " + std::to_string(e);
    if (static_cast<std::int64_t>(holder[e].size()) != d.load[e]) return "load != rows held" + ex;
    std::int32_t want = 0;
    std::int64_t last_token = -1;
    for (const auto& [s, t] : holder[e]) {
      if (s != want++) return "slots not dense" + ex;
      if (cfg.dispatch.slots == slot_order::token_index && t <= last_token)
        return "token_index slots not ascending" + ex;
      last_token = t;
    }
  }

  // priority: at each (group, expert) the kept requests come first in priority order
  if (cfg.dispatch.prio != priority::random) {
    using key_t = std::tuple<std::int64_t, float, std::int64_t, std::int64_t>;
    for (std::int64_t q = 0; q < Q; ++q)
      for (std::int32_t e = 0; e < E; ++e) {
        std::vector<std::pair<key_t, bool>> queue;
        for (std::int64_t a = q * GT * k; a < std::min(T, (q + 1) * GT) * k; ++a) {
          if (g.ids[a] != e || d.fates[a] == fate::masked || skipped(a)) continue;
          const std::int64_t t = a / k, j = a % k;
          key_t key{0, 0.0f, t, j};
          if (cfg.dispatch.prio == priority::choice_major) key = {0, 0.0f, j, t};
          if (cfg.dispatch.prio == priority::score_per_expert) key = {0, -g.gates[a], t, j};
          if (cfg.dispatch.prio == priority::batch_prioritized)
            key = {j, -g.token_priority[t], t, 0};
          queue.push_back({key, d.fates[a] == fate::kept});
        }
        std::sort(queue.begin(), queue.end());
        for (std::size_t i = 1; i < queue.size(); ++i)
          if (!queue[i - 1].second && queue[i].second)
            return "kept out of priority order at expert " + std::to_string(e);
      }
  }
  return "";
}

/// @brief A layout's invariants against the dispatch it was built from: offsets, segment sizes
///        (capacity, or load rounded up to block_size), which rows hold a token, the row of
///        every assignment and the expert of every compact block.
inline std::string layout_violation(const reference::dispatch_output& d,
                                    const reference::layout_output& L,
                                    std::int64_t capacity_groups = 1) {
  const std::int32_t ET = d.total_experts;
  const bool padded = L.kind == layout_kind::padded;
  if (L.total_experts != ET || static_cast<std::int32_t>(L.offsets.size()) != ET + 1)
    return "layout extents";
  if (L.offsets[0] != 0 || L.offsets[ET] != L.num_rows) return "offsets do not span the rows";
  if (static_cast<std::int64_t>(L.row_token.size()) != L.num_rows ||
      static_cast<std::int64_t>(L.assignment_row.size()) != d.tokens * d.k)
    return "layout sizes";
  std::int64_t used = 0;
  for (std::int32_t e = 0; e < ET; ++e) {
    const std::string ex = " at expert " + std::to_string(e);
    const std::int64_t seg = L.offsets[e + 1] - L.offsets[e];
    if (L.rows_used[e] != d.load[e] || seg < d.load[e]) return "segment smaller than its load" + ex;
    if (padded && e < d.experts && seg != d.capacity * capacity_groups)
      return "padded segment is not C rows per capacity group" + ex;
    if (!padded) {
      if (L.offsets[e] % L.block_size != 0) return "compact segment not block aligned" + ex;
      if (seg != (d.load[e] + L.block_size - 1) / L.block_size * L.block_size)
        return "compact segment size" + ex;
      for (std::int64_t b = L.offsets[e] / L.block_size; b < L.offsets[e + 1] / L.block_size; ++b)
        if (L.block_expert[b] != e) return "block_expert" + ex;
    }
    // rows [offset, offset + load) hold a token, the rest of the segment is padding
    for (std::int64_t r = L.offsets[e]; r < L.offsets[e + 1]; ++r)
      if ((L.row_token[r] >= 0) != (r - L.offsets[e] < d.load[e]))
        return "padding row inside the load" + ex;
    used += d.load[e];
  }
  if (L.padding_rows() != L.num_rows - used) return "padding_rows()";
  for (std::int64_t a = 0; a < d.tokens * d.k; ++a) {
    const std::int32_t e = d.expert[a];
    const std::int64_t row = L.assignment_row[a];
    if (e < 0) {
      if (row != -1) return "unrouted assignment has a row" + detail::at(a, d.k);
      continue;
    }
    if (row != L.offsets[e] + d.slot[a] || row >= L.offsets[e + 1])
      return "assignment row" + detail::at(a, d.k);
    if (L.row_token[row] != a / d.k) return "row holds another token" + detail::at(a, d.k);
  }
  return "";
}

}  // namespace moeroute::test
