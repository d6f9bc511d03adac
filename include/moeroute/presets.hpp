// SPDX-License-Identifier: Apache-2.0
// Named configurations that reproduce each peer's routing exactly (checked against the peers'
// own outputs in tests/data/golden, tests/data/golden-grad and tests/data/golden-hf). Each
// returns a plain routing_config to adjust further. Every number a preset sets says where it
// comes from: the peer's code (file, function) or the model's published configuration.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <moeroute/config.hpp>
#include <moeroute/status.hpp>

namespace moeroute::presets {

namespace detail {

/// The choices every preset states: the shape, what top-k selects from, how the gates are
/// renormalised, and how the aux loss counts and scales.
inline routing_config preset_base(std::int32_t experts, std::int32_t k, select_from select,
                                  renormalize renorm, aux_counts counts, aux_scale scale) {
  routing_config c;
  c.num_experts = experts;
  c.top_k = k;
  c.gating.select = select;
  c.gating.renorm = renorm;
  c.loss.counts = counts;
  c.loss.scale = scale;
  return c;
}

/// A capacity-bounded peer: C = ceil(factor * T * k / E), at least min_capacity, slots
/// granted in `prio` order.
inline routing_config bounded(routing_config c, double factor, std::int64_t min_capacity,
                              priority prio) {
  c.capacity.factor = factor;
  c.capacity.min_capacity = min_capacity;
  c.dispatch.prio = prio;
  return c;
}

}  // namespace detail

/// A plain token-loop router (the golden cases named `seed_*` are its outputs): softmax, top-k
/// on the probabilities, renormalise before drop, C = int(factor * T / E) (no k), tokens in
/// order, dropped tokens pass through (residual), aux loss E * sum f P over the top-1 choice.
inline routing_config seed_reference(std::int32_t experts, std::int32_t k, double factor = 1.25) {
  routing_config c =
      detail::bounded(detail::preset_base(experts, k, select_from::scores, renormalize::before_drop,
                                          aux_counts::top1, aux_scale::e_times_sum),
                      factor, 0, priority::token_major);
  c.capacity.includes_k = false;
  c.capacity.rounding = capacity_rounding::floor;
  c.dispatch.dropped = drop_policy::residual;
  return c;
}

/// DeepSpeed `top2gating` (GShard top-2 without second-expert sampling): choice-major slots,
/// renormalise after drop, f from the top-1 choice, min capacity 4.
inline routing_config deepspeed_top2(std::int32_t experts, double factor = 1.0,
                                     std::int64_t min_capacity = 4) {
  return detail::bounded(
      detail::preset_base(experts, 2, select_from::scores, renormalize::after_drop,
                          aux_counts::top1, aux_scale::e_times_sum),
      factor, min_capacity, priority::choice_major);
}

/// GShard top-2 as in the paper and Tutel: the same routing as deepspeed_top2.
inline routing_config gshard_top2(std::int32_t experts, double factor = 1.0,
                                  std::int64_t min_capacity = 4) {
  return deepspeed_top2(experts, factor, min_capacity);
}

/// DeepSpeed `topkgating` (deepspeed/moe/sharded_moe.py) with drop_policy "position", as in
/// 2025 (commit 38327e07f6cd, the golden cases): top-k on the logits, token-major slots,
/// renormalise after drop, f over all k choices, E/k scaling, min_capacity 4 (the
/// TopKGate default).
inline routing_config deepspeed_topk(std::int32_t experts, std::int32_t k, double factor = 1.0,
                                     std::int64_t min_capacity = 4) {
  return detail::bounded(
      detail::preset_base(experts, k, select_from::logits, renormalize::after_drop,
                          aux_counts::all_k, aux_scale::e_over_k_sum),
      factor, min_capacity, priority::token_major);
}

/// DeepSpeed `topkgating` as of 2026 (deepspeedai/DeepSpeed): the top-k is taken on the
/// softmax scores instead of the logits (the two differ only where equal scores hide distinct
/// logits). PR #8155 bounds the k of the "probs" policy's torch.topk by T and leaves the
/// capacity as configured, so the "position" routing and its capacity are unchanged.
inline routing_config deepspeed_topk_2026(std::int32_t experts, std::int32_t k, double factor = 1.0,
                                          std::int64_t min_capacity = 4) {
  routing_config c = deepspeed_topk(experts, k, factor, min_capacity);
  c.gating.select = select_from::scores;
  return c;
}

/// Switch Transformer top-1 (Fedus et al. 2021, Mesh TensorFlow): softmax gate (no
/// renormalisation), capacity factor 1.25 by default, min capacity 4, residual pass-through
/// of dropped tokens, f from the top-1 choice. A fixed capacity: see switch_transformers.
inline routing_config switch_top1(std::int32_t experts, double factor = 1.25,
                                  std::int64_t min_capacity = 4) {
  routing_config c =
      detail::bounded(detail::preset_base(experts, 1, select_from::logits, renormalize::none,
                                          aux_counts::top1, aux_scale::e_times_sum),
                      factor, min_capacity, priority::token_major);
  c.dispatch.dropped = drop_policy::residual;
  return c;
}

/// HuggingFace `SwitchTransformersTop1Router` (transformers 5.24): softmax, top-1, a fixed
/// `expert_capacity` (SwitchTransformersConfig: 64) counted per batch row of `row_tokens`
/// tokens, first come first served along the row; f and P of the aux loss per row too
/// (load_balancing_loss_func: the mean over rows, so loss.sequence_length = row_tokens and the
/// loss is losses().sequence_aux); router_aux_loss_coef = router_z_loss_coef = 0.001
/// (SwitchTransformersConfig). row_tokens = 0: the batch is one row. A dropped token keeps
/// nothing (HF then outputs p * x for it; moeroute's residual passes x).
inline routing_config switch_transformers(std::int32_t experts = 8,
                                          std::int64_t expert_capacity = 64,
                                          std::int64_t row_tokens = 0) {
  routing_config c = detail::preset_base(experts, 1, select_from::scores, renormalize::none,
                                         aux_counts::top1, aux_scale::e_times_sum);
  c.capacity.mode = capacity_mode::fixed;
  c.capacity.fixed = expert_capacity;
  c.capacity.group_tokens = row_tokens;
  c.dispatch.dropped = drop_policy::residual;
  c.loss.sequence_length = row_tokens;
  c.loss.aux_coefficient = 0.001f;
  c.loss.z_coefficient = 0.001f;
  return c;
}

/// Options of HuggingFace's `NllbMoeTop2Router` (NllbMoeConfig) that change the routing.
struct nllb_moe_options {
  std::int64_t expert_capacity = -1;  ///< -1 (None): 2 * ceil(T / E) in training
  bool batch_prioritized_routing = false;
  bool normalize_router_prob_before_dropping = false;
  bool training = true;
  double eval_capacity_token_fraction = 1.0;  ///< moe_eval_capacity_token_fraction
  /// second_expert_policy: "all" (the default), "random" or "sampling", with its Philox key
  second_expert_config second_expert{};
};

/// HuggingFace `NllbMoeTop2Router` (transformers 5.24; second_expert_policy "all" by default,
/// "random" and "sampling" drawn from moeroute's Philox stream): softmax,
/// top-2; every first choice is served before any second choice (choice-major), or with
/// batch_prioritized_routing in descending order of the top-1 probability; capacity
/// expert_capacity, else 2 * ceil(T / E) in training and ceil(fraction * T) in eval (eval
/// with fraction > 0 overrides even an explicit expert_capacity, as route_tokens does);
/// gates renormalised over the top-2 before dropping, or over what survived; aux loss over
/// both choices (router_aux_loss_coef 0.001, router_z_loss_coef 0.001; NllbMoeConfig).
/// Padding tokens (padding_mask) are the invalid tokens of the gating call: no slot.
inline routing_config nllb_moe(std::int32_t experts = 128, const nllb_moe_options& o = {}) {
  routing_config c = detail::preset_base(
      experts, 2, select_from::scores,
      o.normalize_router_prob_before_dropping ? renormalize::before_drop : renormalize::after_drop,
      aux_counts::all_k, aux_scale::e_times_sum);
  c.training = o.training;
  if (!o.training && o.eval_capacity_token_fraction > 0.0) {
    c.capacity.mode = capacity_mode::batch_fraction;  // ceil(fraction * T)
    c.capacity.factor = o.eval_capacity_token_fraction;
  } else if (o.expert_capacity >= 0) {
    c.capacity.mode = capacity_mode::fixed;
    c.capacity.fixed = o.expert_capacity;
  } else {
    c.capacity.factor = 1.0;  // 2 * ceil(T / E)
    c.capacity.share = share_rounding::ceil;
    c.capacity.k_after_rounding = true;
  }
  c.gating.second_expert = o.second_expert;
  c.dispatch.prio =
      o.batch_prioritized_routing ? priority::batch_prioritized : priority::choice_major;
  c.loss.aux_coefficient = 0.001f;
  c.loss.z_coefficient = 0.001f;
  return c;
}

/// Tutel's capacity rule, k * floor(factor * ceil(T / E)), on its GShard top-k routing
/// (tutel/impls/fast_dispatch.py: capacity = top_k * int(capacity_factor * ceil(T / E));
/// normalize_gate divides the top-k gates by their sum before the drop; every first choice
/// before any second; the GShard aux loss over the top-1 choice).
inline routing_config tutel_topk(std::int32_t experts, std::int32_t k, double factor = 1.0) {
  routing_config c =
      detail::bounded(detail::preset_base(experts, k, select_from::scores, renormalize::before_drop,
                                          aux_counts::top1, aux_scale::e_times_sum),
                      factor, 0, priority::choice_major);
  c.capacity.share = share_rounding::ceil;
  c.capacity.k_after_rounding = true;
  c.capacity.rounding = capacity_rounding::floor;
  return c;
}

/// flaxformer's capacity rule, max(round(factor * T / E), 4) with Python's round (ties to
/// even), per group of tokens, batch-prioritised top-k (flaxformer/architectures/moe/routing.py
/// TokensChooseMaskedRouter with batch_prioritized_routing).
inline routing_config flaxformer_topk(std::int32_t experts, std::int32_t k, double factor = 1.0,
                                      std::int64_t group_tokens = 0) {
  routing_config c =
      detail::bounded(detail::preset_base(experts, k, select_from::scores, renormalize::none,
                                          aux_counts::all_k, aux_scale::e_times_sum),
                      factor, 4, priority::batch_prioritized);
  c.capacity.includes_k = false;
  c.capacity.rounding = capacity_rounding::nearest_even;
  c.capacity.group_tokens = group_tokens;
  return c;
}

/// MegaBlocks' capacity rule, floor(factor * k * T / E), for its capacity-bounded (non-dropless)
/// MoE: token-major slots on a softmax top-k (megablocks/layers/moe.py expert_capacity).
inline routing_config megablocks_topk(std::int32_t experts, std::int32_t k, double factor = 1.0) {
  routing_config c =
      detail::bounded(detail::preset_base(experts, k, select_from::scores, renormalize::none,
                                          aux_counts::all_k, aux_scale::e_over_k_sum),
                      factor, 0, priority::token_major);
  c.capacity.rounding = capacity_rounding::floor;
  return c;
}

/// Options of Megatron-Core's TopKRouter that change the routing.
struct megatron_options {
  score_function score = score_function::softmax;
  bool pre_softmax = false;  ///< moe_router_pre_softmax
  /// moe_expert_capacity_factor; NaN = dropless (no capacity)
  double capacity_factor = std::numeric_limits<double>::quiet_NaN();
  std::int32_t groups = 0;      ///< moe_router_num_groups
  std::int32_t group_topk = 0;  ///< moe_router_group_topk
  float scaling_factor = 1.0f;  ///< moe_router_topk_scaling_factor
  bool expert_bias = false;     ///< moe_router_enable_expert_bias
};

/// Megatron-Core `topk_routing_with_score_function` + `apply_router_token_dropping`
/// (drop_policy "probs") + `switch_load_balancing_loss_func` with
/// `compute_routing_scores_for_aux_loss` (a fresh top-k on the unbiased aux scores).
inline routing_config megatron(std::int32_t experts, std::int32_t k,
                               const megatron_options& o = {}) {
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

/// Mixtral 8x7B (HF MixtralTopKRouter): top-2 on logits, softmax over the two chosen,
/// dropless; HuggingFace's load_balancing_loss_func (f over all k, E * sum f P, so k at
/// perfect balance) with router_aux_loss_coef 0.02 (MixtralConfig). Mixtral has no z-loss.
inline routing_config mixtral(std::int32_t experts = 8, std::int32_t k = 2) {
  routing_config c = detail::preset_base(experts, k, select_from::logits, renormalize::before_drop,
                                         aux_counts::all_k, aux_scale::e_times_sum);
  c.gating.stage = softmax_stage::after_topk;
  c.capacity.mode = capacity_mode::unbounded;
  c.loss.aux_coefficient = 0.02f;
  c.loss.z_coefficient = 0.0f;
  return c;
}

/// DeepSeek-V3 (DeepSeek's inference/model.py Gate, HF DeepseekV3TopkRouter, vLLM, sglang):
/// sigmoid scores, expert bias for selection (aux-loss-free balancing), n_group 8 with the
/// topk_group 4 best groups by the sum of each group's top-2 biased scores (top-2 whatever k
/// and topk_group are), top-8 of 256, renormalised (norm_topk_prob), scaled by
/// routed_scaling_factor 2.5, dropless (config.json of deepseek-ai/DeepSeek-V3). The paper's
/// complementary balance loss is sequence-wise with alpha = 1e-4: set loss.sequence_length to
/// the sequence length to get it as losses().sequence_aux. DeepSeek-V3 has no z-loss
/// (z_coefficient 0: gating then needs no logsumexp). Megatron's group score (the top
/// k / topk_group) is presets::megatron with groups.
inline routing_config deepseek_v3(std::int32_t experts = 256, std::int32_t k = 8,
                                  std::int32_t groups = 8, std::int32_t group_topk = 4) {
  routing_config c = detail::preset_base(experts, k, select_from::scores, renormalize::before_drop,
                                         aux_counts::all_k, aux_scale::e_over_k_sum);
  c.gating.score = score_function::sigmoid;
  c.gating.renorm_epsilon = 1e-20f;
  c.gating.scaling_factor = 2.5f;
  c.gating.expert_bias = true;
  // a group of one expert is scored by that expert (DeepSeek's topk(2) needs two)
  const std::int32_t top_n = groups > 1 ? std::min(2, experts / groups) : 0;
  c.gating.group_limit = {groups, group_topk,
                          groups > 1 ? group_score::sum_top_n : group_score::sum_top_k_share,
                          top_n};
  c.capacity.mode = capacity_mode::unbounded;
  c.loss.aux_coefficient = 1e-4f;
  c.loss.z_coefficient = 0.0f;
  return c;
}

/// Qwen2-MoE / Qwen3-MoE (HF Qwen2MoeTopKRouter, Qwen3MoeTopKRouter): softmax over all, top-k
/// on the probabilities, renormalised when norm_topk_prob (Qwen3-30B-A3B / Qwen3-235B-A22B
/// config.json: true; Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B: false), dropless, HuggingFace aux
/// loss with router_aux_loss_coef 0.001. Defaults: Qwen3-30B-A3B, 128 experts, top-8.
inline routing_config qwen_moe(std::int32_t experts = 128, std::int32_t k = 8,
                               bool norm_topk_prob = true) {
  routing_config c =
      detail::preset_base(experts, k, select_from::scores,
                          norm_topk_prob ? renormalize::before_drop : renormalize::none,
                          aux_counts::all_k, aux_scale::e_times_sum);
  c.capacity.mode = capacity_mode::unbounded;
  c.loss.aux_coefficient = 0.001f;
  c.loss.z_coefficient = 0.0f;  // the HF routers compute no z-loss
  return c;
}

/// Qwen2-MoE (Qwen2-57B-A14B config.json): 64 experts, top-8, no renormalisation. The
/// routing is qwen_moe's.
inline routing_config qwen2_moe(std::int32_t experts = 64, std::int32_t k = 8,
                                bool norm_topk_prob = false) {
  return qwen_moe(experts, k, norm_topk_prob);
}

/// OLMoE-1B-7B (HF OlmoeTopKRouter): softmax over all 64, top-8 on the probabilities, no
/// renormalisation, dropless, HuggingFace aux loss with router_aux_loss_coef 0.01
/// (OlmoeConfig). The HF model computes no z-loss.
inline routing_config olmoe(std::int32_t experts = 64, std::int32_t k = 8) {
  routing_config c = qwen_moe(experts, k, false);
  c.loss.aux_coefficient = 0.01f;
  c.loss.z_coefficient = 0.0f;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Sequence-level aux loss conventions: the same per-sequence loss, laid out and reduced the way
// each peer does it (docs/numerics.md, "Sequence-level aux loss").

/// Whose sequence-level aux loss convention to follow.
enum class sequence_aux_peer : std::uint8_t {
  /// DeepSeek-V2 / V3 (HF modeling_deepseek `seq_aux`): hidden states [batch, seq], the mean
  /// over the batch of each sequence's loss.
  deepseek,
  /// Megatron-Core `seq_aux_loss` (router._apply_seq_aux_loss, sequence_load_balancing_loss_func):
  /// activations [seq, batch], the per-sequence losses summed and divided by the batch size.
  megatron,
  /// TransformerEngine's `fused_moe_aux_loss` on Megatron's [seq, batch * E] view (the fused
  /// path): the per-sequence losses summed, before Megatron divides by the batch size.
  transformer_engine,
};

/// @brief `c` with the sequence-level aux loss over sequences of `sequence_length` tokens, laid
///        out and reduced as `peer` does (loss.sequence_order, loss.sequence_reduce). The
///        per-sequence loss itself (counts, scale, score source) stays the routing's:
///        presets::deepseek_v3 and presets::megatron already count as those peers do. The
///        mean is over the sequences with a valid token, which is the batch size whenever no
///        sequence is all padding.
[[nodiscard]] inline routing_config with_sequence_aux(routing_config c,
                                                      std::int64_t sequence_length,
                                                      sequence_aux_peer peer) {
  c.loss.sequence_length = sequence_length;
  switch (peer) {
    case sequence_aux_peer::deepseek:
      c.loss.sequence_order = token_order::sequence_major;
      c.loss.sequence_reduce = sequence_reduction::mean;
      break;
    case sequence_aux_peer::megatron:
      c.loss.sequence_order = token_order::position_major;
      c.loss.sequence_reduce = sequence_reduction::mean;
      break;
    case sequence_aux_peer::transformer_engine:
      c.loss.sequence_order = token_order::position_major;
      c.loss.sequence_reduce = sequence_reduction::sum;
      break;
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// The presets by name: one registry for the capacity tool, the benchmarks and the tests.

/// A preset as a name, with the model it is named after (the defaults a tool uses when the user
/// gives no experts / k / hidden size).
struct preset_info {
  std::string_view name;
  std::string_view description;
  std::int32_t default_experts;
  std::int32_t default_k;       ///< the k the preset is built for
  bool fixed_k;                 ///< the preset exists for this k only (switch_top1, *_top2)
  std::int64_t default_hidden;  ///< d of the model it is named after
};

inline constexpr preset_info registry[] = {
    {"deepspeed_topk", "DeepSpeed topkgating, position priority, renormalise after drop", 8, 2,
     false, 4096},
    {"deepspeed_topk_2026", "DeepSpeed topkgating as of 2026: top-k on the softmax scores", 8, 2,
     false, 4096},
    {"deepspeed_top2", "DeepSpeed top2gating / GShard top-2, choice-major, min capacity 4", 8, 2,
     true, 4096},
    {"gshard_top2", "GShard top-2 (same routing as deepspeed_top2)", 8, 2, true, 4096},
    {"switch_top1", "Switch Transformer top-1, factor 1.25, residual (Switch-Base: E=128, d=768)",
     128, 1, true, 768},
    {"switch_transformers",
     "HF SwitchTransformers: top-1, fixed capacity 64 per batch row (switch-base-8: d=768)", 8, 1,
     true, 768},
    {"nllb_moe", "HF NLLB-MoE top-2: choice-major, C = 2*ceil(T/E) (NLLB-200 MoE: E=128, d=2048)",
     128, 2, true, 2048},
    {"tutel_topk", "Tutel: C = k * floor(f * ceil(T/E)), choice-major", 8, 2, false, 4096},
    {"flaxformer_topk", "flaxformer: C = max(round(f*T/E), 4), batch-prioritised", 8, 2, false,
     4096},
    {"megablocks_topk", "MegaBlocks (capacity-bounded): C = floor(f*k*T/E), token-major", 8, 2,
     false, 4096},
    {"seed_reference", "plain token loop: C = int(f*T/E), residual, renormalise before drop", 8, 2,
     false, 4096},
    {"megatron", "Megatron-Core TopKRouter, score priority (\"probs\"), token-index slots", 8, 2,
     false, 4096},
    {"mixtral", "Mixtral 8x7B: top-2 of 8, softmax after top-k, dropless (d=4096)", 8, 2, false,
     4096},
    {"deepseek_v3", "DeepSeek-V3: sigmoid, bias, 8 groups / top-4, top-8 of 256, x2.5 (d=7168)",
     256, 8, false, 7168},
    {"qwen_moe", "Qwen3-MoE: softmax, top-8 of 128, renormalised (d=2048)", 128, 8, false, 2048},
    {"qwen2_moe", "Qwen2-MoE: softmax, top-8 of 64, not renormalised (d=3584)", 64, 8, false, 3584},
    {"olmoe", "OLMoE: softmax, top-8 of 64, no renormalisation, no z-loss (d=2048)", 64, 8, false,
     2048},
};

/// @brief The registry entry named `name` (aliases: switch, deepseek, qwen, qwen3), or null.
[[nodiscard]] constexpr const preset_info* find(std::string_view name) noexcept {
  if (name == "switch") name = "switch_top1";
  if (name == "deepseek") name = "deepseek_v3";
  if (name == "qwen3" || name == "qwen" || name == "qwen3_moe") name = "qwen_moe";
  if (name == "qwen2") name = "qwen2_moe";
  if (name == "nllb") name = "nllb_moe";
  for (const auto& p : registry)
    if (p.name == name) return &p;
  return nullptr;
}

/// @brief The registry's names, comma separated (for help texts and error messages).
[[nodiscard]] inline std::string names() {
  std::string s;
  for (const auto& p : registry) {
    if (!s.empty()) s += ", ";
    s += p.name;
  }
  return s;
}

/// @brief The named preset for `experts` experts and top-`k`, with each preset's default
///        capacity options. deepseek_v3 keeps its 8 groups / top-4 where E and k allow them,
///        else it has no group limit.
/// @return the config, or invalid_config naming the preset (unknown name, or a k the preset
///         does not exist for). The config itself is not validated: call validate().
[[nodiscard]] inline status by_name(std::string_view name, std::int32_t experts, std::int32_t k,
                                    routing_config& out) {
  const preset_info* p = find(name);
  if (p == nullptr)
    return status::make(status_code::invalid_config,
                        "preset '" + std::string(name) + "' is unknown (known: " + names() + ")");
  if (p->fixed_k && k != p->default_k)
    return status::make(status_code::invalid_config, "preset " + std::string(p->name) + " is top-" +
                                                         std::to_string(p->default_k) +
                                                         " only, not top-" + std::to_string(k));
  const std::string_view n = p->name;
  if (n == "deepspeed_topk") {
    out = deepspeed_topk(experts, k);
  } else if (n == "deepspeed_topk_2026") {
    out = deepspeed_topk_2026(experts, k);
  } else if (n == "switch_transformers") {
    out = switch_transformers(experts);
  } else if (n == "nllb_moe") {
    out = nllb_moe(experts);
  } else if (n == "tutel_topk") {
    out = tutel_topk(experts, k);
  } else if (n == "flaxformer_topk") {
    out = flaxformer_topk(experts, k);
  } else if (n == "megablocks_topk") {
    out = megablocks_topk(experts, k);
  } else if (n == "qwen2_moe") {
    out = qwen2_moe(experts, k);
  } else if (n == "deepspeed_top2") {
    out = deepspeed_top2(experts);
  } else if (n == "gshard_top2") {
    out = gshard_top2(experts);
  } else if (n == "switch_top1") {
    out = switch_top1(experts);
  } else if (n == "seed_reference") {
    out = seed_reference(experts, k);
  } else if (n == "megatron") {
    out = megatron(experts, k);
  } else if (n == "mixtral") {
    out = mixtral(experts, k);
  } else if (n == "deepseek_v3") {
    // 8 groups of at least 2 experts (a group's score is its top-2), k of them reachable
    const bool groups_fit = experts % 8 == 0 && experts / 8 >= 2 && k <= 4 * (experts / 8);
    out = groups_fit ? deepseek_v3(experts, k, 8, 4) : deepseek_v3(experts, k, 0, 0);
  } else if (n == "qwen_moe") {
    out = qwen_moe(experts, k);
  } else {
    out = olmoe(experts, k);
  }
  return status::success();
}

/// @brief by_name for callers that prefer exceptions: throws moeroute::error.
[[nodiscard]] inline routing_config by_name(std::string_view name, std::int32_t experts,
                                            std::int32_t k) {
  routing_config c;
  throw_if_error(by_name(name, experts, k, c));
  return c;
}

}  // namespace moeroute::presets
