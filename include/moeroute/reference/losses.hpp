// SPDX-License-Identifier: Apache-2.0
// CPU reference, stage 5: the Switch/GShard load-balancing loss (batch and sequence level) and
// the ST-MoE router z-loss. Each returns the value and the raw sums, so a caller that shards a
// batch over ranks can add the sums and recompute the global loss exactly (docs/numerics.md).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/reference/gating.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::reference {

namespace detail {
/// The losses read the gating_output's per-expert and per-token sums: they must belong to cfg.
inline void check_loss_inputs(const routing_config& cfg, const gating_output& g) {
  throw_if_error(validate(cfg));
  const auto fail = [](status_code c, const std::string& m) { throw error(status::make(c, m)); };
  if (g.experts != cfg.num_experts || g.k != cfg.top_k)
    fail(status_code::invalid_argument,
         "gating_output (experts = " + std::to_string(g.experts) + ", k = " + std::to_string(g.k) +
             ") does not match config (num_experts = " + std::to_string(cfg.num_experts) +
             ", top_k = " + std::to_string(cfg.top_k) + ")");
  const std::int64_t E = g.experts, T = g.tokens, S = g.sequences;
  if (T < 0 || S < 0 || g.valid_tokens < 0 || g.valid_tokens > T)
    fail(status_code::invalid_shape, "gating_output: tokens = " + std::to_string(T) +
                                         ", valid_tokens = " + std::to_string(g.valid_tokens) +
                                         ", sequences = " + std::to_string(S) +
                                         " are inconsistent");
  const auto sized = [&](const char* what, std::size_t got, std::int64_t want) {
    if (static_cast<std::int64_t>(got) != want)
      fail(status_code::invalid_shape, std::string("gating_output.") + what + " has " +
                                           std::to_string(got) + " elements, expected " +
                                           std::to_string(want));
  };
  sized("aux_score_sum", g.aux_score_sum.size(), E);
  sized("aux_count", g.aux_count.size(), E);
  sized("valid", g.valid.size(), T);
  sized("logsumexp", g.logsumexp.size(), T);
  sized("seq_score_sum", g.seq_score_sum.size(), S * E);
  sized("seq_count", g.seq_count.size(), S * E);
  sized("seq_tokens", g.seq_tokens.size(), S);
}
}  // namespace detail

struct aux_loss_result {
  double value = 0.0;                ///< coefficient * scale * sum_i (count_i/T) (P_sum_i/T)
  double scale = 0.0;                ///< the s above (without the coefficient)
  std::int64_t tokens = 0;           ///< valid tokens T
  std::vector<double> score_sum;     ///< [E] sum_t P[t, i]
  std::vector<std::int64_t> counts;  ///< [E] count_i
};

/// @brief Batch-level aux loss from a gating_output. Zero valid tokens give 0.
[[nodiscard]] inline aux_loss_result aux_loss(const routing_config& cfg, const gating_output& g) {
  detail::check_loss_inputs(cfg, g);
  aux_loss_result r;
  r.scale = aux_loss_scale(cfg);
  r.tokens = g.valid_tokens;
  r.score_sum = g.aux_score_sum;
  r.counts = g.aux_count;
  if (g.valid_tokens == 0) return r;
  double s = 0.0;
  const double T = static_cast<double>(g.valid_tokens);
  for (std::int32_t e = 0; e < g.experts; ++e)
    s += (static_cast<double>(g.aux_count[e]) / T) * (g.aux_score_sum[e] / T);
  r.value = cfg.loss.aux_coefficient * r.scale * s;
  return r;
}

/// @brief Combine aux-loss sums gathered from several shards of one global batch:
///        counts and score sums add, token counts add, then the same formula applies.
[[nodiscard]] inline double aux_loss_from_sums(const routing_config& cfg,
                                               const std::vector<double>& score_sum,
                                               const std::vector<std::int64_t>& counts,
                                               std::int64_t tokens) {
  throw_if_error(validate(cfg));
  const auto E = static_cast<std::size_t>(cfg.num_experts);
  if (score_sum.size() != E || counts.size() != E)
    throw error(status::make(status_code::invalid_shape,
                             "score_sum has " + std::to_string(score_sum.size()) + " and counts " +
                                 std::to_string(counts.size()) +
                                 " elements, expected num_experts = " + std::to_string(E) +
                                 " each"));
  if (tokens < 0)
    throw error(status::make(status_code::invalid_shape,
                             moeroute::detail::field_msg("tokens", tokens, "must be >= 0")));
  if (tokens == 0) return 0.0;
  double s = 0.0;
  const double T = static_cast<double>(tokens);
  for (std::size_t e = 0; e < score_sum.size(); ++e)
    s += (static_cast<double>(counts[e]) / T) * (score_sum[e] / T);
  return cfg.loss.aux_coefficient * aux_loss_scale(cfg) * s;
}

