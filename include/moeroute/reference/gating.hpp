// SPDX-License-Identifier: Apache-2.0
// CPU reference, stage 1: router logits -> top-k expert ids and gates, plus what the losses need.
// Plain loops, one token at a time; the formulas are in docs/numerics.md ("Gating").
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/replay.hpp>
#include <moeroute/rng.hpp>
#include <moeroute/status.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::reference {

/// @brief Everything the gating stage produces for a batch.
struct gating_output {
  std::int64_t tokens = 0;
  std::int32_t experts = 0;
  std::int32_t k = 0;
  std::int32_t reroute_candidates = 0;  ///< R: next-best experts kept per token (next_choice)
  std::vector<std::int32_t> ids;        ///< [T, k] expert ids, best first
  /// [T, k] pre-drop gates: scaling_factor * (renormalised before drop ? g / sum g : g).
  /// With renormalize::after_drop the scaling is applied after that renormalisation instead.
  std::vector<float> gates;
  std::vector<std::int32_t> reroute_ids;  ///< [T, R] the experts ranked k+1 .. k+R
  std::vector<float> logsumexp;           ///< [T] logsumexp of the (sanitised) logits
  /// [T] with dispatch.prio = batch_prioritized (else empty): the token's top-1 score over
  /// all experts on the clean logits — the largest softmax probability, or score(max logit)
  /// for the per-expert score functions — before bias, noise, renormalisation and scaling.
  std::vector<float> token_priority;
  /// [T] with gating.second_expert.policy = random (else empty): 1 = the token's second
  /// choice lost the draw (2 * p2 <= u) and is dropped before any capacity is counted.
  std::vector<std::uint8_t> second_skipped;
  std::vector<std::uint8_t> valid;  ///< [T] 1 = real token, 0 = padding
  std::int64_t valid_tokens = 0;
  std::int64_t nonfinite_logits = 0;  ///< NaN / Inf inputs seen (sanitised, see docs)
  std::int64_t replay_replaced = 0;   ///< replayed slots of valid tokens the filter gave back
  // Per token: the aux loss's inputs, so a caller can compute its own loss. A padding token's
  // row is all 0 and its ids all -1 (it counts for nothing), so the rows add up to the sums.
  std::vector<float> aux_scores;            ///< [T, E] P[t, e]: the score row the aux loss uses
  std::vector<std::int32_t> aux_count_ids;  ///< [T, c] the experts t counts for (c = 1 for
                                            ///< aux_counts::top1, else k), routed or fresh
  // Aux-loss inputs over the valid tokens; sequence s holds the tokens sequence_of_token maps
  // to it (loss.sequence_order).
  std::vector<double> aux_score_sum;     ///< [E] sum_t P[t, e]
  std::vector<std::int64_t> aux_count;   ///< [E] f counts (top-1 or all k, routed or fresh)
  std::int64_t sequences = 0;            ///< S = T / loss.sequence_length (0 if not set)
  std::vector<double> seq_score_sum;     ///< [S, E]
  std::vector<std::int64_t> seq_count;   ///< [S, E]
  std::vector<std::int64_t> seq_tokens;  ///< [S] valid tokens per sequence
};

namespace detail {

/// NaN -> -FLT_MAX, +-Inf -> +-FLT_MAX: every later formula stays finite and ordered.
inline float sanitize(float x) {
  if (std::isnan(x)) return -FLT_MAX;
  return std::clamp(x, -FLT_MAX, FLT_MAX);
}

inline float score_one(score_function f, float x) {
  switch (f) {
    case score_function::sigmoid:
      return 1.0f / (1.0f + std::exp(-x));
    case score_function::sqrt_softplus: {
      // log1p(exp(x)) without overflow: x + log1p(exp(-x)) for x > 0
      const float sp = x > 0.0f ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
      return std::sqrt(sp);
    }
    case score_function::softmax:
      break;
  }
  return x;  // softmax needs the whole row; see softmax_row
}

/// softmax over n values, max-subtracted, sum in double.
inline void softmax_row(const float* x, std::int64_t n, float* out) {
  float m = -FLT_MAX;
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(x[i] - m);
    sum += out[i];
  }
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(out[i] / sum);
}

inline void scores_row(score_function f, const float* x, std::int64_t n, float* out) {
  if (f == score_function::softmax) {
    softmax_row(x, n, out);
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = score_one(f, x[i]);
  }
}

