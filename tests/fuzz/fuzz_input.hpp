// SPDX-License-Identifier: Apache-2.0
// The routing fuzz input: a config and a batch of logits decoded from raw bytes, most of them
// valid (so inputs reach routing), one in eight "wild" (any field may be invalid, which
// validate() must reject with a message). Used by route_check.hpp.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include <moeroute/reference.hpp>

namespace moeroute::fuzz {

/// How far inputs get (for tuning the decoder; read by the corpus replay test).
struct reach_counters {
  std::int64_t inputs = 0, bad_config = 0, bad_tokens = 0, bad_bias = 0, routed = 0, with_drops = 0,
               with_reroutes = 0, padded = 0;
};
inline reach_counters& reach() {
  static reach_counters c;
  return c;
}

/// Reads fuzz bytes front to back; past the end every read returns zero.
class byte_reader {
 public:
  byte_reader(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  std::uint8_t u8() { return i_ < n_ ? p_[i_++] : std::uint8_t{0}; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() {
    return static_cast<std::uint32_t>(u16()) | (static_cast<std::uint32_t>(u16()) << 16);
  }
  std::uint64_t u64() {
    return static_cast<std::uint64_t>(u32()) | (static_cast<std::uint64_t>(u32()) << 32);
  }
  /// A value in [lo, hi] (inclusive), from one or two bytes.
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    if (hi <= lo) return lo;
    const std::uint64_t span = static_cast<std::uint64_t>(hi - lo) + 1;
    const std::uint64_t v = span <= 256 ? u8() : u16();
    return lo + static_cast<std::int64_t>(v % span);
  }
  bool flag() { return (u8() & 1) != 0; }
  float f32() {
    const std::uint32_t u = u32();
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  [[nodiscard]] bool empty() const { return i_ >= n_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t i_ = 0;
};

/// A float from a menu of hostile values: NaN, +-Inf, denormals, huge, +-0, ties, or random.
inline float hostile_float(byte_reader& in, float previous) {
  switch (in.range(0, 15)) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return std::numeric_limits<float>::infinity();
    case 2:
      return -std::numeric_limits<float>::infinity();
    case 3:
      return std::numeric_limits<float>::denorm_min() * static_cast<float>(in.range(1, 9));
    case 4:
      return -FLT_MIN / 2.0f;
    case 5:
      return FLT_MAX;
    case 6:
      return -FLT_MAX;
    case 7:
      return 0.0f;
    case 8:
      return -0.0f;
    case 9:
      return previous;  // exact tie with the previous logit
    case 10:
      return static_cast<float>(in.range(-3, 3));  // small integers: many ties
    case 11:
      return in.f32();  // any bit pattern
    case 12:
      return 1e30f * (in.flag() ? 1.0f : -1.0f);
    default:
      return static_cast<float>(static_cast<std::int8_t>(in.u8())) / 16.0f;
  }
}

struct decoded_case {
  routing_config cfg;
  std::int64_t tokens = 0;
  int dtype = 0;  // 0 float, 1 half, 2 bf16
  std::vector<float> logits_f;
  std::vector<half_bits> logits_h;
  std::vector<bf16_bits> logits_b;
  std::vector<float> bias;
  std::vector<std::uint8_t> valid;
  std::int64_t hidden = 1;
  std::int64_t block_size = 1;
};

inline decoded_case decode(byte_reader& in) {
  decoded_case c;
  routing_config& cfg = c.cfg;
  // One input in eight is "wild": any field may take an invalid value, which validate() must
  // reject with a message. The others keep every field valid, so most inputs reach routing.
  const bool wild = in.range(0, 7) == 7;
  const auto pick = [&](std::int64_t valid_n, std::int64_t all_n) {
    return in.range(0, (wild ? all_n : valid_n) - 1);
  };
  // Mostly small E (drops are frequent), sometimes a non-multiple of 32 past 64.
  cfg.num_experts = static_cast<std::int32_t>(in.flag() ? in.range(1, 16) : in.range(1, 130));
  if (wild && in.range(0, 7) == 7) cfg.num_experts = static_cast<std::int32_t>(in.range(-1, 0));
  cfg.top_k = static_cast<std::int32_t>(in.range(1, std::max(1, cfg.num_experts)));
  if (in.range(0, 3) == 0)
    cfg.top_k = std::min(cfg.top_k, static_cast<std::int32_t>(in.range(1, 4)));
  if (wild && in.range(0, 7) == 7) cfg.top_k = in.flag() ? 0 : cfg.num_experts + 1;
  cfg.training = in.flag();
  auto& g = cfg.gating;
  g.score = static_cast<score_function>(in.range(0, 2));
  g.select = static_cast<select_from>(in.range(0, 1));
  g.stage = static_cast<softmax_stage>(in.range(0, 1));
  if (!wild && (g.score != score_function::softmax || g.select == select_from::scores))
    g.stage = softmax_stage::before_topk;
  g.renorm = static_cast<renormalize>(in.range(0, 2));
  {
    const float eps[] = {0.0f, 1e-20f, 1e-6f, -1.0f, std::numeric_limits<float>::quiet_NaN()};
    g.renorm_epsilon = eps[pick(3, 5)];
  }
  {
    const float sf[] = {1.0f,  2.5f, 0.5f,  16.0f,
                        1e-3f, 0.0f, -1.0f, std::numeric_limits<float>::infinity()};
    g.scaling_factor = sf[pick(5, 8)];
  }
  g.expert_bias = in.flag();
  if (in.range(0, 2) == 0) {
    // a group limit: valid unless wild
    const std::int32_t G = static_cast<std::int32_t>(in.range(2, 8));
    const std::int32_t per = static_cast<std::int32_t>(in.range(1, 4));
    const std::int32_t gk = static_cast<std::int32_t>(in.range(1, G));
    g.group_limit.groups = G;
    g.group_limit.group_topk = gk;
    if (!wild) {
      cfg.num_experts = G * per;
      cfg.top_k = gk * static_cast<std::int32_t>(in.range(1, per));
    }
  } else if (wild) {
    g.group_limit.groups = static_cast<std::int32_t>(in.range(-1, 1));
    g.group_limit.group_topk = static_cast<std::int32_t>(in.range(0, 1));
  }
  g.noise.kind = static_cast<noise_kind>(in.range(0, 2));
  {
    const float ns[] = {
        1.0f, 0.01f, 0.0f, 100.0f, 1e30f, -1.0f, std::numeric_limits<float>::quiet_NaN()};
    g.noise.scale = ns[pick(5, 7)];
  }
  g.noise.seed = in.u8();
  g.noise.offset = in.u8();
  g.noise.target = static_cast<noise_target>(in.range(0, 1));
  g.noise.only_in_training = in.flag();

  auto& cap = cfg.capacity;
  cap.mode = static_cast<capacity_mode>(in.range(0, 3));
  {
    const double f[] = {1.0,
                        1.25,
                        0.5,
                        2.0,
                        0.01,
                        4.0,
                        0.0,
                        -1.0,
                        std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity(),
                        2e6};
    cap.factor = f[pick(6, 11)];
    cap.eval_factor = in.flag() ? std::numeric_limits<double>::quiet_NaN() : f[pick(6, 11)];
  }
  cap.includes_k = in.flag();
  cap.rounding = static_cast<capacity_rounding>(in.range(0, 1));
  cap.min_capacity = wild && in.range(0, 3) == 3 ? -1 : in.range(0, 8);
  cap.clamp_to_tokens = in.flag();
  cap.no_drop_when_exceeds_tokens = in.flag();
  cap.fixed = wild && in.range(0, 3) == 3 ? -1 : in.range(0, 40);

  auto& d = cfg.dispatch;
  d.prio = static_cast<priority>(in.range(0, 3));
  d.slots = static_cast<slot_order>(in.range(0, 1));
  d.dropped = static_cast<drop_policy>(in.range(0, 3));
  if (!wild && d.dropped == drop_policy::next_choice && g.group_limit.groups > 1)
    d.dropped = drop_policy::fallback;
  d.fallback.expert = static_cast<std::int32_t>(in.range(-1, cfg.num_experts - 1));
  d.fallback.capacity = in.range(-1, 12);
  if (wild && in.flag()) {
    d.fallback.expert = static_cast<std::int32_t>(in.flag() ? -2 : cfg.num_experts);
    d.fallback.capacity = -2;
  }
  d.reroute.max_candidates = static_cast<std::int32_t>(in.range(wild ? 0 : 1, 6));
  d.random_seed = in.u8();
  d.random_offset = in.u8();

  auto& l = cfg.loss;
  l.counts = static_cast<aux_counts>(in.range(0, 1));
  l.count_source = static_cast<aux_count_source>(in.range(0, 1));
  l.scale = static_cast<aux_scale>(in.range(0, 2));
  {
    const float coef[] = {0.01f, 1.0f, 0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()};
    l.aux_coefficient = coef[pick(3, 5)];
    l.z_coefficient = coef[pick(3, 5)];
  }
  l.sequence_length = in.range(0, 9) < 7 ? 0 : in.range(wild ? -1 : 1, 6);
  if (l.sequence_length > 0) {
    l.sequence_order = in.range(0, 1) ? token_order::position_major : token_order::sequence_major;
    l.sequence_reduce = in.range(0, 1) ? sequence_reduction::sum : sequence_reduction::mean;
  }

  c.tokens = wild && in.range(0, 3) == 3 ? in.range(-2, 0) : in.range(0, 48);
  if (l.sequence_length > 0 && !wild) c.tokens = c.tokens / l.sequence_length * l.sequence_length;
  c.dtype = static_cast<int>(in.range(0, 2));
  c.hidden = in.range(1, 3);
  c.block_size = in.range(1, 5);

  // The rules every peer's routing needs (read last, so older seeds keep their meaning above):
  // group-score rule, capacity formula parts, capacity groups, batch-prioritised routing.
  if (g.group_limit.groups > 1) {
    g.group_limit.score = static_cast<group_score>(in.range(0, 2));
    const std::int32_t per = cfg.num_experts / g.group_limit.groups;
    if (g.group_limit.score == group_score::sum_top_n)
      g.group_limit.top_n = static_cast<std::int32_t>(in.range(wild ? 0 : 1, std::max(1, per)));
    else if (wild && in.flag())
      g.group_limit.top_n = 1;  // only read by sum_top_n: rejected
  }
  if (in.range(0, 7) == 0) cap.mode = capacity_mode::batch_fraction;
  cap.share = static_cast<share_rounding>(in.range(0, 2));
  cap.k_after_rounding = in.flag() && (wild || cap.includes_k);
  if (in.range(0, 3) == 0) cap.rounding = capacity_rounding::nearest_even;
  if (!wild && cap.mode == capacity_mode::fixed) cap.min_capacity = 0;  // validate() rejects it
  if (in.range(0, 3) == 0 && c.tokens > 0 && (wild || cap.mode != capacity_mode::unbounded)) {
    const std::int64_t parts = in.range(1, 6);
    if (wild || c.tokens % parts == 0)
      cap.group_tokens = std::max<std::int64_t>(1, c.tokens / parts);
  }
  if (in.range(0, 4) == 0) d.prio = priority::batch_prioritized;
  if (in.range(0, 3) == 0) {  // NLLB's second-expert policies (top-2 only unless wild)
    g.second_expert.policy = static_cast<second_expert_policy>(in.range(1, 2));
    g.second_expert.seed = in.u8();
    g.second_expert.offset = in.u8();
    if (!wild && cfg.top_k != 2) g.second_expert.policy = second_expert_policy::all;
    if (!wild && (d.dropped == drop_policy::fallback || d.dropped == drop_policy::next_choice))
      d.dropped = drop_policy::zero_weight;
    if (!wild && g.second_expert.policy == second_expert_policy::random)
      g.stage = softmax_stage::before_topk;
  }
  return c;
}

/// Fills the data arrays once the config is known to be valid (sizes come from the config).
inline void decode_data(byte_reader& in, decoded_case& c) {
  const bool has_mask = in.flag();
  const std::int64_t n = c.tokens * c.cfg.num_experts;
  float prev = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    switch (c.dtype) {
      case 0:
        prev = hostile_float(in, prev);
        c.logits_f.push_back(prev);
        break;
      case 1:
        c.logits_h.push_back(half_bits{in.u16()});
        break;
      default:
        c.logits_b.push_back(bf16_bits{in.u16()});
        break;
    }
  }
  if (c.cfg.gating.expert_bias) {
    for (std::int32_t e = 0; e < c.cfg.num_experts; ++e)
      c.bias.push_back(static_cast<float>(static_cast<std::int8_t>(in.u8())) / 32.0f);
    if (in.range(0, 15) == 15)  // sometimes a hostile entry (non-finite ones must be rejected)
      c.bias[in.range(0, c.cfg.num_experts - 1)] = hostile_float(in, 0.0f);
  }
  if (has_mask) {  // one token in four is padding (none once the input runs out)
    for (std::int64_t t = 0; t < c.tokens; ++t) c.valid.push_back(in.range(0, 3) != 3 ? 1 : 0);
  }
}

inline float logit_at(const decoded_case& c, std::int64_t i) {
  switch (c.dtype) {
    case 0:
      return c.logits_f[i];
    case 1:
      return to_float(c.logits_h[i]);
    default:
      return to_float(c.logits_b[i]);
  }
}

inline reference::routing_result run_route(const decoded_case& c) {
  const std::span<const float> bias(c.bias);
  const std::span<const std::uint8_t> valid(c.valid);
  switch (c.dtype) {
    case 0:
      return reference::route<float>(c.cfg, std::span<const float>(c.logits_f), c.tokens, bias,
                                     valid);
    case 1:
      return reference::route<half_bits>(c.cfg, std::span<const half_bits>(c.logits_h), c.tokens,
                                         bias, valid);
    default:
      return reference::route<bf16_bits>(c.cfg, std::span<const bf16_bits>(c.logits_b), c.tokens,
                                         bias, valid);
  }
}

}  // namespace moeroute::fuzz
