// SPDX-License-Identifier: Apache-2.0
// CPU reference, stage 2: capacity assignment. Gives every (token, choice) assignment a fate —
// kept, rerouted, dropped or masked — a final expert and a slot, and counts each of them.
// The rules are in docs/numerics.md ("Capacity assignment") and docs/concepts.md.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/rng.hpp>
#include <moeroute/types.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::reference {

/// @brief The result of capacity assignment for a batch.
struct dispatch_output {
  std::int64_t tokens = 0;
  std::int32_t k = 0;
  std::int32_t experts = 0;        ///< E routed experts
  std::int32_t total_experts = 0;  ///< E, or E + 1 with a dedicated fallback expert (index E)
  /// C of each routed expert in each capacity group (the batch, unless capacity.group_tokens
  /// is set: expert_slots() bounds the rows over the batch); unbounded_capacity (-1) if none
  std::int64_t capacity = 0;
  std::int64_t fallback_capacity = 0;  ///< the same for the dedicated fallback (-1 unbounded;
                                       ///< 0 if none)

  std::vector<std::int32_t> expert;  ///< [T, k] final expert (after reroute), -1 if none
  std::vector<std::int32_t> slot;    ///< [T, k] slot in that expert, -1 if none
  std::vector<float> weight;         ///< [T, k] combine weight (0 unless kept or rerouted)
  std::vector<fate> fates;           ///< [T, k]

  // Per expert, indexed by the expert an assignment first chose ([E]) ...
  std::vector<std::int64_t> requested;  ///< valid assignments that chose e
  std::vector<std::int64_t> kept;       ///< ... and got a slot at e
  std::vector<std::int64_t> rerouted;   ///< ... and got a slot elsewhere
  std::vector<std::int64_t> dropped;    ///< ... and got none
  // ... and by the expert that holds them ([total_experts]).
  std::vector<std::int64_t> received;  ///< rerouted assignments that landed at e
  std::vector<std::int64_t> load;      ///< slots in use at e (a token holds one slot per expert)

  std::int64_t total_kept = 0, total_rerouted = 0, total_dropped = 0, total_masked = 0;
  std::int64_t reroute_rounds = 0;  ///< rounds run by next_choice

  [[nodiscard]] std::int64_t assignments() const noexcept { return tokens * k; }
  /// The batch totals as the one record cuda::dispatch writes.
  [[nodiscard]] dispatch_totals totals() const noexcept {
    return {capacity,      fallback_capacity, total_kept,    total_rerouted,
            total_dropped, total_masked,      reroute_rounds};
  }
};

namespace detail {
/// Throws unless cfg is valid and dsp has its extents (k, E, and E + 1 with a dedicated
/// fallback): what every stage that reads a dispatch_output checks first.
inline void check_dispatch_of(const routing_config& cfg, const dispatch_output& dsp) {
  throw_if_error(validate(cfg));
  if (dsp.k != cfg.top_k || dsp.experts != cfg.num_experts ||
      dsp.total_experts != cfg.total_experts())
    throw error(status::make(status_code::invalid_argument,
                             "dispatch_output (k = " + std::to_string(dsp.k) +
                                 ", experts = " + std::to_string(dsp.experts) +
                                 ") does not match config (top_k = " + std::to_string(cfg.top_k) +
                                 ", num_experts = " + std::to_string(cfg.num_experts) + ")"));
}

/// Priority key of an assignment: smaller goes first. Used per expert and for reroute order.
struct priority_key {
  std::int64_t rank;   // j for batch_prioritized (every first choice first), else 0
  float neg_value;     // -gate (score), -random (random), -token priority; 0 positional
  std::int64_t major;  // t (token_major, score, random, batch_prioritized) or j (choice_major)
  std::int64_t minor;  // j or t
  friend bool operator<(const priority_key& a, const priority_key& b) {
    return std::tie(a.rank, a.neg_value, a.major, a.minor) <
           std::tie(b.rank, b.neg_value, b.major, b.minor);
  }
};

inline float random_priority(const routing_config& cfg, std::int64_t t, std::int32_t e) {
  return rng::random_priority(cfg.dispatch.random_seed, cfg.dispatch.random_offset, t,
                              cfg.num_experts, e);
}

/// Combine weights of a decided dispatch: the gate of every assignment that holds a row,
/// renormalised over the survivors with renormalize::after_drop; 0 for the others. Shared with
/// the expert-parallel backend, which decides fates across ranks and then weighs them here.
inline void apply_combine_weights(const routing_config& cfg, const std::vector<float>& gates,
                                  dispatch_output& out) {
  const auto& gc = cfg.gating;
  const std::int32_t k = out.k;
  for (std::int64_t t = 0; t < out.tokens; ++t) {
    float sum = 0.0f;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      if (holds_row(out.fates[a])) sum += gates[a];
    }
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      if (!holds_row(out.fates[a])) {
        out.weight[a] = 0.0f;
      } else if (gc.renorm == renormalize::after_drop) {
        out.weight[a] = gates[a] / std::max(sum, FLT_EPSILON) * gc.scaling_factor;
      } else {
        out.weight[a] = gates[a];
      }
    }
  }
}