/// Step 2 of gating: xn[e] = x[e] + scale * z, z drawn by Philox per (token t, expert e),
/// re-sanitised so huge noise cannot overflow. x: token t's sanitised logits [E].
inline void noisy_logits(const noise_config& n, const float* x, std::int64_t t, std::int32_t E,
                         float* xn) {
  for (std::int32_t e = 0; e < E; ++e) {
    const float z = rng::gating_noise(n.seed, n.offset, n.kind == noise_kind::gaussian, t, E, e);
    xn[e] = sanitize(x[e] + n.scale * z);
  }
}

/// Strict "better than" for selection: larger value, then lower index.
inline bool better(float va, std::int32_t a, float vb, std::int32_t b) {
  return va > vb || (va == vb && a < b);
}

/// Indices of the n best entries of v among those with allowed[i], best first.
inline void top_n(const std::vector<float>& v, const std::vector<std::uint8_t>& allowed,
                  std::int32_t n, std::vector<std::int32_t>& out) {
  out.clear();
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(v.size()); ++i)
    if (allowed[i]) out.push_back(i);
  const auto cmp = [&](std::int32_t a, std::int32_t b) { return better(v[a], a, v[b], b); };
  const std::int32_t m = std::min<std::int32_t>(n, static_cast<std::int32_t>(out.size()));
  std::partial_sort(out.begin(), out.begin() + m, out.end(), cmp);
  out.resize(m);
}

/// The filter value of expert e (moeroute/replay.hpp): the clean logit for softmax, else its
/// score.
inline float replay_filter_value(score_function f, const std::vector<float>& x, std::int32_t e) {
  return f == score_function::softmax ? x[e] : score_one(f, x[e]);
}

/// Step 5 under replay (moeroute/replay.hpp): the k slots, then the R reroute candidates, into
/// `order` in slot order. r: the token's k replay ids. Returns the slots the filter gave back.
inline std::int64_t replay_order(const routing_config& cfg, const std::int32_t* r, float ratio,
                                 double log_ratio, const std::vector<float>& sel,
                                 const std::vector<std::uint8_t>& allowed,
                                 const std::vector<float>& x, std::vector<std::int32_t>& order) {
  const std::int32_t k = cfg.top_k, R = cfg.reroute_candidates();
  const score_function f = cfg.gating.score;
  float weakest = 0.0f;  // the filter value of the weakest of the router's own top-k
  if (ratio > 0.0f) {
    std::vector<std::int32_t> own;
    top_n(sel, allowed, k, own);
    weakest = replay_filter_value(f, x, own[0]);
    for (std::int32_t e : own) weakest = std::min(weakest, replay_filter_value(f, x, e));
  }
  std::vector<std::uint8_t> keep(k, 0), open = allowed;
  std::int64_t replaced = 0;
  for (std::int32_t j = 0; j < k; ++j) {
    if (r[j] < 0) continue;
    keep[j] =
        ratio <= 0.0f || replay_keeps(f == score_function::softmax, replay_filter_value(f, x, r[j]),
                                      weakest, ratio, log_ratio);
    if (keep[j]) {
      open[r[j]] = 0;
    } else {
      ++replaced;
    }
  }
  const auto free = static_cast<std::int32_t>(std::count(keep.begin(), keep.end(), 0));
  std::vector<std::int32_t> fill;
  top_n(sel, open, free + R, fill);
  order.assign(k + R, -1);
  std::size_t next = 0;
  for (std::int32_t j = 0; j < k; ++j) order[j] = keep[j] ? r[j] : fill[next++];
  for (std::int32_t i = 0; i < R; ++i) order[k + i] = fill[next++];
  return replaced;
}

}  // namespace detail

/// @brief The replay of a reference::gating call (moeroute/replay.hpp, docs/replay.md).
struct replay_input {
  std::span<const std::int32_t> ids;  ///< [T, k] expert per slot, -1 = the router chooses;
                                      ///< empty = no replay
  float min_score_ratio = 0.0f;       ///< in [0, 1]; 0 keeps every replayed expert
};

/// @brief Checks a gating call's replay against the config: ids of [T, k] in [-1, E), distinct
///        per token, and the ratio in [0, 1].
[[nodiscard]] inline status validate_replay_input(const routing_config& cfg, std::int64_t tokens,
                                                  const replay_input& replay) {
  gating_replay r;
  r.d_ids = replay.ids.empty() ? nullptr : replay.ids.data();
  r.min_score_ratio = replay.min_score_ratio;
  if (auto s = check_replay(r); !s) return s;
  if (replay.ids.empty()) return status::success();
  if (static_cast<std::int64_t>(replay.ids.size()) != tokens * cfg.top_k)
    return status::make(status_code::invalid_shape,
                        "replay ids has " + std::to_string(replay.ids.size()) +
                            " elements, expected tokens * top_k = " + std::to_string(tokens) +
                            " * " + std::to_string(cfg.top_k));
  return check_replay_ids(cfg, replay.ids.data(), tokens, "replay ids");
}

