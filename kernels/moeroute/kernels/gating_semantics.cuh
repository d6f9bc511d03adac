// SPDX-License-Identifier: Apache-2.0
// The part of a routing_config the gating kernels (forward and backward) act on, digested once
// on the host into flags and numbers a kernel can branch on directly.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>

namespace moeroute::kernels {

struct gating_semantics {
  std::int32_t experts = 0, k = 0;
  std::int32_t reroute = 0;  ///< R, next-best candidates ranked after the k
  score_function score = score_function::softmax;
  bool select_scores = false;  ///< top-k over scores (else over logits)
  bool softmax_after = false;  ///< softmax over the k chosen logits
  bool before_drop = false;    ///< gates divided by their sum before drop (not softmax_after)
  bool after_drop = false;     ///< combine weights divided by the surviving sum
  float renorm_epsilon = 0.0f, scaling = 1.0f;
  std::int32_t groups = 1, group_topk = 1, per_group = 0, group_take = 0;
  bool noise = false, gaussian = true, noisy_gates = false;
  float noise_scale = 0.0f;
  std::uint64_t noise_seed = 0, noise_offset = 0;
  std::int32_t counted = 1;      ///< assignments counted per token in the aux loss (1 or k)
  bool fresh_counts = false;     ///< counts from a fresh top-k on P (Megatron)
  bool token_priority = false;   ///< write the top-1 clean score (batch_prioritized)
  bool second_sampling = false;  ///< second choice by Gumbel noise on the logits (NLLB)
  bool second_random = false;    ///< keep the second choice when 2 * p2 > u (NLLB)
  std::uint64_t second_seed = 0, second_offset = 0;
};

/// @brief The semantics of `cfg` (which must pass validate()).
inline gating_semantics make_gating_semantics(const routing_config& cfg) {
  const auto& g = cfg.gating;
  gating_semantics s;
  s.experts = cfg.num_experts;
  s.k = cfg.top_k;
  s.reroute = cfg.reroute_candidates();
  s.score = g.score;
  s.select_scores = g.select == select_from::scores;
  s.softmax_after = g.score == score_function::softmax && g.stage == softmax_stage::after_topk;
  s.before_drop = g.renorm == renormalize::before_drop && !s.softmax_after;
  s.after_drop = g.renorm == renormalize::after_drop;
  s.renorm_epsilon = g.renorm_epsilon;
  s.scaling = g.scaling_factor;
  s.groups = g.group_limit.groups > 1 ? g.group_limit.groups : 1;
  s.group_topk = s.groups > 1 ? g.group_limit.group_topk : 1;
  s.per_group = cfg.num_experts / s.groups;
  s.group_take = group_score_take(cfg);
  s.noise = cfg.noise_active();
  s.gaussian = g.noise.kind == noise_kind::gaussian;
  s.noisy_gates = s.noise && g.noise.target == noise_target::selection_and_gates;
  s.noise_scale = g.noise.scale;
  s.noise_seed = g.noise.seed;
  s.noise_offset = g.noise.offset;
  s.counted = cfg.aux_counts_per_token();
  s.fresh_counts = cfg.loss.count_source == aux_count_source::fresh_topk;
  s.token_priority = cfg.dispatch.prio == priority::batch_prioritized;
  s.second_sampling = g.second_expert.policy == second_expert_policy::sampling;
  s.second_random = g.second_expert.policy == second_expert_policy::random;
  s.second_seed = g.second_expert.seed;
  s.second_offset = g.second_expert.offset;
  return s;
}

}  // namespace moeroute::kernels
