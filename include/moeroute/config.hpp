// SPDX-License-Identifier: Apache-2.0
// One value type that describes a routing: gating, capacity, priority, drop policy, losses.
// Every formula it selects is written out once, in docs/numerics.md.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include <moeroute/macros.hpp>
#include <moeroute/status.hpp>

namespace moeroute {

// ---------------------------------------------------------------------------------------------
// Gating

/// How router logits become scores.
enum class score_function : std::uint8_t {
  softmax,        ///< exp(x_e) / sum_j exp(x_j) (over all experts, or over the k chosen)
  sigmoid,        ///< 1 / (1 + exp(-x_e)), per expert
  sqrt_softplus,  ///< sqrt(log(1 + exp(x_e))), per expert
};

/// What the top-k is taken over. For softmax the order is the same; only ties can differ.
enum class select_from : std::uint8_t { logits, scores };

/// For softmax: normalise over all E experts before the top-k, or over the k chosen after it
/// (Mixtral / Megatron `use_pre_softmax=False`). Ignored for sigmoid and sqrt-softplus.
enum class softmax_stage : std::uint8_t { before_topk, after_topk };

/// When gates are divided by their sum. `after_drop` divides by the sum of what survived
/// capacity (DeepSpeed); `before_drop` by the sum over the k chosen (seed_reference, Megatron).
enum class renormalize : std::uint8_t { none, before_drop, after_drop };

/// Exploration noise added to the logits before selection.
enum class noise_kind : std::uint8_t {
  none,
  gaussian,  ///< x + std * N(0, 1)  (noisy top-k gating)
  gumbel,    ///< x + scale * G, G = -log(-log(U))  (Gumbel top-k sampling)
};

/// Whether the noisy logits also produce the gates (Shazeer's noisy top-k) or only pick the
/// experts while the gates come from the clean logits (DeepSpeed RSample).
enum class noise_target : std::uint8_t { selection_only, selection_and_gates };

struct noise_config {
  noise_kind kind = noise_kind::none;
  float scale = 1.0f;        ///< std for gaussian, scale for gumbel; must be finite and >= 0
  std::uint64_t seed = 0;    ///< Philox key
  std::uint64_t offset = 0;  ///< Philox counter offset (advance it every step)
  noise_target target = noise_target::selection_only;
  bool only_in_training = true;  ///< no noise when routing_config::training is false
};

/// How a group of experts is scored when a group limit picks the groups a token may use.
enum class group_score : std::uint8_t {
  sum_top_k_share,  ///< sum of its top k / group_topk values (Megatron, TransformerEngine)
  sum_top_n,        ///< sum of its top group_limit_config::top_n values (DeepSeek-V3: n = 2)
  max,              ///< its largest value (DeepSeek-V2)
};

struct group_limit_config {
  std::int32_t groups = 0;      ///< 0 or 1: no group limit; otherwise must divide E
  std::int32_t group_topk = 0;  ///< groups a token may pick
  group_score score = group_score::sum_top_k_share;
  std::int32_t top_n = 0;  ///< n of group_score::sum_top_n (1..E/groups); 0 otherwise
};

/// The expert-bias update of aux-loss-free balancing (DeepSeek-V3; `expert_bias_update`):
/// bias[e] += rate * sign(mean load - load[e]) after each optimiser step.
struct bias_update_config {
  float rate = 1e-3f;     ///< gamma, the update speed (DeepSeek-V3: 0.001); finite and >= 0
  bool recenter = false;  ///< subtract the mean bias afterwards (keeps sum(bias) = 0)
};

/// What a top-2 router does with its second choice (NLLB-MoE's `second_expert_policy`;
/// fairseq's top2gating). Draws come from Philox stream 3 keyed by (seed, offset), so the CPU
/// and the GPU agree; they are drawn in eval too, as the peers do.
enum class second_expert_policy : std::uint8_t {
  all,       ///< always routed
  random,    ///< routed when 2 * p2 > u, p2 its score, u uniform in (0, 1) per token; else
             ///< dropped before any capacity is counted (gating_output::second_skipped)
  sampling,  ///< chosen by Gumbel noise: argmax over the other eligible experts of x_e + G(t, e)
};

struct second_expert_config {
  second_expert_policy policy = second_expert_policy::all;
  std::uint64_t seed = 0;    ///< Philox key
  std::uint64_t offset = 0;  ///< Philox counter offset (advance it every step)
};

struct gating_config {
  score_function score = score_function::softmax;
  select_from select = select_from::logits;
  softmax_stage stage = softmax_stage::before_topk;
  renormalize renorm = renormalize::none;
  /// Epsilon added to the before-drop divisor (Megatron uses 1e-20 for sigmoid with k > 1).
  float renorm_epsilon = 0.0f;
  float scaling_factor = 1.0f;  ///< multiplies the final gates (DeepSeek-V3: 2.5)
  /// Expert bias added to the selection values only (DeepSeek-V3 aux-loss-free balancing).
  /// The bias itself is data (it changes every step) and is passed to the gating call.
  bool expert_bias = false;
  bias_update_config bias_update{};  ///< how expert_bias_update moves the bias
  group_limit_config group_limit{};
  noise_config noise{};
  second_expert_config second_expert{};  ///< top-2 only
};

// ---------------------------------------------------------------------------------------------
// Capacity

enum class capacity_mode : std::uint8_t {
  factor,     ///< C = round(factor * T * (k) / E), see capacity_config
  fixed,      ///< C = capacity_config::fixed
  max_load,   ///< dropless: C = the largest number of assignments any expert received
  unbounded,  ///< dropless with no per-expert bound at all (compact layout only)
  /// C = round(factor * T): a fraction of the tokens, not of the per-expert share (NLLB-MoE's
  /// eval capacity ceil(moe_eval_capacity_token_fraction * T)); k and share_rounding unused
  batch_fraction,
};

/// How the factor product becomes an integer. nearest_even is Python's round() (flaxformer).
enum class capacity_rounding : std::uint8_t { ceil, floor, nearest_even };

/// How the per-expert share T / E is rounded before the factor multiplies it: not at all
/// (DeepSpeed, Megatron), or up (NLLB-MoE 2 * ceil(T / E), Tutel k * floor(f * ceil(T / E))).
enum class share_rounding : std::uint8_t { none, ceil, floor };

/// The factor rule (docs/numerics.md, "Capacity"), with T the tokens of one capacity group:
///   share = T / E, rounded by `share`           k_in = includes_k && !k_after_rounding
///   C = R(factor * share * (k_in ? k : 1)) * (k_after_rounding ? k : 1), R = `rounding`
/// then C = max(C, min_capacity) (every mode but fixed) and C = min(C, T) with clamp_to_tokens.
struct capacity_config {
  capacity_mode mode = capacity_mode::factor;
  double factor = 1.25;                                           ///< training capacity factor
  double eval_factor = std::numeric_limits<double>::quiet_NaN();  ///< NaN: same as factor
  bool includes_k = true;  ///< multiply by k (DeepSpeed/Megatron) or not (seed_reference)
  /// With includes_k: multiply by k after rounding, k * R(f * share) (Tutel), not inside it.
  bool k_after_rounding = false;
  share_rounding share = share_rounding::none;
  capacity_rounding rounding = capacity_rounding::ceil;
  /// Lower bound of a factor, batch_fraction or max_load capacity (DeepSpeed, Switch: 4). A
  /// fixed capacity is the capacity: validate() rejects a minimum with capacity_mode::fixed.
  std::int64_t min_capacity = 0;
  bool clamp_to_tokens = false;  ///< C = min(C, T): an expert can hold each token once
  /// Megatron: when C > T nothing is dropped (every expert could hold every token).
  bool no_drop_when_exceeds_tokens = false;
  std::int64_t fixed = 0;  ///< used by capacity_mode::fixed
  /// Capacity per group of this many consecutive tokens (Switch Transformers, GShard, T5X: a
  /// batch row), each group with its own C slots per expert and its own priority order; the
  /// routing of one group never depends on another. T must be a multiple of it. 0: the whole
  /// batch is one group.
  std::int64_t group_tokens = 0;
};

// ---------------------------------------------------------------------------------------------
// Priority and drop policy

/// Who gets a slot when an expert is oversubscribed.
enum class priority : std::uint8_t {
  token_major,       ///< tokens in order, each token's choices in rank order (a plain loop)
  choice_major,      ///< every token's first choice, then every second choice (GShard top-2)
  score_per_expert,  ///< each expert keeps its C largest pre-drop gates (Megatron "probs")
  random,            ///< each expert keeps C assignments by a seeded random key (RTS)
  /// every first choice before any second choice, and within a choice rank the tokens in
  /// descending order of their top-1 score (V-MoE, NLLB-MoE, flaxformer "batch prioritized
  /// routing"); the gating stage writes that score (token_priority)
  batch_prioritized,
};

/// How slots are numbered inside an expert.
enum class slot_order : std::uint8_t {
  priority,     ///< in the order slots were granted
  token_index,  ///< by ascending token index among the kept
};

/// What happens to an assignment that did not get a slot.
enum class drop_policy : std::uint8_t {
  zero_weight,  ///< it contributes nothing
  residual,     ///< as zero_weight; a token with nothing kept passes x through unchanged
  fallback,     ///< rerouted to the fallback expert (see fallback_config)
  next_choice,  ///< rerouted to the token's next-best expert with room (bounded rounds)
};

struct fallback_config {
  /// Expert that takes dropped assignments: -1 for a dedicated shared expert appended as
  /// expert index E, or one of the routed experts 0..E-1 (which then uses its spare slots).
  std::int32_t expert = -1;
  /// Capacity of a dedicated fallback expert; -1 = unbounded. Ignored for a routed expert
  /// (it keeps its own capacity C).
  std::int64_t capacity = -1;
};

struct reroute_config {
  std::int32_t max_candidates = 4;  ///< next-best experts tried per dropped assignment (>= 1)
};

struct dispatch_config {
  priority prio = priority::token_major;
  slot_order slots = slot_order::priority;
  drop_policy dropped = drop_policy::zero_weight;
  fallback_config fallback{};
  reroute_config reroute{};
  std::uint64_t random_seed = 0;  ///< priority::random key
  std::uint64_t random_offset = 0;
};

// ---------------------------------------------------------------------------------------------
// Losses

/// Which assignments f_i counts in the Switch/GShard aux loss.
enum class aux_counts : std::uint8_t { top1, all_k };

/// Where the counts come from: the routing itself (with bias and group limit), or a fresh
/// top-k on the unbiased, ungrouped aux scores (Megatron's compute_routing_scores_for_aux_loss).
enum class aux_count_source : std::uint8_t { routed, fresh_topk };

/// The scaling each peer applies to sum_i f_i * P_i (f_i = count_i / T, P_i = mean score).
enum class aux_scale : std::uint8_t {
  e_times_sum,   ///< E * sum f P  (Switch, GShard, DeepSpeed top-1/top-2, Tutel)
  e_over_k_sum,  ///< E / k * sum f P  (DeepSpeed top-k, Megatron, TransformerEngine)
  normalized,    ///< E / (assignments counted per token) * sum f P: exactly 1 at balance
};

/// How a batch's T = S * L tokens are laid out in its S sequences of L tokens.
enum class token_order : std::uint8_t {
  sequence_major,  ///< [sequence, position]: sequence s is tokens [s*L, (s+1)*L) (HF, DeepSeek)
  position_major,  ///< [position, sequence]: token t is position t / S of sequence t % S
                   ///< (Megatron-Core and TransformerEngine activations, [s, b, h])
};

/// How the per-sequence aux losses make the sequence-level aux loss.
enum class sequence_reduction : std::uint8_t {
  mean,  ///< their mean over the sequences with a valid token (DeepSeek, Megatron's / bsz)
  sum,   ///< their sum (TransformerEngine's fused aux loss on the [L, S * E] view)
};

struct loss_config {
  aux_counts counts = aux_counts::top1;
  aux_count_source count_source = aux_count_source::routed;
  aux_scale scale = aux_scale::normalized;
  float aux_coefficient = 1.0f;
  float z_coefficient = 1.0f;
  /// Sequence-level aux loss (DeepSeek-V2): tokens form sequences of this length, each has its
  /// own aux loss (f and P over its valid tokens), and the loss reduces them. 0: batch-level.
  std::int64_t sequence_length = 0;
  token_order sequence_order = token_order::sequence_major;  ///< where a sequence's tokens are
  sequence_reduction sequence_reduce = sequence_reduction::mean;
};

/// @brief The sequence token t belongs to, for S sequences of L tokens (T = S * L) in `order`.
///        Shared by every backend's gating and gating backward (docs/numerics.md, "Losses").
MOEROUTE_HOST_DEVICE inline std::int64_t sequence_of_token(token_order order, std::int64_t t,
                                                           std::int64_t S,
                                                           std::int64_t L) noexcept {
  return order == token_order::position_major ? t % S : t / L;
}

/// @brief The token at position `pos` of sequence s: the inverse of sequence_of_token.
MOEROUTE_HOST_DEVICE inline std::int64_t token_of_sequence(token_order order, std::int64_t s,
                                                           std::int64_t pos, std::int64_t S,
                                                           std::int64_t L) noexcept {
  return order == token_order::position_major ? pos * S + s : s * L + pos;
}

// ---------------------------------------------------------------------------------------------

/// @brief Complete description of a routing. A plain value: copy it, compare it, print it.
struct routing_config {
  std::int32_t num_experts = 8;  ///< E (routed experts; a dedicated fallback is extra)
  std::int32_t top_k = 2;        ///< k
  bool training = true;          ///< selects capacity factor and noise
  gating_config gating{};
  capacity_config capacity{};
  dispatch_config dispatch{};
  loss_config loss{};