/// @brief Checks a gating call's inputs against the config.
[[nodiscard]] inline status validate_gating_inputs(const routing_config& cfg, std::int64_t tokens,
                                                   std::size_t logits_size,
                                                   std::span<const float> bias,
                                                   std::span<const std::uint8_t> valid) {
  if (auto s = validate(cfg); !s) return s;
  if (auto s = validate_tokens(cfg, tokens); !s) return s;
  const std::int64_t E = cfg.num_experts;
  if (static_cast<std::int64_t>(logits_size) != tokens * E)
    return status::make(status_code::invalid_shape, "logits has " + std::to_string(logits_size) +
                                                        " elements, expected tokens * "
                                                        "num_experts = " +
                                                        std::to_string(tokens) + " * " +
                                                        std::to_string(E));
  if (cfg.gating.expert_bias) {
    if (static_cast<std::int64_t>(bias.size()) != E)
      return status::make(status_code::invalid_argument,
                          "expert_bias has " + std::to_string(bias.size()) +
                              " elements, expected num_experts = " + std::to_string(E));
    for (std::size_t e = 0; e < bias.size(); ++e)
      if (!std::isfinite(bias[e]))
        return status::make(status_code::invalid_argument,
                            "expert_bias[" + std::to_string(e) + "] is not finite");
  } else if (!bias.empty()) {
    return status::make(status_code::invalid_argument,
                        "expert_bias given but gating.expert_bias is false");
  }
  if (!valid.empty() && static_cast<std::int64_t>(valid.size()) != tokens)
    return status::make(status_code::invalid_shape,
                        "valid mask has " + std::to_string(valid.size()) +
                            " elements, expected tokens = " + std::to_string(tokens));
  return status::success();
}

