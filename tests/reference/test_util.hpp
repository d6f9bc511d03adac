// SPDX-License-Identifier: Apache-2.0
// Small deterministic generators and the routing invariants shared by the reference tests.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <moeroute/reference.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace moeroute::test {

/// Runs fn, which must throw moeroute::error with `code` and a message containing every word.
inline void expect_error(const std::function<void()>& fn, status_code code,
                         std::initializer_list<const char*> words) {
  bool threw = false;
  try {
    fn();
  } catch (const error& e) {
    threw = true;
    INFO(e.what());
    CHECK(e.get_status().code == code);
    for (const char* w : words) CHECK_THAT(e.get_status().message, Catch::Matchers::Contains(w));
  }
  CHECK(threw);
}

/// Batch shapes the generators produce.
enum class dist { normal, skewed, collapsed, ties, identical_tokens, all_equal, negative };

inline const char* name(dist d) {
  switch (d) {
    case dist::normal:
      return "normal";
    case dist::skewed:
      return "skewed";
    case dist::collapsed:
      return "collapsed";
    case dist::ties:
      return "ties";
    case dist::identical_tokens:
      return "identical_tokens";
    case dist::all_equal:
      return "all_equal";
    case dist::negative:
      return "negative";
  }
  return "?";
}

inline constexpr dist all_dists[] = {dist::normal,  dist::skewed,           dist::collapsed,
                                     dist::ties,    dist::identical_tokens, dist::all_equal,
                                     dist::negative};

/// [T, E] logits from a fixed seed (std::mt19937, so the same on every platform).
inline std::vector<float> make_logits(std::int64_t T, std::int32_t E, dist d, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-2, 2);
  std::vector<float> x(static_cast<std::size_t>(T * E));
  std::vector<float> row(E);
  for (std::int32_t e = 0; e < E; ++e) row[e] = normal(rng);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int32_t e = 0; e < E; ++e) {
      float& v = x[t * E + e];
      switch (d) {
        case dist::normal:
          v = normal(rng);
          break;
        case dist::skewed:
          v = normal(rng) + 2.0f * static_cast<float>(E - e) / static_cast<float>(E);
          break;
        case dist::collapsed:
          v = normal(rng) * 0.1f + (e == 1 ? 4.0f : 0.0f);
          break;
        case dist::ties:
          v = static_cast<float>(small(rng));
          break;
        case dist::identical_tokens:
          v = row[e];
          break;
        case dist::all_equal:
          v = 0.5f;
          break;
        case dist::negative:
          v = -50.0f - std::fabs(normal(rng)) * 10.0f;
          break;
      }
    }
  return x;
}

