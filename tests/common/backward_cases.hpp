// SPDX-License-Identifier: Apache-2.0
// Inputs shared by the backward tests of every backend: random logits and upstream
// gradients, and the config grid of the logit-gradient tests with its special rows.
#pragma once

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/config_fields.hpp>
#include <moeroute/presets.hpp>

namespace moeroute::test {

inline std::vector<float> random_logits(std::int64_t T, std::int32_t E, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.5f);
  std::vector<float> x(T * E);
  for (auto& v : x) v = n(rng);
  return x;
}

inline std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

struct grid_logit_case {
  std::string name;
  routing_config cfg;
  bool bias = false;
  bool sequence = false;  // loss.sequence_length set per T
};

inline std::vector<grid_logit_case> grid_logit_cases() {
  std::vector<grid_logit_case> v;
  v.push_back({"Switch top-1, residual, tight capacity", presets::switch_top1(5, 0.5, 1)});
  v.push_back({"seed top-2: softmax, before-drop, residual", presets::seed_reference(8, 2, 0.75)});
  v.push_back({"Mixtral: softmax after top-k, unbounded", presets::mixtral(8, 2)});
  {
    presets::megatron_options mo;
    mo.capacity_factor = 1.0;
    mo.pre_softmax = true;
    v.push_back({"Megatron pre-softmax, score-per-expert drops", presets::megatron(8, 2, mo)});
  }
  {
    auto c = presets::deepspeed_top2(6, 0.5, 1);
    c.dispatch.dropped = drop_policy::fallback;
    c.dispatch.fallback.expert = 2;
    v.push_back({"DeepSpeed top-2 after-drop, fallback to routed expert 2", c});
  }
  v.push_back(
      {"DeepSpeed top-k = E = 6, after-drop, drops", presets::deepspeed_topk(6, 6, 0.5, 1)});
  v.push_back(
      {"DeepSeek-V3: sigmoid, groups, bias, scaling 2.5", presets::deepseek_v3(16, 4, 4, 2), true});
  v.push_back({"sigmoid after-drop, dedicated fallback (expert E), capacity 1",
               parse_config("num_experts=7 top_k=3 gating.score=sigmoid gating.renorm=after_drop "
                            "gating.scaling_factor=1.5 capacity.mode=fixed capacity.fixed=1 "
                            "dispatch.dropped=fallback dispatch.fallback.capacity=2")});
  v.push_back({"sqrt-softplus, no renorm, next-choice reroute",
               parse_config("num_experts=9 top_k=2 gating.score=sqrt_softplus capacity.factor=0.5 "
                            "capacity.min_capacity=1 dispatch.dropped=next_choice "
                            "dispatch.reroute.max_candidates=3")});
  // everything dropped: S = 0, the clamp
  v.push_back({"sqrt-softplus after-drop, capacity 0",
               parse_config("num_experts=5 top_k=2 gating.score=sqrt_softplus "
                            "gating.renorm=after_drop capacity.mode=fixed capacity.fixed=0")});
  {
    auto c = presets::seed_reference(8, 2, 1.0);
    c.gating.noise.kind = noise_kind::gaussian;
    c.gating.noise.scale = 0.7f;
    c.gating.noise.seed = 5;
    c.gating.noise.offset = 3;
    c.gating.noise.target = noise_target::selection_and_gates;
    v.push_back({"Gaussian noise on the gates, before-drop", c});
  }
  {
    auto c = presets::deepseek_v3(8, 2, 0, 0);
    c.gating.noise.kind = noise_kind::gumbel;
    c.gating.noise.scale = 0.5f;
    c.gating.noise.seed = 11;
    c.gating.noise.target = noise_target::selection_and_gates;
    c.capacity.mode = capacity_mode::factor;
    c.capacity.factor = 0.75;
    v.push_back({"Gumbel noise on sigmoid gates, drops", c, true});
  }
  {
    auto c = presets::mixtral(6, 2);
    c.gating.noise.kind = noise_kind::gaussian;
    c.gating.noise.scale = 1.0f;
    c.gating.noise.target = noise_target::selection_only;
    v.push_back({"selection-only noise (gates from clean logits)", c});
  }
  {
    auto c = presets::mixtral(5, 5);
    c.loss.aux_coefficient = 0.5f;
    v.push_back({"softmax after top-k, k = E = 5, sequence aux", c, false, true});
  }
  {
    auto c = presets::deepseek_v3(8, 2, 4, 2);
    c.loss.z_coefficient = 0.0f;
    c.loss.aux_coefficient = 0.01f;
    v.push_back({"DeepSeek-V3 sequence aux, no z-loss", c, true, true});
  }
  {
    presets::megatron_options mo;
    mo.capacity_factor = 1.0;
    auto c = presets::megatron(8, 2, mo);
    c.loss.sequence_order = token_order::position_major;  // [L, S] tokens, summed (TE)
    c.loss.sequence_reduce = sequence_reduction::sum;
    v.push_back({"Megatron [seq, batch] sequence aux, summed", c, false, true});
  }
  {
    auto c = presets::qwen_moe(37, 3, false);
    c.loss.aux_coefficient = 0.0f;
    c.loss.z_coefficient = 0.25f;
    v.push_back({"E = 37, k = 3, z-loss only", c});
  }
  {
    auto c = presets::deepspeed_topk(40, 8, 1.0, 1);
    c.gating.score = score_function::sigmoid;
    c.loss.counts = aux_counts::all_k;
    c.loss.scale = aux_scale::normalized;
    v.push_back({"E = 40, k = 8, sigmoid after-drop, normalized aux", c});
  }
  {
    auto c = presets::switch_top1(3, 1.0, 1);
    c.gating.score = score_function::sigmoid;
    c.gating.scaling_factor = 0.5f;
    c.loss.aux_coefficient = 0.0f;
    c.loss.z_coefficient = 0.0f;
    v.push_back({"sigmoid top-1, routing term only", c});
  }
  return v;
}