/// @brief Gating for a batch: scores, bias, group limit, noise, top-k, renormalisation, scaling.
/// @param cfg    a config that passes validate()
/// @param logits [T, E] router logits, row-major (float, half_bits or bf16_bits)
/// @param tokens T
/// @param bias   [E] expert bias for selection (only when cfg.gating.expert_bias), else empty
/// @param valid  [T] 1 for real tokens, 0 for padding (empty: all valid). Padding tokens are
///               still ranked (their ids are defined) but count in no loss and get no slot.
/// @param replay routing replay (docs/replay.md): the selection per slot forced, the gates
///               recomputed from these logits; empty ids = the router's own choice
/// @return gating_output; throws moeroute::error on invalid input.
/// @note Ties go to the lower expert index (and, for groups, the lower group index).
///       NaN logits count as -FLT_MAX, +-Inf as +-FLT_MAX (docs/numerics.md, "Non-finite").
template <class In>
gating_output gating(const routing_config& cfg, std::span<const In> logits, std::int64_t tokens,
                     std::span<const float> bias = {}, std::span<const std::uint8_t> valid = {},
                     const replay_input& replay = {}) {
  throw_if_error(validate_gating_inputs(cfg, tokens, logits.size(), bias, valid));
  throw_if_error(validate_replay_input(cfg, tokens, replay));
  const double log_ratio = replay_log_ratio(replay.min_score_ratio);
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;
  const auto& g = cfg.gating;
  const bool softmax_after =
      g.score == score_function::softmax && g.stage == softmax_stage::after_topk;
  const bool noise = cfg.noise_active();
  const std::int32_t R = cfg.reroute_candidates();

  gating_output out;
  out.tokens = tokens;
  out.experts = E;
  out.k = k;
  out.reroute_candidates = R;
  out.ids.assign(tokens * k, 0);
  out.gates.assign(tokens * k, 0.0f);
  out.reroute_ids.assign(tokens * R, 0);
  out.logsumexp.assign(tokens, 0.0f);
  const bool wants_priority = cfg.dispatch.prio == priority::batch_prioritized;
  if (wants_priority) out.token_priority.assign(tokens, 0.0f);
  const auto second = g.second_expert.policy;
  if (second == second_expert_policy::random) out.second_skipped.assign(tokens, 0);
  out.valid.assign(tokens, 1);
  if (!valid.empty()) std::copy(valid.begin(), valid.end(), out.valid.begin());
  out.aux_score_sum.assign(E, 0.0);
  out.aux_count.assign(E, 0);
  const std::int64_t L = cfg.loss.sequence_length;
  out.sequences = L > 0 ? tokens / L : 0;
  out.seq_score_sum.assign(out.sequences * E, 0.0);
  out.seq_count.assign(out.sequences * E, 0);
  out.seq_tokens.assign(out.sequences, 0);
  const std::int32_t counted = cfg.aux_counts_per_token();
  out.aux_scores.assign(tokens * E, 0.0f);
  out.aux_count_ids.assign(tokens * counted, -1);

  std::vector<float> x(E), xn(E), gate_scores(E), sel(E), aux_p(E);
  std::vector<std::uint8_t> allowed(E), all_allowed(E, 1);
  std::vector<std::int32_t> order, group_members, fresh;
  const std::int32_t G = g.group_limit.groups > 1 ? g.group_limit.groups : 1;
  const std::int32_t per_group = E / G;

  for (std::int64_t t = 0; t < tokens; ++t) {
    // 1. sanitise, logsumexp of the clean logits (z-loss)
    float m = -FLT_MAX;
    for (std::int32_t e = 0; e < E; ++e) {
      const float raw = to_float(logits[t * E + e]);
      if (!std::isfinite(raw)) ++out.nonfinite_logits;
      x[e] = detail::sanitize(raw);
      m = std::max(m, x[e]);
    }
    double se = 0.0;
    for (std::int32_t e = 0; e < E; ++e) se += std::exp(static_cast<double>(x[e]) - m);
    out.logsumexp[t] = static_cast<float>(m + std::log(se));

    // 2. noise (Philox per (token, expert)), re-sanitised so huge noise cannot overflow
    xn = x;
    if (noise) detail::noisy_logits(g.noise, x.data(), t, E, xn.data());
    const bool noisy_gates = noise && g.noise.target == noise_target::selection_and_gates;
    const std::vector<float>& gate_logits = noisy_gates ? xn : x;

    // 3. scores for the gates, and the selection values (scores or logits, + bias)
    if (!softmax_after) detail::scores_row(g.score, gate_logits.data(), E, gate_scores.data());
    if (g.select == select_from::scores) {
      if (noise && !noisy_gates) {
        detail::scores_row(g.score, xn.data(), E, sel.data());
      } else {
        sel = gate_scores;
      }
    } else {
      sel = xn;
    }
    if (g.expert_bias)
      for (std::int32_t e = 0; e < E; ++e) sel[e] = detail::sanitize(sel[e] + bias[e]);

    // 4. group limit: group score = sum of its top-n selection values (group_score_take)
    if (G > 1) {
      const std::int32_t per = group_score_take(cfg);
      std::vector<float> group_score(G);
      for (std::int32_t grp = 0; grp < G; ++grp) {
        std::vector<float> v(sel.begin() + grp * per_group, sel.begin() + (grp + 1) * per_group);
        std::vector<std::uint8_t> a(per_group, 1);
        detail::top_n(v, a, per, group_members);
        double s = 0.0;  // descending order, in double: see docs/numerics.md
        for (std::int32_t i : group_members) s += v[i];
        group_score[grp] = static_cast<float>(s);
      }
      std::vector<std::uint8_t> ga(G, 1);
      std::vector<std::int32_t> chosen_groups;
      detail::top_n(group_score, ga, g.group_limit.group_topk, chosen_groups);
      std::fill(allowed.begin(), allowed.end(), 0);
      for (std::int32_t grp : chosen_groups)
        std::fill(allowed.begin() + grp * per_group, allowed.begin() + (grp + 1) * per_group, 1);
    } else {
      allowed = all_allowed;
    }

    // 4b. NLLB "sampling": the first choice stays, the second is the best of the others by
    //     x_e + Gumbel(t, e) (the first is pinned to FLT_MAX so the top-k keeps it first)
    if (second == second_expert_policy::sampling) {
      detail::top_n(sel, allowed, 1, order);
      for (std::int32_t e = 0; e < E; ++e) {
        if (e == order[0]) {
          sel[e] = FLT_MAX;
          continue;
        }
        sel[e] =
            detail::sanitize(x[e] + rng::second_expert_gumbel(g.second_expert.seed,
                                                              g.second_expert.offset, t, E, e));
      }
    }

    // 5. top-k (+ R reroute candidates), best first, ties to the lower index; under replay
    //    the replayed ids in their slots and the router's choice in the others
    if (replay.ids.empty()) {
      detail::top_n(sel, allowed, k + R, order);
    } else {
      const std::int64_t replaced = detail::replay_order(
          cfg, &replay.ids[t * k], replay.min_score_ratio, log_ratio, sel, allowed, x, order);
      if (out.valid[t]) out.replay_replaced += replaced;
    }
    for (std::int32_t j = 0; j < k; ++j) out.ids[t * k + j] = order[j];
    for (std::int32_t r = 0; r < R; ++r) out.reroute_ids[t * R + r] = order[k + r];

    // 6. gates
    float* gt = &out.gates[t * k];
    if (softmax_after) {
      std::vector<float> chosen(k);
      for (std::int32_t j = 0; j < k; ++j) chosen[j] = gate_logits[order[j]];
      detail::softmax_row(chosen.data(), k, gt);
    } else {
      for (std::int32_t j = 0; j < k; ++j) gt[j] = gate_scores[order[j]];
      if (g.renorm == renormalize::before_drop) {
        float sum = 0.0f;
        for (std::int32_t j = 0; j < k; ++j) sum += gt[j];
        const float denom = sum + g.renorm_epsilon;
        for (std::int32_t j = 0; j < k; ++j) gt[j] = denom > 0.0f ? gt[j] / denom : 0.0f;
      }
    }
    // NLLB "random": keep the second choice when 2 * p2 > u (p2 before renormalisation)
    if (second == second_expert_policy::random) {
      const float p2 = gate_scores[order[1]];
      const float u = rng::second_expert_uniform(g.second_expert.seed, g.second_expert.offset, t);
      out.second_skipped[t] = 2.0f * p2 > u ? 0 : 1;
    }
    if (g.renorm != renormalize::after_drop)
      for (std::int32_t j = 0; j < k; ++j) gt[j] *= g.scaling_factor;

    // the token's batch priority: its top-1 clean score — for softmax the largest aux P,
    // computed once here for both
    const bool softmax_p = g.score == score_function::softmax;
    if (softmax_p && (wants_priority || out.valid[t]))
      detail::softmax_row(x.data(), E, aux_p.data());
    if (wants_priority)
      out.token_priority[t] =
          softmax_p ? *std::max_element(aux_p.begin(), aux_p.end()) : detail::score_one(g.score, m);

    // 7. aux-loss inputs: P = softmax over all (clean) logits, or normalised per-expert scores
    if (!out.valid[t]) continue;
    ++out.valid_tokens;
    if (!softmax_p) {
      detail::scores_row(g.score, x.data(), E, aux_p.data());
      float s = 0.0f;
      for (std::int32_t e = 0; e < E; ++e) s += aux_p[e];
      for (std::int32_t e = 0; e < E; ++e) aux_p[e] = aux_p[e] / (s + 1e-20f);
    }
    const std::int32_t* count_ids = &out.ids[t * k];
    if (cfg.loss.count_source == aux_count_source::fresh_topk) {
      detail::top_n(aux_p, all_allowed, counted, fresh);
      count_ids = fresh.data();
    }
    std::copy(aux_p.begin(), aux_p.end(), out.aux_scores.begin() + t * E);
    std::copy(count_ids, count_ids + counted, out.aux_count_ids.begin() + t * counted);
    const std::int64_t seq =
        L > 0 ? sequence_of_token(cfg.loss.sequence_order, t, out.sequences, L) : -1;
    for (std::int32_t e = 0; e < E; ++e) {
      out.aux_score_sum[e] += aux_p[e];
      if (seq >= 0) out.seq_score_sum[seq * E + e] += aux_p[e];
    }
    for (std::int32_t j = 0; j < counted; ++j) {
      ++out.aux_count[count_ids[j]];
      if (seq >= 0) ++out.seq_count[seq * E + count_ids[j]];
    }
    if (seq >= 0) ++out.seq_tokens[seq];
  }
  return out;
}

/// Convenience overload for std::vector / contiguous ranges of float.
inline gating_output gating(const routing_config& cfg, const std::vector<float>& logits,
                            std::int64_t tokens, std::span<const float> bias = {},
                            std::span<const std::uint8_t> valid = {},
                            const replay_input& replay = {}) {
  return gating<float>(cfg, std::span<const float>(logits), tokens, bias, valid, replay);
}

}  // namespace moeroute::reference
MOEROUTE_PRECISE_FP_END