inline priority_key make_key(const routing_config& cfg, const gating_output& g, std::int64_t t,
                             std::int32_t j) {
  const std::int64_t a = t * g.k + j;
  switch (cfg.dispatch.prio) {
    case priority::token_major:
      return {0, 0.0f, t, j};
    case priority::choice_major:
      return {0, 0.0f, j, t};
    case priority::score_per_expert:
      return {0, -g.gates[a], t, j};
    case priority::random:
      return {0, -random_priority(cfg, t, g.ids[a]), t, j};
    case priority::batch_prioritized:
      return {j, -g.token_priority[t], t, 0};
  }
  return {0, 0.0f, t, j};
}

}  // namespace detail

/// @brief Checks that a gating_output is one `reference::gating` could have produced for `cfg`:
///        matching E, k and reroute candidates, every array of its documented length, expert
///        ids in [0, E) and finite gates. @return success or an error naming the field.
[[nodiscard]] inline status validate_gating_output(const routing_config& cfg,
                                                   const gating_output& g) {
  if (auto s = validate(cfg); !s) return s;
  const auto bad = [](status_code c, std::string m) { return status::make(c, std::move(m)); };
  if (g.tokens < 0 || g.tokens > max_tokens)
    return bad(status_code::invalid_shape,
               moeroute::detail::field_msg("gating_output.tokens", g.tokens,
                                           "must be in [0, max_tokens]"));
  if (g.experts != cfg.num_experts)
    return bad(status_code::invalid_argument,
               "gating_output.experts = " + std::to_string(g.experts) +
                   " does not match config num_experts = " + std::to_string(cfg.num_experts));
  if (g.k != cfg.top_k)
    return bad(status_code::invalid_argument,
               "gating_output.k = " + std::to_string(g.k) +
                   " does not match config top_k = " + std::to_string(cfg.top_k));
  const std::int32_t R = cfg.reroute_candidates();
  if (g.reroute_candidates != R)
    return bad(status_code::invalid_argument,
               "gating_output.reroute_candidates = " + std::to_string(g.reroute_candidates) +
                   " does not match the config (" + std::to_string(R) +
                   "): gate with the config you dispatch with");
  const auto sized = [&](const char* what, std::size_t got, std::int64_t want) {
    return static_cast<std::int64_t>(got) == want
               ? status::success()
               : bad(status_code::invalid_shape, std::string("gating_output.") + what + " has " +
                                                     std::to_string(got) + " elements, expected " +
                                                     std::to_string(want));
  };
  const std::int64_t T = g.tokens;
  if (auto s = sized("ids", g.ids.size(), T * g.k); !s) return s;
  if (auto s = sized("gates", g.gates.size(), T * g.k); !s) return s;
  if (auto s = sized("reroute_ids", g.reroute_ids.size(), T * R); !s) return s;
  if (auto s = sized("valid", g.valid.size(), T); !s) return s;
  const bool prioritized = cfg.dispatch.prio == priority::batch_prioritized;
  if (auto s = sized("token_priority", g.token_priority.size(), prioritized ? T : 0); !s) return s;
  const bool random_second = cfg.gating.second_expert.policy == second_expert_policy::random;
  if (auto s = sized("second_skipped", g.second_skipped.size(), random_second ? T : 0); !s)
    return s;
  for (std::size_t t = 0; t < g.token_priority.size(); ++t)
    if (!std::isfinite(g.token_priority[t]))
      return bad(status_code::invalid_argument,
                 "gating_output.token_priority[" + std::to_string(t) + "] is not finite");
  for (std::size_t a = 0; a < g.ids.size(); ++a) {
    if (g.ids[a] < 0 || g.ids[a] >= g.experts)
      return bad(status_code::invalid_argument,
                 "gating_output.ids[" + std::to_string(a) + "] = " + std::to_string(g.ids[a]) +
                     " is outside [0, num_experts = " + std::to_string(g.experts) + ")");
    if (!std::isfinite(g.gates[a]))
      return bad(status_code::invalid_argument,
                 "gating_output.gates[" + std::to_string(a) + "] is not finite");
  }
  for (std::size_t a = 0; a < g.reroute_ids.size(); ++a)
    if (g.reroute_ids[a] < 0 || g.reroute_ids[a] >= g.experts)
      return bad(status_code::invalid_argument, "gating_output.reroute_ids[" + std::to_string(a) +
                                                    "] = " + std::to_string(g.reroute_ids[a]) +
                                                    " is outside [0, num_experts)");
  // a token's k + R candidates are distinct (gating ranks distinct experts; ids chosen
  // elsewhere must be too): plain pairwise comparison
  for (std::int64_t t = 0; t < T; ++t) {
    const auto candidate = [&](std::int32_t i) {
      return i < g.k ? g.ids[t * g.k + i] : g.reroute_ids[t * R + (i - g.k)];
    };
    for (std::int32_t i = 1; i < g.k + R; ++i)
      for (std::int32_t j = 0; j < i; ++j)
        if (candidate(i) == candidate(j))
          return bad(status_code::invalid_argument,
                     (i < g.k ? "gating_output.ids[" + std::to_string(t * g.k + i)
                              : "gating_output.reroute_ids[" + std::to_string(t * R + i - g.k)) +
                         "] = " + std::to_string(candidate(i)) + ": token " + std::to_string(t) +
                         " names that expert twice (a token's candidates are distinct)");
  }
  return status::success();
}