/// @brief Sequence-level aux loss from per-sequence sums: sequence s's aux loss is
///        coefficient * scale * sum_e (count[s, e] / L_s) (score_sum[s, e] / L_s) with L_s its
///        valid tokens, and loss.sequence_reduce makes one value of them: their sum, or their
///        mean over the sequences with L_s > 0. Sums of one sequence gathered from several
///        shards (context parallelism, chunked sequences) add before this call, so the loss is
///        the unsharded one exactly; sequences on different ranks are independent terms.
/// @param score_sum [S, E] sum of P over each sequence's valid tokens
/// @param counts    [S, E] aux-loss counts in each sequence
/// @param tokens    [S] valid tokens of each sequence
/// @throws error (invalid_shape) naming the argument whose size is not S * E / S.
[[nodiscard]] inline double sequence_aux_loss_from_sums(const routing_config& cfg,
                                                        std::span<const double> score_sum,
                                                        std::span<const std::int64_t> counts,
                                                        std::span<const std::int64_t> tokens) {
  throw_if_error(validate(cfg));
  const std::int64_t E = cfg.num_experts, S = static_cast<std::int64_t>(tokens.size());
  const auto sized = [&](const char* what, std::size_t got) {
    if (static_cast<std::int64_t>(got) != S * E)
      throw error(status::make(
          status_code::invalid_shape,
          std::string(what) + " has " + std::to_string(got) +
              " elements, expected tokens.size() * num_experts = " + std::to_string(S * E)));
  };
  sized("score_sum", score_sum.size());
  sized("counts", counts.size());
  const double scale = aux_loss_scale(cfg);
  double total = 0.0;
  std::int64_t used = 0;
  for (std::int64_t q = 0; q < S; ++q) {
    if (tokens[q] < 0)
      throw error(status::make(
          status_code::invalid_argument,
          "tokens[" + std::to_string(q) + "] = " + std::to_string(tokens[q]) + ": must be >= 0"));
    const double L = static_cast<double>(tokens[q]);
    if (L == 0) continue;
    double acc = 0.0;
    for (std::int64_t e = 0; e < E; ++e)
      acc += (static_cast<double>(counts[q * E + e]) / L) * (score_sum[q * E + e] / L);
    total += scale * acc;
    ++used;
  }
  if (used == 0) return 0.0;
  return cfg.loss.sequence_reduce == sequence_reduction::sum
             ? cfg.loss.aux_coefficient * total
             : cfg.loss.aux_coefficient * total / static_cast<double>(used);
}

/// @brief Sequence-level aux loss of a gating_output: sequence_aux_loss_from_sums on its
///        per-sequence sums (loss.sequence_length > 0; sequences as loss.sequence_order lays
///        them out). 0 without sequences.
[[nodiscard]] inline double sequence_aux_loss(const routing_config& cfg, const gating_output& g) {
  detail::check_loss_inputs(cfg, g);
  if (g.sequences == 0) return 0.0;
  return sequence_aux_loss_from_sums(cfg, g.seq_score_sum, g.seq_count, g.seq_tokens);
}

struct z_loss_result {
  double value = 0.0;        ///< coefficient * sum_t lse_t^2 / T
  double sum_squares = 0.0;  ///< sum_t lse_t^2 over valid tokens (in double)
  std::int64_t tokens = 0;
};

/// @brief Router z-loss (ST-MoE): mean over valid tokens of logsumexp(logits)^2.
[[nodiscard]] inline z_loss_result z_loss(const routing_config& cfg, const gating_output& g) {
  detail::check_loss_inputs(cfg, g);
  z_loss_result r;
  r.tokens = g.valid_tokens;
  for (std::int64_t t = 0; t < g.tokens; ++t) {
    if (!g.valid[t]) continue;
    const double l = g.logsumexp[t];
    r.sum_squares += l * l;
  }
  if (r.tokens) r.value = cfg.loss.z_coefficient * r.sum_squares / static_cast<double>(r.tokens);
  return r;
}

/// @brief All three losses of one gating: the op the CUDA backend's `losses` computes.
struct loss_output {
  aux_loss_result aux;        ///< batch-level aux loss and its sums
  double sequence_aux = 0.0;  ///< sequence-level aux loss (0 when loss.sequence_length is 0)
  z_loss_result z;            ///< router z-loss and its sum
};

/// @brief aux_loss, sequence_aux_loss and z_loss of a gating_output in one call.
[[nodiscard]] inline loss_output losses(const routing_config& cfg, const gating_output& g) {
  return {aux_loss(cfg, g), sequence_aux_loss(cfg, g), z_loss(cfg, g)};
}

}  // namespace moeroute::reference
MOEROUTE_PRECISE_FP_END
