// SPDX-License-Identifier: Apache-2.0
// Routing replay cases every backend's replay test runs (docs/replay.md): every preset of the
// registry, and replay ids mixed from the router's own choice, other experts and -1.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/presets.hpp>

namespace moeroute::test {

struct replay_case {
  std::string name;
  routing_config cfg;
};

/// Every preset of the registry at E experts (its default k, at most E), plus group-limited
/// sigmoid with a bias and noisy gates: the configs a replay test runs.
inline std::vector<replay_case> replay_cases(std::int32_t E) {
  std::vector<replay_case> v;
  for (const auto& p : presets::registry) {
    routing_config c;
    if (!presets::by_name(p.name, E, std::min(p.default_k, E), c).ok() || !validate(c).ok())
      continue;
    v.push_back({std::string(p.name), c});
  }
  v.push_back({"deepseek_v3 with 4 groups, top-2 groups", presets::deepseek_v3(E, 4, 4, 2)});
  {
    routing_config c = presets::mixtral(E, 2);
    c.gating.noise.kind = noise_kind::gaussian;
    c.gating.noise.scale = 0.3f;
    c.gating.noise.target = noise_target::selection_and_gates;
    c.gating.noise.seed = 5;
    v.push_back({"mixtral with noisy gates", c});
  }
  {
    presets::megatron_options mo;
    mo.score = score_function::sqrt_softplus;
    v.push_back({"megatron sqrt-softplus", presets::megatron(E, 2, mo)});
  }
  {
    routing_config c = presets::megatron(E, 3);
    c.dispatch.dropped = drop_policy::next_choice;
    c.dispatch.reroute.max_candidates = 2;
    if (validate(c).ok()) v.push_back({"megatron top-3, next_choice with R = 2", c});
  }
  return v;
}

/// Normal logits (sigma 1.5) [T, E], seeded.
inline std::vector<float> replay_logits(std::int64_t T, std::int32_t E, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.5f);
  std::vector<float> x(static_cast<std::size_t>(T * E));
  for (auto& v : x) v = n(rng);
  return x;
}

/// A small expert bias [E] when the config selects with one (empty otherwise).
inline std::vector<float> replay_bias(const routing_config& c) {
  std::vector<float> b;
  if (c.gating.expert_bias)
    for (std::int32_t e = 0; e < c.num_experts; ++e)
      b.push_back(0.05f * static_cast<float>((e * 7) % 5) - 0.1f);
  return b;
}

/// Replay ids [T, k] for the router's own ids `own`: per slot, with equal odds, the own id,
/// another expert not yet in the token's row, or -1. Distinct per token.
inline std::vector<std::int32_t> mixed_replay_ids(const routing_config& cfg,
                                                  const std::vector<std::int32_t>& own,
                                                  std::int64_t T, std::uint32_t seed) {
  const std::int32_t k = cfg.top_k, E = cfg.num_experts;
  std::mt19937 rng(seed);
  std::vector<std::int32_t> r(static_cast<std::size_t>(T * k), -1);
  for (std::int64_t t = 0; t < T; ++t) {
    std::int32_t* row = &r[t * k];
    const auto used = [&](std::int32_t e) { return std::find(row, row + k, e) != row + k; };
    for (std::int32_t j = 0; j < k; ++j) {
      const auto pick = rng() % 3;
      std::int32_t e = -1;
      if (pick == 0) e = own[t * k + j];
      if (pick == 1) e = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(E));
      if (e >= 0 && !used(e)) row[j] = e;
    }
  }
  return r;
}

}  // namespace moeroute::test
