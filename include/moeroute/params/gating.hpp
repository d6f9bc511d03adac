// SPDX-License-Identifier: Apache-2.0
// Parameters of the gating stage (router logits -> top-k ids, gates, logsumexp and the
// loss sums),
// shared by every backend: cpu::gating and cuda::gating take the same struct and start their
// validate() with the same check_params(). Pointers are named d_ (data) in both: device
// memory for the CUDA backend, host memory for the CPU backend. Plain C++.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/replay.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// @brief Inputs and outputs of one gating call. Every output is written (never added to).
///        R = cfg.reroute_candidates(); S = T / loss.sequence_length.
/// @tparam Element the logits' type: float, __half or __nv_bfloat16
template <class Element>
struct gating_params {
  const Element* d_logits = nullptr;  ///< [T, E] router logits
  std::int64_t tokens = 0;            ///< T
  const float* d_bias = nullptr;      ///< [E] f32 expert bias: required iff
                                      ///< cfg.gating.expert_bias; finite (not checked)
  const std::uint8_t* d_valid =
      nullptr;  ///< [T] uint8 1 = real token, 0 = padding; null = all valid
  /// Outputs: d_ids, d_gates [T, k]; d_reroute_ids [T, R] (needed iff R > 0); d_logsumexp [T]
  /// (optional); sums: d_aux_score_sum, d_aux_count [E], d_valid_tokens [1], d_z_sum_squares
  /// [1] (needed iff loss.z_coefficient != 0), d_nonfinite [1] (optional), d_seq_* (needed
  /// iff loss.sequence_length > 0);
  /// d_token_priority [T] (needed iff dispatch.prio = batch_prioritized); d_second_skipped [T]
  /// (needed iff gating.second_expert.policy = random).
  /// The inference path: with cfg.training = false every sum is optional (the three d_seq_*
  /// all or none) and a null one is neither written nor computed; with no sum, no d_aux_scores
  /// and no d_aux_count_ids the call does the selection and the gates only (no aux-loss inputs:
  /// on the GPU no P row, no counts and no reduction kernel).
  gating_result out{};
  /// Routing replay (moeroute/replay.hpp, docs/replay.md): the selection forced per slot, the
  /// gates recomputed from d_logits. Default: none.
  gating_replay replay{};
};

/// @brief Whether a gating call asks for any aux-loss input (a P or count sum, the sequence
///        sums, per-token P or count ids). false is the inference path: no P row, no counts.
///        Every backend decides it here.
[[nodiscard]] inline bool wants_aux_inputs(const routing_config& cfg,
                                           const gating_result& o) noexcept {
  const gating_sums& s = o.sums;
  return s.d_aux_score_sum != nullptr || s.d_aux_count != nullptr ||
         (cfg.loss.sequence_length > 0 && s.d_seq_score_sum != nullptr) ||
         o.d_aux_scores != nullptr || o.d_aux_count_ids != nullptr;
}

/// @brief Checks config, shape and pointers of a gating call; names the first bad field. Every
/// backend's validate() runs this first.
template <class Element>
[[nodiscard]] status check_params(const routing_config& cfg, const gating_params<Element>& p) {
  if (auto s = param_checks::validate_extents(cfg, p.tokens); !s) return s;
  if (!cfg.gating.expert_bias && p.d_bias != nullptr)
    return status::make(status_code::invalid_argument,
                        "d_bias given but gating.expert_bias is false");
  if (auto s = check_replay(p.replay); !s) return s;
  if (p.tokens == 0) return status::success();
  if (cfg.gating.expert_bias)
    if (auto s = param_checks::require_pointers("with gating.expert_bias = true",
                                                param_checks::required(p.d_bias, "d_bias"));
        !s)
      return s;
  const gating_result& o = p.out;
  if (auto s = param_checks::require_pointers("with tokens > 0",
                                              param_checks::required(p.d_logits, "d_logits"),
                                              param_checks::required(o.d_ids, "out.d_ids"),
                                              param_checks::required(o.d_gates, "out.d_gates"));
      !s)
    return s;
  if (cfg.training)
    if (auto s = param_checks::require_pointers(
            "with training = true (the inference path, training = false, may leave them null)",
            param_checks::required(o.sums.d_aux_score_sum, "out.sums.d_aux_score_sum"),
            param_checks::required(o.sums.d_aux_count, "out.sums.d_aux_count"),
            param_checks::required(o.sums.d_valid_tokens, "out.sums.d_valid_tokens"));
        !s)
      return s;
  if (cfg.training && cfg.loss.z_coefficient != 0.0f)
    if (auto s = param_checks::require_pointers(
            "with loss.z_coefficient != 0",
            param_checks::required(o.sums.d_z_sum_squares, "out.sums.d_z_sum_squares"));
        !s)
      return s;
  if (cfg.candidates_per_token() > cfg.top_k)
    if (auto s = param_checks::require_pointers(
            "with dispatch.dropped = next_choice (R > 0)",
            param_checks::required(o.d_reroute_ids, "out.d_reroute_ids"));
        !s)
      return s;
  if (cfg.dispatch.prio == priority::batch_prioritized)
    if (auto s = param_checks::require_pointers(
            "with dispatch.prio = batch_prioritized",
            param_checks::required(o.d_token_priority, "out.d_token_priority"));
        !s)
      return s;
  if (cfg.gating.second_expert.policy == second_expert_policy::random)
    if (auto s = param_checks::require_pointers(
            "with gating.second_expert.policy = random",
            param_checks::required(o.d_second_skipped, "out.d_second_skipped"));
        !s)
      return s;
  if (cfg.loss.sequence_length == 0) return status::success();
  if (!cfg.training && o.sums.d_seq_score_sum == nullptr && o.sums.d_seq_count == nullptr &&
      o.sums.d_seq_tokens == nullptr)
    return status::success();  // the inference path without sequence sums
  return param_checks::require_pointers(
      "with loss.sequence_length > 0",
      param_checks::required(o.sums.d_seq_score_sum, "out.sums.d_seq_score_sum"),
      param_checks::required(o.sums.d_seq_count, "out.sums.d_seq_count"),
      param_checks::required(o.sums.d_seq_tokens, "out.sums.d_seq_tokens"));
}

/// @brief The same call with the logits read as `To` (same size and bits, e.g. bf16_bits ->
///        __nv_bfloat16): every field copied, the element pointer re-typed.
template <class To, class From>
[[nodiscard]] gating_params<To> rebind(const gating_params<From>& p) noexcept {
  gating_params<To> q;
  q.d_logits = param_checks::rebind_elements<To>(p.d_logits);
  q.tokens = p.tokens;
  q.d_bias = p.d_bias;
  q.d_valid = p.d_valid;
  q.out = p.out;
  q.replay = p.replay;
  return q;
}

}  // namespace moeroute