/// Logits of T tokens with special rows: 1 all very negative (gates underflow), 2 NaN / +Inf /
/// -Inf entries, 4 all equal (ties), 5 per-expert gates of about 1e-8, so that k of them sum
/// below FLT_EPSILON while the gradient through the after-drop clamp is still ~1e-3.
inline std::vector<float> grid_logits(std::int64_t T, std::int32_t E, std::uint32_t seed,
                                      score_function f = score_function::softmax) {
  auto x = random_logits(T, E, seed);
  if (T > 5 && f != score_function::softmax)  // sigmoid(-18.5) ~ 9e-9; sqrt(softplus(-37)) ~ 9e-9
    for (std::int32_t e = 0; e < E; ++e)
      x[5 * E + e] =
          (f == score_function::sigmoid ? -18.5f : -37.0f) - 0.0625f * static_cast<float>(e);
  if (T > 1)
    for (std::int32_t e = 0; e < E; ++e) x[1 * E + e] = -40.0f - static_cast<float>(e);
  if (T > 2) {
    x[2 * E + 0] = std::numeric_limits<float>::quiet_NaN();
    if (E > 1) x[2 * E + 1] = std::numeric_limits<float>::infinity();
    if (E > 2) x[2 * E + 2] = -std::numeric_limits<float>::infinity();
  }
  if (T > 4)
    for (std::int32_t e = 0; e < E; ++e) x[4 * E + e] = 0.25f;
  return x;
}

inline std::vector<std::uint8_t> grid_valid(std::int64_t T) {
  if (T < 7) return {};
  std::vector<std::uint8_t> v(T, 1);
  for (std::int64_t t = 0; t < T; ++t)
    if (t % 5 == 3 || (t >= 60 && t < 120)) v[t] = 0;  // [60, 120): whole sequences of padding
  return v;
}

/// The three passes every backend's gating_backward grid runs: A non-unit weights,
/// accumulating on 0.5; B unit weights, overwriting garbage; C no routing term (d_grad_weight
/// null), overwriting.
struct backward_pass {
  const char* name;
  gating_backward_weights w;
  bool accumulate, routing;
};
inline constexpr backward_pass backward_passes[] = {{"A", {0.75, 2.0, 3.0, 0.5}, true, true},
                                                    {"B", {1.0, 1.0, 1.0, 1.0}, false, true},
                                                    {"C", {1.0, 1.5, 0.5, 2.0}, false, false}};

}  // namespace moeroute::test
