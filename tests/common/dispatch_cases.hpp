// SPDX-License-Identifier: Apache-2.0
// Test inputs for the dispatch family (pure C++, no CUDA): deterministic logits and masks, and
// a config grid over every priority, drop policy, slot order and capacity mode.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating.hpp>

namespace moeroute::test {

/// Small deterministic generator (64-bit LCG), uniform floats in [lo, hi).
struct lcg {
  std::uint64_t s;
  explicit lcg(std::uint64_t seed) : s(seed * 6364136223846793005ULL + 1442695040888963407ULL) {}
  std::uint32_t next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::uint32_t>(s >> 33);
  }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 8) / 16777216.0f;
  }
};

/// Router logits [T, E] with a few "hot" experts, so capacity actually drops assignments.
/// The owning routers' serving case (router_options::losses = false): DeepSeek-V3's routing at
/// E = 64, k = 4 (bias, groups, an aux loss), a capacity, a z-loss, training = false.
inline routing_config serving_router_config() {
  routing_config cfg = presets::deepseek_v3(64, 4, 8, 2);
  cfg.training = false;
  cfg.capacity.mode = capacity_mode::factor;
  cfg.loss.z_coefficient = 0.001f;
  return cfg;
}

inline std::vector<float> make_logits(std::int64_t T, std::int32_t E, std::uint64_t seed) {
  lcg r(seed);
  std::vector<float> x(static_cast<std::size_t>(T * E));
  const std::int32_t hot = E / 8 > 0 ? E / 8 : 1;
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int32_t e = 0; e < E; ++e)
      x[t * E + e] = r.uniform(-2.0f, 2.0f) + (e < hot ? 2.0f : 0.0f) +
                     ((t % 13 == 0 && e == E - 1) ? 4.0f : 0.0f);
  return x;
}

/// Padding mask with every fifth token invalid.
inline std::vector<std::uint8_t> make_valid(std::int64_t T) {
  std::vector<std::uint8_t> v(static_cast<std::size_t>(T), 1);
  for (std::int64_t t = 0; t < T; ++t) v[t] = t % 5 == 3 ? 0 : 1;
  return v;
}

/// Drop-policy variants the grid covers.
enum class drop_case : int {
  zero_weight,
  residual,
  fallback_dedicated_unbounded,
  fallback_dedicated_bounded,
  fallback_routed,
  next_choice,
  count
};
/// Capacity variants the grid covers.
enum class cap_case : int { factor, fixed, max_load, unbounded, floor_min_clamp, count };

struct case_spec {
  priority prio = priority::token_major;
  drop_case drop = drop_case::zero_weight;
  slot_order slots = slot_order::priority;
  cap_case cap = cap_case::factor;
  bool masked = false;     ///< pass a padding mask
  bool after_drop = true;  ///< renormalise after drop (else before)
  /// capacity groups (capacity.group_tokens = T / groups) where T divides and the capacity is
  /// bounded
  std::int64_t groups = 1;
  /// NLLB's random second-expert policy, where k = 2 and the drop policy does not reroute
  bool second_random = false;
};

inline std::string describe(const case_spec& s, std::int64_t T, std::int32_t E, std::int32_t k) {
  std::ostringstream o;
  o << "T=" << T << " E=" << E << " k=" << k << " prio=" << static_cast<int>(s.prio)
    << " drop=" << static_cast<int>(s.drop) << " slots=" << static_cast<int>(s.slots)
    << " cap=" << static_cast<int>(s.cap) << " masked=" << s.masked
    << " after_drop=" << s.after_drop << " groups=" << s.groups
    << " second_random=" << s.second_random;
  return o.str();
}

/// The spec for grid index i: cycles through every priority, drop policy, slot order and
/// capacity mode with co-prime periods, so a grid of a few dozen points covers all pairs.
inline case_spec spec_for(int i) {
  case_spec s;
  s.prio = static_cast<priority>(i % 5);  // token, choice, score, random, batch_prioritized
  s.drop = static_cast<drop_case>(i % static_cast<int>(drop_case::count));
  s.slots = static_cast<slot_order>((i / 3) % 2);
  s.cap = static_cast<cap_case>((i / 2) % static_cast<int>(cap_case::count));
  s.masked = (i % 7) == 3;
  s.after_drop = (i % 5) != 4;
  s.groups = (i % 3) == 1 ? 4 : 1;
  s.second_random = (i % 4) == 2;
  return s;
}