  /// Number of experts with buffers: E, plus one for a dedicated fallback expert.
  [[nodiscard]] std::int32_t total_experts() const noexcept {
    return num_experts + (has_dedicated_fallback() ? 1 : 0);
  }
  [[nodiscard]] bool has_dedicated_fallback() const noexcept {
    return dispatch.dropped == drop_policy::fallback && dispatch.fallback.expert < 0;
  }
  [[nodiscard]] bool noise_active() const noexcept {
    return gating.noise.kind != noise_kind::none && (training || !gating.noise.only_in_training);
  }
  /// Candidates the gating stage ranks per token: k, plus the reroute candidates.
  [[nodiscard]] std::int32_t candidates_per_token() const noexcept {
    if (dispatch.dropped != drop_policy::next_choice) return top_k;
    const std::int64_t c = std::int64_t{top_k} + dispatch.reroute.max_candidates;
    return static_cast<std::int32_t>(c < num_experts ? c : num_experts);
  }
  /// R, the reroute candidates per token (next_choice; 0 otherwise): the width of
  /// gating_result::d_reroute_ids.
  [[nodiscard]] std::int32_t reroute_candidates() const noexcept {
    return candidates_per_token() - top_k;
  }
  /// c, the experts a token counts for in the aux loss: 1 (aux_counts::top1) or k — the width
  /// of gating_result::d_aux_count_ids.
  [[nodiscard]] std::int32_t aux_counts_per_token() const noexcept {
    return loss.counts == aux_counts::top1 ? 1 : top_k;
  }
  /// Tokens per capacity group for a batch of T tokens: capacity.group_tokens, or T.
  [[nodiscard]] std::int64_t capacity_group_tokens(std::int64_t tokens) const noexcept {
    return capacity.group_tokens > 0 ? capacity.group_tokens : tokens;
  }
  /// Capacity groups in a batch of T tokens (T a multiple of group_tokens): 1 for T = 0 too.
  [[nodiscard]] std::int64_t capacity_groups(std::int64_t tokens) const noexcept {
    return capacity.group_tokens > 0 && tokens > 0 ? tokens / capacity.group_tokens : 1;
  }
  [[nodiscard]] double active_capacity_factor() const noexcept {
    return (!training && !std::isnan(capacity.eval_factor)) ? capacity.eval_factor
                                                            : capacity.factor;
  }
};

/// @brief How many of a group's best selection values its group score adds up (1 for max).
///        A property of the config, shared by the CPU reference and the CUDA kernels.
[[nodiscard]] inline std::int32_t group_score_take(const routing_config& cfg) noexcept {
  const auto& gl = cfg.gating.group_limit;
  if (gl.groups <= 1) return 0;
  switch (gl.score) {
    case group_score::sum_top_n:
      return gl.top_n;
    case group_score::max:
      return 1;
    case group_score::sum_top_k_share:
      break;
  }
  return cfg.top_k / gl.group_topk;
}

/// @brief The scale s in  aux = coefficient * s * sum_i f_i * P_i  (docs/numerics.md, "aux").
///        A property of the config, shared by the CPU reference and the CUDA launchers.
[[nodiscard]] inline double aux_loss_scale(const routing_config& cfg) noexcept {
  const double E = cfg.num_experts;
  const double counted = cfg.loss.counts == aux_counts::top1 ? 1.0 : cfg.top_k;
  switch (cfg.loss.scale) {
    case aux_scale::e_times_sum:
      return E;
    case aux_scale::e_over_k_sum:
      return E / cfg.top_k;
    case aux_scale::normalized:
      return E / counted;
  }
  return E;
}

/// Documented limits, enforced by validate() rather than by overflow.
inline constexpr std::int32_t max_experts = 8192;
inline constexpr std::int32_t max_top_k = 8192;
/// Tokens per batch: token indices and slots are int32 (dispatch_output::slot,
/// layout_output::row_token), so a batch holds at most 2^31 - 1 tokens. Capacities, the
/// fixed and minimum capacity included, are bounded by the same number.
inline constexpr std::int64_t max_tokens = (std::int64_t{1} << 31) - 1;
inline constexpr std::int64_t max_hidden = std::int64_t{1} << 20;

namespace detail {
template <class T>
std::string field_msg(const char* field, T value, const char* why) {
  std::string s = field;
  s += " = ";
  if constexpr (std::is_floating_point_v<T>) {
    s += std::to_string(static_cast<double>(value));
  } else {
    s += std::to_string(value);
  }
  s += ": ";
  s += why;
  return s;
}
}  // namespace detail

/// @brief Checks every field of a routing_config and every combination of fields.
/// @return success, or invalid_config with a message naming the field and its value.
[[nodiscard]] inline status validate(const routing_config& c) {
  using detail::field_msg;
  auto bad = [](std::string m) { return status::make(status_code::invalid_config, std::move(m)); };
  const std::int32_t E = c.num_experts, k = c.top_k;
  if (E <= 0) return bad(field_msg("num_experts", E, "must be >= 1"));
  if (E > max_experts)
    return bad(field_msg("num_experts", E, "exceeds moeroute::max_experts (8192)"));
  if (k <= 0) return bad(field_msg("top_k", k, "must be >= 1"));
  if (k > E) return bad(field_msg("top_k", k, "must not exceed num_experts"));

  const auto& g = c.gating;
  if (!std::isfinite(g.scaling_factor) || g.scaling_factor <= 0.0f)
    return bad(field_msg("gating.scaling_factor", g.scaling_factor, "must be finite and > 0"));
  if (!std::isfinite(g.renorm_epsilon) || g.renorm_epsilon < 0.0f)
    return bad(field_msg("gating.renorm_epsilon", g.renorm_epsilon, "must be finite and >= 0"));
  if (g.score != score_function::softmax && g.stage == softmax_stage::after_topk)
    return bad("gating.stage = after_topk: only meaningful for score_function::softmax");
  if (g.stage == softmax_stage::after_topk && g.select == select_from::scores)
    return bad(
        "gating.select = scores with gating.stage = after_topk: scores do not exist "
        "before the top-k; select from logits");
  const auto& gl = g.group_limit;
  if (gl.groups < 0) return bad(field_msg("gating.group_limit.groups", gl.groups, "must be >= 0"));
  if (gl.groups > 1) {
    if (E % gl.groups != 0)
      return bad(field_msg("gating.group_limit.groups", gl.groups,
                           ("must divide num_experts = " + std::to_string(E)).c_str()));
    if (gl.group_topk <= 0 || gl.group_topk > gl.groups)
      return bad(field_msg("gating.group_limit.group_topk", gl.group_topk,
                           ("must be in [1, groups = " + std::to_string(gl.groups) + "]").c_str()));
    const std::int64_t per_group = E / gl.groups;
    if (gl.score == group_score::sum_top_k_share) {
      if (k % gl.group_topk != 0)
        return bad(field_msg("gating.group_limit.group_topk", gl.group_topk,
                             ("must divide top_k = " + std::to_string(k) +
                              " with gating.group_limit.score = sum_top_k_share")
                                 .c_str()));
      if (k / gl.group_topk > per_group)
        return bad("gating.group_limit: top_k / group_topk = " + std::to_string(k / gl.group_topk) +
                   " exceeds experts per group = " + std::to_string(per_group));
    } else if (std::int64_t{k} > std::int64_t{gl.group_topk} * per_group) {
      return bad("gating.group_limit: top_k = " + std::to_string(k) + " exceeds the " +
                 std::to_string(std::int64_t{gl.group_topk} * per_group) +
                 " experts of group_topk groups");
    }
    if (gl.score == group_score::sum_top_n && (gl.top_n < 1 || gl.top_n > per_group))
      return bad(field_msg("gating.group_limit.top_n", gl.top_n,
                           ("must be in [1, experts per group = " + std::to_string(per_group) +
                            "] with gating.group_limit.score = sum_top_n")
                               .c_str()));
  } else if (gl.group_topk != 0 && gl.groups <= 1) {
    return bad(field_msg("gating.group_limit.group_topk", gl.group_topk,
                         "set without gating.group_limit.groups > 1"));
  }
  if (gl.score != group_score::sum_top_n && gl.top_n != 0)
    return bad(field_msg("gating.group_limit.top_n", gl.top_n,
                         "is only read with gating.group_limit.score = sum_top_n; leave it 0"));
  const auto& se = g.second_expert;
  if (se.policy != second_expert_policy::all) {
    if (k != 2)
      return bad(
          field_msg("top_k", k, "must be 2 with gating.second_expert.policy random or sampling"));
    if (c.dispatch.dropped == drop_policy::fallback ||
        c.dispatch.dropped == drop_policy::next_choice)
      return bad(
          "gating.second_expert.policy with dispatch.dropped = fallback or next_choice is not "
          "supported: a second choice the policy drops or samples is not rerouted");
    if (se.policy == second_expert_policy::random && g.stage == softmax_stage::after_topk)
      return bad(
          "gating.second_expert.policy = random with gating.stage = after_topk: p2 is the "
          "second choice's score over all experts; use before_topk");
  }
  if (!std::isfinite(g.bias_update.rate) || g.bias_update.rate < 0.0f)
    return bad(field_msg("gating.bias_update.rate", g.bias_update.rate, "must be finite and >= 0"));
  const auto& n = g.noise;
  if (n.kind != noise_kind::none && (!std::isfinite(n.scale) || n.scale < 0.0f))
    return bad(field_msg("gating.noise.scale", n.scale, "must be finite and >= 0"));

  const auto& cap = c.capacity;
  if (cap.mode == capacity_mode::factor || cap.mode == capacity_mode::batch_fraction) {
    const double f = c.active_capacity_factor();
    if (!std::isfinite(cap.factor) || cap.factor <= 0.0)
      return bad(field_msg("capacity.factor", cap.factor, "must be finite and > 0"));
    if (!std::isnan(cap.eval_factor) && (!std::isfinite(cap.eval_factor) || cap.eval_factor <= 0.0))
      return bad(
          field_msg("capacity.eval_factor", cap.eval_factor, "must be finite and > 0, or NaN"));
    if (f > 1e6)
      return bad(field_msg(f == cap.factor ? "capacity.factor" : "capacity.eval_factor", f,
                           "is absurdly large (> 1e6)"));
  }
  if (cap.min_capacity < 0)
    return bad(field_msg("capacity.min_capacity", cap.min_capacity, "must be >= 0"));
  if (cap.mode == capacity_mode::fixed && cap.min_capacity > 0)
    return bad(field_msg("capacity.min_capacity", cap.min_capacity,
                         "with capacity.mode = fixed: the fixed capacity is the capacity "
                         "(it would silently raise capacity.fixed); set it to 0"));
  if (cap.k_after_rounding && !cap.includes_k)
    return bad(
        "capacity.k_after_rounding = true with capacity.includes_k = false: there is no k "
        "to multiply by");
  if (cap.group_tokens < 0 || cap.group_tokens > max_tokens)
    return bad(field_msg("capacity.group_tokens", cap.group_tokens,
                         "must be in [0, moeroute::max_tokens] (0: the batch is one group)"));
  if (cap.group_tokens > 0 && cap.mode == capacity_mode::unbounded)
    return bad(field_msg("capacity.group_tokens", cap.group_tokens,
                         "with capacity.mode = unbounded: nothing is bounded per group; set 0"));
  if (cap.mode == capacity_mode::fixed && cap.fixed < 0)
    return bad(field_msg("capacity.fixed", cap.fixed, "must be >= 0"));
  if (cap.min_capacity > max_tokens)
    return bad(
        field_msg("capacity.min_capacity", cap.min_capacity, "exceeds moeroute::max_tokens"));
  if (cap.mode == capacity_mode::fixed && cap.fixed > max_tokens)
    return bad(field_msg("capacity.fixed", cap.fixed, "exceeds moeroute::max_tokens"));

  const auto& d = c.dispatch;
  if (d.dropped == drop_policy::fallback) {
    if (d.fallback.expert >= E)
      return bad(
          field_msg("dispatch.fallback.expert", d.fallback.expert,
                    ("must be -1 (dedicated) or < num_experts = " + std::to_string(E)).c_str()));
    if (d.fallback.expert < -1)
      return bad(field_msg("dispatch.fallback.expert", d.fallback.expert, "must be >= -1"));
    if (d.fallback.capacity < -1)
      return bad(field_msg("dispatch.fallback.capacity", d.fallback.capacity,
                           "must be -1 (unbounded) or >= 0"));
    if (d.fallback.capacity > max_tokens)
      return bad(field_msg("dispatch.fallback.capacity", d.fallback.capacity,
                           "exceeds moeroute::max_tokens"));
  }
  if (d.dropped == drop_policy::next_choice && d.reroute.max_candidates < 1)
    return bad(
        field_msg("dispatch.reroute.max_candidates", d.reroute.max_candidates, "must be >= 1"));
  if (d.dropped == drop_policy::next_choice && gl.groups > 1)
    return bad(
        "dispatch.dropped = next_choice with a group limit is not supported: reroute "
        "candidates would leave the token's groups");

  const auto& l = c.loss;
  if (!std::isfinite(l.aux_coefficient) || l.aux_coefficient < 0.0f)
    return bad(field_msg("loss.aux_coefficient", l.aux_coefficient, "must be finite and >= 0"));
  if (!std::isfinite(l.z_coefficient) || l.z_coefficient < 0.0f)
    return bad(field_msg("loss.z_coefficient", l.z_coefficient, "must be finite and >= 0"));
  if (l.sequence_length < 0)
    return bad(field_msg("loss.sequence_length", l.sequence_length, "must be >= 0"));
  return status::success();
}

/// @brief Checks a batch shape against a valid config: T tokens (may be 0).
[[nodiscard]] inline status validate_tokens(const routing_config& c, std::int64_t tokens) {
  if (tokens < 0)
    return status::make(status_code::invalid_shape,
                        detail::field_msg("tokens", tokens, "must be >= 0"));
  if (tokens > max_tokens)
    return status::make(
        status_code::invalid_shape,
        detail::field_msg("tokens", tokens, "exceeds moeroute::max_tokens (2^31 - 1)"));
  if (c.capacity.group_tokens > 0 && tokens % c.capacity.group_tokens != 0)
    return status::make(status_code::invalid_shape,
                        "tokens = " + std::to_string(tokens) + " is not a multiple of " +
                            "capacity.group_tokens = " + std::to_string(c.capacity.group_tokens));
  if (c.loss.sequence_length > 0 && tokens % c.loss.sequence_length != 0)
    return status::make(status_code::invalid_shape,
                        "tokens = " + std::to_string(tokens) + " is not a multiple of " +
                            "loss.sequence_length = " + std::to_string(c.loss.sequence_length));
  return status::success();
}

/// @brief Checks a hidden size (columns of the token and expert-buffer rows): 0 <= d <= max_hidden.
[[nodiscard]] inline status validate_hidden(std::int64_t hidden) {
  if (hidden < 0 || hidden > max_hidden)
    return status::make(
        status_code::invalid_shape,
        detail::field_msg("hidden size d", hidden, "must be in [0, moeroute::max_hidden = 2^20]"));
  return status::success();
}

}  // namespace moeroute
