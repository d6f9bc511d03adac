// SPDX-License-Identifier: Apache-2.0
// Named configurations that reproduce each peer's routing exactly (checked against the peers'
// own outputs in tests/data/golden). Each returns a plain routing_config to adjust further.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include <moeroute/config.hpp>

namespace moeroute::presets {

/// The `moe_route` / `load_balancing_loss` of the design notes (seed 004): softmax, top-k on
/// the probabilities, renormalise before drop, C = int(factor * T / E), token loop, residual.
inline routing_config seed_reference(std::int32_t experts, std::int32_t k, double factor = 1.25) {
  routing_config c;
  c.num_experts = experts;
  c.top_k = k;
  c.gating.select = select_from::scores;
  c.gating.renorm = renormalize::before_drop;
  c.capacity.factor = factor;
  c.capacity.includes_k = false;
  c.capacity.rounding = capacity_rounding::floor;
  c.dispatch.prio = priority::token_major;
  c.dispatch.dropped = drop_policy::residual;
  c.loss.counts = aux_counts::top1;
  c.loss.scale = aux_scale::e_times_sum;
  return c;
}

/// DeepSpeed `top2gating` (GShard top-2 without second-expert sampling): choice-major slots,
/// renormalise after drop, f from the top-1 choice, min capacity 4.
inline routing_config deepspeed_top2(std::int32_t experts, double factor = 1.0,
                                     std::int64_t min_capacity = 4) {
  routing_config c;
  c.num_experts = experts;
  c.top_k = 2;
  c.gating.select = select_from::scores;
  c.gating.renorm = renormalize::after_drop;
  c.capacity.factor = factor;
  c.capacity.min_capacity = min_capacity;
  c.dispatch.prio = priority::choice_major;
  c.loss.counts = aux_counts::top1;
  c.loss.scale = aux_scale::e_times_sum;
  return c;
}

/// GShard top-2 as in the paper and Tutel: the same routing as deepspeed_top2.
inline routing_config gshard_top2(std::int32_t experts, double factor = 1.0,
                                  std::int64_t min_capacity = 4) {
  return deepspeed_top2(experts, factor, min_capacity);
}

/// DeepSpeed `topkgating` with drop_policy "position": token-major slots, renormalise after
/// drop, f over all k choices, E/k scaling.
inline routing_config deepspeed_topk(std::int32_t experts, std::int32_t k, double factor = 1.0,
                                     std::int64_t min_capacity = 4) {
  routing_config c;
  c.num_experts = experts;
  c.top_k = k;
  c.gating.select = select_from::logits;
  c.gating.renorm = renormalize::after_drop;
  c.capacity.factor = factor;
  c.capacity.min_capacity = min_capacity;
  c.dispatch.prio = priority::token_major;
  c.loss.counts = aux_counts::all_k;
  c.loss.scale = aux_scale::e_over_k_sum;
  return c;
}

/// Switch Transformer top-1: softmax gate (no renormalisation), capacity factor 1.25 by
/// default, residual pass-through of dropped tokens, f from the top-1 choice.
inline routing_config switch_top1(std::int32_t experts, double factor = 1.25,
                                  std::int64_t min_capacity = 4) {
  routing_config c;
  c.num_experts = experts;
  c.top_k = 1;
  c.gating.select = select_from::logits;
  c.gating.renorm = renormalize::none;
  c.capacity.factor = factor;
  c.capacity.min_capacity = min_capacity;
  c.dispatch.prio = priority::token_major;
  c.dispatch.dropped = drop_policy::residual;
  c.loss.counts = aux_counts::top1;
  c.loss.scale = aux_scale::e_times_sum;
  return c;
}

/// Options of Megatron-Core's TopKRouter that change the routing.
struct megatron_options {
  score_function score = score_function::softmax;
  bool pre_softmax = false;  ///< moe_router_pre_softmax
  /// moe_expert_capacity_factor; NaN = dropless (no capacity)
  double capacity_factor = std::numeric_limits<double>::quiet_NaN();
  std::int32_t groups = 0;        ///< moe_router_num_groups
  std::int32_t group_topk = 0;    ///< moe_router_group_topk
  float scaling_factor = 1.0f;    ///< moe_router_topk_scaling_factor
  bool expert_bias = false;       ///< moe_router_enable_expert_bias
};

/// Megatron-Core `topk_routing_with_score_function` + `apply_router_token_dropping`
/// (drop_policy "probs") + `switch_load_balancing_loss_func` with
/// `compute_routing_scores_for_aux_loss` (a fresh top-k on the unbiased aux scores).
inline routing_config megatron(std::int32_t experts, std::int32_t k, const megatron_options& o = {}) {
  routing_config c;
  c.num_experts = experts;
  c.top_k = k;
  c.gating.score = o.score;
  if (o.score == score_function::softmax) {
    if (o.pre_softmax) {
      c.gating.select = select_from::scores;
      c.gating.renorm = renormalize::none;
    } else {
      c.gating.select = select_from::logits;
      c.gating.stage = softmax_stage::after_topk;
      c.gating.renorm = renormalize::before_drop;
    }
  } else {
    c.gating.select = select_from::scores;
    c.gating.renorm = k > 1 ? renormalize::before_drop : renormalize::none;
    c.gating.renorm_epsilon = 1e-20f;
  }
  c.gating.scaling_factor = o.scaling_factor;
  c.gating.expert_bias = o.expert_bias;
  c.gating.group_limit = {o.groups, o.group_topk};
  if (std::isnan(o.capacity_factor)) {
    c.capacity.mode = capacity_mode::unbounded;
  } else {
    c.capacity.factor = o.capacity_factor;
    c.capacity.no_drop_when_exceeds_tokens = true;
  }
  c.dispatch.prio = priority::score_per_expert;
  c.dispatch.slots = slot_order::token_index;
  c.loss.counts = aux_counts::all_k;
  c.loss.count_source = aux_count_source::fresh_topk;
  c.loss.scale = aux_scale::e_over_k_sum;
  return c;
}

/// Mixtral 8x7B: top-2 on logits, softmax over the two chosen, dropless; HuggingFace's
/// load_balancing_loss_func (f over all k, E * sum f P, so k at perfect balance).
inline routing_config mixtral(std::int32_t experts = 8, std::int32_t k = 2) {
  routing_config c;
  c.num_experts = experts;
  c.top_k = k;
  c.gating.select = select_from::logits;
  c.gating.stage = softmax_stage::after_topk;
  c.gating.renorm = renormalize::before_drop;
  c.capacity.mode = capacity_mode::unbounded;
  c.loss.counts = aux_counts::all_k;
  c.loss.scale = aux_scale::e_times_sum;
  c.loss.aux_coefficient = 0.02f;
  c.loss.z_coefficient = 0.001f;
  return c;
}

/// DeepSeek-V3: sigmoid scores, expert bias for selection (aux-loss-free balancing), 8 groups
/// with top-4 groups by the sum of each group's top-2, top-8, renormalised, scaled by 2.5,
/// dropless; a small sequence-level aux loss.
inline routing_config deepseek_v3(std::int32_t experts = 256, std::int32_t k = 8,
                                  std::int32_t groups = 8, std::int32_t group_topk = 4) {
  routing_config c;
  c.num_experts = experts;
  c.top_k = k;
  c.gating.score = score_function::sigmoid;
  c.gating.select = select_from::scores;
  c.gating.renorm = renormalize::before_drop;
  c.gating.renorm_epsilon = 1e-20f;
  c.gating.scaling_factor = 2.5f;
  c.gating.expert_bias = true;
  c.gating.group_limit = {groups, group_topk};
  c.capacity.mode = capacity_mode::unbounded;
  c.loss.counts = aux_counts::all_k;
  c.loss.scale = aux_scale::e_over_k_sum;
  c.loss.aux_coefficient = 1e-4f;
  return c;
}

/// Qwen2/Qwen3-MoE: softmax over all, top-k on the probabilities, optional renormalisation
/// (norm_topk_prob: Qwen3 true, Qwen1.5 false), dropless, HuggingFace aux loss.
inline routing_config qwen_moe(std::int32_t experts = 128, std::int32_t k = 8, bool norm_topk_prob = true) {
  routing_config c;
  c.num_experts = experts;
  c.top_k = k;
  c.gating.select = select_from::scores;
  c.gating.renorm = norm_topk_prob ? renormalize::before_drop : renormalize::none;
  c.capacity.mode = capacity_mode::unbounded;
  c.loss.counts = aux_counts::all_k;
  c.loss.scale = aux_scale::e_times_sum;
  c.loss.aux_coefficient = 0.001f;
  return c;
}

/// OLMoE: softmax over all 64, top-8 on the probabilities, no renormalisation, dropless,
/// HuggingFace aux loss and a router z-loss.
inline routing_config olmoe(std::int32_t experts = 64, std::int32_t k = 8) {
  routing_config c = qwen_moe(experts, k, false);
  c.loss.aux_coefficient = 0.01f;
  c.loss.z_coefficient = 0.001f;
  return c;
}

}  // namespace moeroute::presets