inline routing_config make_config(std::int32_t E, std::int32_t k, const case_spec& s,
                                  std::int64_t T = 0) {
  routing_config c;
  c.num_experts = E;
  c.top_k = k;
  c.gating.select = select_from::scores;
  c.gating.renorm = s.after_drop ? renormalize::after_drop : renormalize::before_drop;
  c.gating.scaling_factor = 1.5f;
  switch (s.cap) {
    case cap_case::factor:
      c.capacity.factor = 0.75;
      break;
    case cap_case::fixed:
      c.capacity.mode = capacity_mode::fixed;
      c.capacity.fixed = 3;
      break;
    case cap_case::max_load:
      c.capacity.mode = capacity_mode::max_load;
      c.capacity.min_capacity = 2;
      break;
    case cap_case::unbounded:
      c.capacity.mode = capacity_mode::unbounded;
      break;
    case cap_case::floor_min_clamp:
      c.capacity.factor = 0.5;
      c.capacity.includes_k = false;
      c.capacity.rounding = capacity_rounding::floor;
      c.capacity.min_capacity = 1;
      c.capacity.clamp_to_tokens = true;
      break;
    case cap_case::count:
      break;
  }
  c.dispatch.prio = s.prio;
  c.dispatch.slots = s.slots;
  c.dispatch.random_seed = 0x5eed;
  c.dispatch.random_offset = 17;
  switch (s.drop) {
    case drop_case::zero_weight:
      c.dispatch.dropped = drop_policy::zero_weight;
      break;
    case drop_case::residual:
      c.dispatch.dropped = drop_policy::residual;
      break;
    case drop_case::fallback_dedicated_unbounded:
      c.dispatch.dropped = drop_policy::fallback;
      c.dispatch.fallback = {-1, -1};
      break;
    case drop_case::fallback_dedicated_bounded:
      c.dispatch.dropped = drop_policy::fallback;
      c.dispatch.fallback = {-1, 5};
      break;
    case drop_case::fallback_routed:
      c.dispatch.dropped = drop_policy::fallback;
      c.dispatch.fallback = {E - 1, -1};
      break;
    case drop_case::next_choice:
      c.dispatch.dropped = drop_policy::next_choice;
      c.dispatch.reroute.max_candidates = 3;
      break;
    case drop_case::count:
      break;
  }
  const bool reroutes =
      c.dispatch.dropped == drop_policy::fallback || c.dispatch.dropped == drop_policy::next_choice;
  if (s.groups > 1 && T > 0 && T % s.groups == 0 && c.capacity.mode != capacity_mode::unbounded)
    c.capacity.group_tokens = T / s.groups;
  if (s.second_random && k == 2 && !reroutes)
    c.gating.second_expert = {second_expert_policy::random, 31, 4};
  return c;
}

/// Reference gating for a case (the same gating output feeds both dispatch implementations).
inline reference::gating_output make_gating(const routing_config& cfg, std::int64_t T,
                                            std::uint64_t seed, bool masked) {
  const auto logits = make_logits(T, cfg.num_experts, seed);
  const auto valid = masked ? make_valid(T) : std::vector<std::uint8_t>{};
  return reference::gating<float>(cfg, std::span<const float>(logits), T, {},
                                  std::span<const std::uint8_t>(valid));
}

/// The spec of one (priority, drop policy) pair with the slot order and capacity mode rotating
/// with them, as the policy grids that cover every pair without every product use it.
inline case_spec rotating_spec(int prio, int drop) {
  case_spec s;
  s.prio = static_cast<priority>(prio);
  s.drop = static_cast<drop_case>(drop);
  s.slots = static_cast<slot_order>((prio + drop) % 2);
  s.cap = static_cast<cap_case>((prio + drop) % static_cast<int>(cap_case::count));
  return s;
}

/// The first n tokens of a gating output (every per-token array cut to n rows), for the
/// d_token_count tests: a backend's dispatch of T rows with the count n equals reference::dispatch
/// of these, padded (padded_to_rows).
inline reference::gating_output first_tokens(const reference::gating_output& g, std::int64_t n) {
  reference::gating_output f = g;
  const auto cut = [&](auto& v) {
    if (g.tokens > 0 && !v.empty())
      v.resize(v.size() / static_cast<std::size_t>(g.tokens) * static_cast<std::size_t>(n));
  };
  f.tokens = n;
  cut(f.ids);
  cut(f.gates);
  cut(f.reroute_ids);
  cut(f.logsumexp);
  cut(f.token_priority);
  cut(f.second_skipped);
  cut(f.valid);
  f.valid_tokens = f.valid.empty() ? n : std::count(f.valid.begin(), f.valid.end(), 1);
  return f;
}

/// reference::dispatch of the first n of `rows` rows, the other rows masked: what dispatch
/// with d_token_count = n writes.
inline reference::dispatch_output padded_to_rows(reference::dispatch_output d, std::int64_t rows) {
  const auto n = static_cast<std::size_t>(rows * d.k);
  d.expert.resize(n, -1);
  d.slot.resize(n, -1);
  d.weight.resize(n, 0.0f);
  d.total_masked += static_cast<std::int64_t>(n - d.fates.size());
  d.fates.resize(n, fate::masked);
  d.tokens = rows;
  return d;
}

/// The dispatch shape grid every backend's test runs: T in {0, 1, 7, 1000, 16384} x E in
/// {1, 6, 8, 60, 64, 128, 256, 384} x k in {1, 2, 4, 8, E} (k <= E), kept to at most 2^20
/// assignments and 2^23 logits (the reference in seconds). Calls check(T, E, k, spec, seed)
/// for each, with spec_for(i) and seed 1000 + i; returns how many it ran.
template <class Check>
int for_each_dispatch_shape(Check&& check) {
  int i = 0;
  for (std::int64_t T : {0, 1, 7, 1000, 16384})
    for (std::int32_t E : {1, 6, 8, 60, 64, 128, 256, 384}) {
      std::vector<std::int32_t> ks;
      for (std::int32_t k : {1, 2, 4, 8, E})
        if (k <= E && std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
      for (std::int32_t k : ks) {
        if (T * k > (std::int64_t{1} << 20) || T * E > (std::int64_t{1} << 23)) continue;
        check(T, E, k, spec_for(i), 1000 + static_cast<std::uint64_t>(i));
        ++i;
      }
    }
  return i;
}

}  // namespace moeroute::test