/// Checks every structural invariant of a dispatch result. Returns "" when all hold, else a
/// description of the first violation (use as CHECK(invariant_violation(...) == "")).
inline std::string invariant_violation(const routing_config& cfg, const reference::gating_output& g,
                                       const reference::dispatch_output& d) {
  const std::int64_t T = d.tokens;
  const std::int32_t k = d.k, E = d.experts, ET = d.total_experts;
  const auto at = [&](std::int64_t a) {
    return " at token " + std::to_string(a / k) + " choice " + std::to_string(a % k);
  };
  if (ET != cfg.total_experts()) return "total_experts";
  if (static_cast<std::int64_t>(d.fates.size()) != T * k) return "fates size";
  if (static_cast<std::int64_t>(g.ids.size()) != T * k) return "ids size";

  // ids valid and distinct per token, gates finite
  for (std::int64_t t = 0; t < T; ++t) {
    std::set<std::int32_t> ids;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      if (g.ids[a] < 0 || g.ids[a] >= E) return "id out of range" + at(a);
      if (!std::isfinite(g.gates[a])) return "gate not finite" + at(a);
      ids.insert(g.ids[a]);
    }
    if (static_cast<std::int32_t>(ids.size()) != k)
      return "duplicate id at token " + std::to_string(t);
  }

  // conservation, globally and per expert
  std::int64_t kept = 0, rer = 0, drop = 0, masked = 0;
  std::vector<std::int64_t> req(E, 0), kept_e(E, 0), rer_e(E, 0), drop_e(E, 0), recv(ET, 0);
  for (std::int64_t a = 0; a < T * k; ++a) {
    const std::int32_t e = g.ids[a];
    switch (d.fates[a]) {
      case fate::kept:
        ++kept, ++kept_e[e], ++req[e];
        if (d.expert[a] != e) return "kept at another expert" + at(a);
        break;
      case fate::rerouted:
        ++rer, ++rer_e[e], ++req[e];
        if (d.expert[a] < 0 || d.expert[a] >= ET || d.expert[a] == e)
          return "bad reroute target" + at(a);
        ++recv[d.expert[a]];
        break;
      case fate::dropped:
        ++drop, ++drop_e[e], ++req[e];
        if (d.expert[a] != -1 || d.slot[a] != -1 || d.weight[a] != 0.0f)
          return "dropped but routed" + at(a);
        break;
      case fate::masked:
        ++masked;
        if (g.valid[a / k] != 0) return "masked assignment of a valid token" + at(a);
        if (d.expert[a] != -1 || d.slot[a] != -1 || d.weight[a] != 0.0f)
          return "masked but routed" + at(a);
        break;
    }
    if (d.fates[a] != fate::masked && g.valid[a / k] == 0)
      return "padding token not masked" + at(a);
  }
  if (kept + rer + drop + masked != T * k) return "kept + rerouted + dropped + masked != T * k";
  if (kept != d.total_kept || rer != d.total_rerouted || drop != d.total_dropped ||
      masked != d.total_masked)
    return "totals disagree with the fates";
  for (std::int32_t e = 0; e < E; ++e) {
    const std::string ex = " at expert " + std::to_string(e);
    if (d.requested[e] != req[e] || d.kept[e] != kept_e[e] || d.rerouted[e] != rer_e[e] ||
        d.dropped[e] != drop_e[e])
      return "per-expert counts disagree with the fates" + ex;
    if (d.requested[e] != d.kept[e] + d.rerouted[e] + d.dropped[e])
      return "requested != kept + rerouted + dropped" + ex;
  }
  for (std::int32_t e = 0; e < ET; ++e)
    if (d.received[e] != recv[e]) return "received count at expert " + std::to_string(e);

  // slots: one token per (expert, slot), dense 0..load-1, no expert above its capacity
  std::vector<std::map<std::int32_t, std::int64_t>> holder(ET);
  for (std::int64_t a = 0; a < T * k; ++a) {
    if (d.expert[a] < 0) continue;
    const std::int32_t e = d.expert[a], s = d.slot[a];
    if (s < 0) return "routed without a slot" + at(a);
    auto [it, fresh] = holder[e].emplace(s, a / k);
    if (!fresh && it->second != a / k)
      return "slot used twice at expert " + std::to_string(e) + at(a);
  }
  for (std::int32_t e = 0; e < ET; ++e) {
    const std::string ex = " at expert " + std::to_string(e);
    if (static_cast<std::int64_t>(holder[e].size()) != d.load[e]) return "load != rows held" + ex;
    std::int32_t want = 0;
    for (const auto& [s, t] : holder[e])
      if (s != want++) return "slots not dense" + ex;
    if (e < E && d.capacity >= 0 && d.load[e] > d.capacity) return "above capacity" + ex;
    if (e == E && d.fallback_capacity >= 0 && d.load[e] > d.fallback_capacity)
      return "fallback above capacity";
  }

  // a token holds at most one slot per expert
  for (std::int64_t t = 0; t < T; ++t) {
    std::map<std::int32_t, std::int32_t> slot_at;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      if (d.expert[a] < 0) continue;
      auto [it, fresh] = slot_at.emplace(d.expert[a], d.slot[a]);
      if (!fresh && it->second != d.slot[a]) return "token holds two slots at one expert" + at(a);
    }
  }

  // weights: finite, >= 0, zero exactly when not routed
  for (std::int64_t a = 0; a < T * k; ++a) {
    if (!std::isfinite(d.weight[a]) || d.weight[a] < 0.0f) return "bad weight" + at(a);
  }
  return "";
}

}  // namespace moeroute::test