/// @brief Capacity assignment for a batch (see docs/concepts.md for the policies).
/// @param cfg the config the gating ran with
/// @param g   gating_output from reference::gating
/// @return dispatch_output. Every valid assignment is kept, rerouted or dropped; assignments of
///         padding tokens are masked: kept + rerouted + dropped + masked = T * k.
/// @note Slots are granted per expert in priority order (ties: lower token index, then lower
///       choice rank). A rerouted assignment whose target already holds its token shares that
///       token's slot, so no (token, expert) pair occupies two rows. With capacity groups
///       (capacity.group_tokens) every group is routed on its own: its own C slots per expert,
///       its own priority order and reroutes; an expert's slots stay dense over the batch
///       (group q's follow those of groups < q).
inline dispatch_output dispatch(const routing_config& cfg, const gating_output& g) {
  throw_if_error(validate_gating_output(cfg, g));
  throw_if_error(validate_tokens(cfg, g.tokens));
  const std::int64_t T = g.tokens;
  const std::int32_t k = g.k, E = g.experts, ET = cfg.total_experts();
  const auto& d = cfg.dispatch;
  const std::int64_t GT = std::max<std::int64_t>(cfg.capacity_group_tokens(T), 1);
  const std::int64_t Q = cfg.capacity_groups(T);
  const auto group_of = [&](std::int64_t a) { return a / k / GT; };

  dispatch_output out;
  out.tokens = T;
  out.k = k;
  out.experts = E;
  out.total_experts = ET;
  out.expert.assign(T * k, -1);
  out.slot.assign(T * k, -1);
  out.weight.assign(T * k, 0.0f);
  out.fates.assign(T * k, fate::dropped);
  out.requested.assign(E, 0);
  out.kept.assign(E, 0);
  out.rerouted.assign(E, 0);
  out.dropped.assign(E, 0);
  out.received.assign(ET, 0);
  out.load.assign(ET, 0);

  // Requests per (capacity group, expert) in priority order.
  std::vector<std::vector<std::pair<detail::priority_key, std::int64_t>>> queue(Q * E);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      if (!g.valid[t]) {
        out.fates[a] = fate::masked;
        ++out.total_masked;
        continue;
      }
      const std::int32_t e = g.ids[a];
      ++out.requested[e];
      if (j == 1 && !g.second_skipped.empty() && g.second_skipped[t]) continue;  // lost the draw
      queue[group_of(a) * E + e].push_back({detail::make_key(cfg, g, t, j), a});
    }
  }
  std::int64_t max_load = 0;
  for (const auto& q : queue) max_load = std::max<std::int64_t>(max_load, std::ssize(q));
  const std::int64_t C = expert_capacity(cfg, T, max_load);
  out.capacity = C;
  if (cfg.has_dedicated_fallback()) out.fallback_capacity = d.fallback.capacity;
  const auto capacity_of = [&](std::int32_t e) { return e < E ? C : out.fallback_capacity; };
  // holder[q * ET + e][s] = the assignment holding local slot s of expert e in group q
  std::vector<std::vector<std::int64_t>> holder(Q * ET);
  const auto room = [&](std::int64_t q, std::int32_t e) {
    const std::int64_t cap = capacity_of(e);
    return cap < 0 || std::ssize(holder[q * ET + e]) < cap;
  };
  // out.slot holds the local slot (within its group) until the numbering at the end
  const auto take = [&](std::int64_t a, std::int32_t e) {
    auto& h = holder[group_of(a) * ET + e];
    out.expert[a] = e;
    out.slot[a] = static_cast<std::int32_t>(h.size());
    h.push_back(a);
    ++out.load[e];
  };

  for (std::int64_t q = 0; q < Q; ++q) {
    for (std::int32_t e = 0; e < E; ++e) {
      auto& qe = queue[q * E + e];
      std::stable_sort(qe.begin(), qe.end(),
                       [](const auto& x, const auto& y) { return x.first < y.first; });
      for (const auto& [key, a] : qe) {
        if (!room(q, e)) break;
        out.fates[a] = fate::kept;
        take(a, e);
        ++out.kept[e];
      }
    }
  }

  // Dropped assignments in the reroute order: group by group, each in the priority key order.
  std::vector<std::tuple<std::int64_t, detail::priority_key, std::int64_t>> pending;
  for (std::int64_t a = 0; a < T * k; ++a) {
    if (out.fates[a] != fate::dropped) continue;
    const std::int64_t t = a / k;
    const std::int32_t j = static_cast<std::int32_t>(a % k);
    pending.emplace_back(group_of(a), detail::make_key(cfg, g, t, j), a);
  }
  std::stable_sort(pending.begin(), pending.end(), [](const auto& x, const auto& y) {
    return std::tie(std::get<0>(x), std::get<1>(x)) < std::tie(std::get<0>(y), std::get<1>(y));
  });

  // Local slot of token t at expert e, if it holds one.
  const auto held_slot = [&](std::int64_t t, std::int32_t e) -> std::int32_t {
    for (std::int32_t j = 0; j < k; ++j)
      if (out.expert[t * k + j] == e) return out.slot[t * k + j];
    return -1;
  };
  const auto grant_reroute = [&](std::int64_t a, std::int32_t target) {
    const std::int64_t t = a / k;
    const std::int32_t shared = held_slot(t, target);
    if (shared < 0 && !room(group_of(a), target)) return false;
    out.fates[a] = fate::rerouted;
    if (shared >= 0) {
      out.expert[a] = target;
      out.slot[a] = shared;
    } else {
      take(a, target);
    }
    ++out.received[target];
    ++out.rerouted[g.ids[a]];
    return true;
  };

  if (d.dropped == drop_policy::fallback) {
    const std::int32_t target = d.fallback.expert < 0 ? E : d.fallback.expert;
    for (const auto& [q, key, a] : pending) grant_reroute(a, target);
  } else if (d.dropped == drop_policy::next_choice) {
    // Round r: every still-dropped assignment tries its token's next untried candidate.
    const std::int32_t R = g.reroute_candidates;
    std::vector<std::int32_t> next(T, 0);
    for (std::int32_t round = 0; round < R; ++round) {
      bool any = false;
      for (const auto& [q, key, a] : pending) {
        if (out.fates[a] != fate::dropped) continue;
        const std::int64_t t = a / k;
        if (next[t] >= R) continue;
        any = true;
        grant_reroute(a, g.reroute_ids[t * R + next[t]++]);
      }
      if (!any) break;
      ++out.reroute_rounds;
    }
  }

  // Whatever is still without a slot is dropped, counted at the expert it chose.
  for (std::int64_t a = 0; a < T * k; ++a) {
    if (out.fates[a] == fate::dropped) {
      ++out.dropped[g.ids[a]];
      ++out.total_dropped;
    } else if (out.fates[a] == fate::kept) {
      ++out.total_kept;
    } else if (out.fates[a] == fate::rerouted) {
      ++out.total_rerouted;
    }
  }

  // Slot numbering, dense per expert: local slot s of expert e in group q becomes base(q, e)
  // + s', s' = s (priority order) or the holder's rank by token index (slot_order::
  // token_index), base = the holders of e in the groups before q. So rows [0, load) of an
  // expert are in use in every layout; a group's routing never depends on another group,
  // only where its rows start does.
  std::vector<std::vector<std::int32_t>> final_slot(Q * ET);
  std::vector<std::int64_t> group_base(ET, 0);
  for (std::int64_t q = 0; q < Q; ++q) {
    for (std::int32_t e = 0; e < ET; ++e) {
      const std::vector<std::int64_t>& h = holder[q * ET + e];
      std::vector<std::size_t> idx(h.size());
      std::iota(idx.begin(), idx.end(), std::size_t{0});
      // assignment index order is token order (a = t * k + j, one slot per token here)
      if (d.slots == slot_order::token_index)
        std::sort(idx.begin(), idx.end(),
                  [&](std::size_t x, std::size_t y) { return h[x] < h[y]; });
      const std::int64_t base = group_base[e];
      group_base[e] += std::ssize(h);
      auto& fs = final_slot[q * ET + e];
      fs.resize(h.size());
      for (std::size_t r = 0; r < idx.size(); ++r)
        fs[idx[r]] = static_cast<std::int32_t>(base + static_cast<std::int64_t>(r));
    }
  }
  // every assignment maps its local slot (shared slots follow their holder)
  for (std::int64_t a = 0; a < T * k; ++a)
    if (out.expert[a] >= 0) out.slot[a] = final_slot[group_of(a) * ET + out.expert[a]][out.slot[a]];

  detail::apply_combine_weights(cfg, g.gates, out);
  return out;
}

}  // namespace moeroute::reference
MOEROUTE_PRECISE_FP_END
