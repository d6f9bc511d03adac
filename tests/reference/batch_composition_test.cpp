// SPDX-License-Identifier: Apache-2.0
// Batch-composition properties: what the rest of the batch may and may not change about a token.
//  - dropless: a token's ids, gates, fates and weights do not depend on the rest of the batch
//    (routed alone, inside batches of other tokens, at any position, next to padding);
//  - score_per_expert with distinct gates: who is dropped (and the priority slot numbering) is
//    invariant to the batch order;
//  - token_major / choice_major: routing a permuted batch equals the greedy seed loop run in the
//    permuted order over the (batch-independent) gating;
//  - padding tokens take no slot: inserting them does not change anyone's fate (fixed capacity);
//  - batch_prioritized with distinct top-1 scores: as score priority, invariant to batch order;
//  - capacity groups: a group's fates, experts and weights do not depend on the other groups.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include <moeroute/names.hpp>
#include <moeroute/reference.hpp>

#include "../common/invariants.hpp"
#include "../common/test_util.hpp"

using namespace moeroute;
namespace ref = moeroute::reference;

namespace {

std::vector<float> random_logits(std::int64_t T, std::int32_t E, std::uint32_t seed, bool ties) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::uniform_int_distribution<int> small(-2, 2);
  std::vector<float> x(static_cast<std::size_t>(T * E));
  for (auto& v : x) v = ties ? static_cast<float>(small(rng)) : normal(rng);
  // a few hostile rows: all equal, NaN and +Inf entries
  if (T > 3) {
    for (std::int32_t e = 0; e < E; ++e) x[static_cast<std::size_t>(E) + e] = 0.5f;
    x[static_cast<std::size_t>(2 * E)] = std::numeric_limits<float>::quiet_NaN();
    x[static_cast<std::size_t>(3 * E) + 1] = std::numeric_limits<float>::infinity();
  }
  return x;
}

/// rows of x in the order perm: out[i] = x[perm[i]]
std::vector<float> permute_rows(const std::vector<float>& x, std::int32_t E,
                                const std::vector<std::int64_t>& perm) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    std::copy_n(x.begin() + perm[i] * E, E, out.begin() + static_cast<std::int64_t>(i) * E);
  return out;
}

std::vector<std::int64_t> shuffled(std::int64_t T, std::uint32_t seed) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(T));
  std::iota(p.begin(), p.end(), std::int64_t{0});
  std::shuffle(p.begin(), p.end(), std::mt19937(seed));
  return p;
}

std::vector<routing_config> dropless_configs() {
  std::vector<routing_config> out;
  routing_config c;
  c.num_experts = 8;
  c.top_k = 2;
  c.capacity.mode = capacity_mode::unbounded;
  out.push_back(c);  // softmax top-2, no renorm
  c.gating.stage = softmax_stage::after_topk;
  c.capacity.mode = capacity_mode::max_load;
  out.push_back(c);  // Mixtral
  c = routing_config{};
  c.num_experts = 16;
  c.top_k = 4;
  c.gating.score = score_function::sigmoid;
  c.gating.select = select_from::scores;
  c.gating.expert_bias = true;
  c.gating.renorm = renormalize::after_drop;
  c.gating.scaling_factor = 2.5f;
  c.gating.group_limit = {4, 2};
  c.capacity.mode = capacity_mode::unbounded;
  out.push_back(c);  // DeepSeek-V3-like
  c = routing_config{};
  c.num_experts = 7;
  c.top_k = 3;
  c.gating.score = score_function::sqrt_softplus;
  c.gating.renorm = renormalize::before_drop;
  c.capacity.mode = capacity_mode::max_load;
  out.push_back(c);
  return out;
}

std::vector<float> bias_for(const routing_config& c) {
  if (!c.gating.expert_bias) return {};
  std::vector<float> b(static_cast<std::size_t>(c.num_experts));
  for (std::size_t e = 0; e < b.size(); ++e) b[e] = 0.05f * static_cast<float>(e % 5) - 0.1f;
  return b;
}

/// The seed loop: grant slots in `order` (a list of assignment indices), C per expert.
std::vector<fate> greedy(const ref::gating_output& g, const std::vector<std::int64_t>& order,
                         std::int64_t C) {
  std::vector<fate> f(g.ids.size(), fate::dropped);
  std::vector<std::int64_t> load(static_cast<std::size_t>(g.experts), 0);
  for (std::int64_t a : order) {
    const std::int32_t e = g.ids[a];
    if (load[e] < C) {
      ++load[e];
      f[a] = fate::kept;
    }
  }
  return f;
}

}  // namespace

TEST_CASE("batch composition: dropless routing of a token does not depend on the batch",
          "[batch_composition][reliability]") {
  const std::int64_t T = 48;
  for (const auto& cfg : dropless_configs()) {
    for (bool ties : {false, true}) {
      const std::int32_t E = cfg.num_experts, k = cfg.top_k;
      const auto x = random_logits(T, E, 11u + static_cast<std::uint32_t>(E), ties);
      const auto bias = bias_for(cfg);
      const auto whole = ref::route<float>(cfg, x, T, bias);
      REQUIRE(whole.dispatch.total_kept == T * k);
      const auto perm = shuffled(T, 5);
      const auto xp = permute_rows(x, E, perm);
      const auto permuted = ref::route<float>(cfg, xp, T, bias);
      // a batch where every other token is padding
      std::vector<float> xpad(static_cast<std::size_t>(2 * T * E), 0.0f);
      std::vector<std::uint8_t> valid(static_cast<std::size_t>(2 * T), 0);
      for (std::int64_t t = 0; t < T; ++t) {
        std::copy_n(x.begin() + t * E, E, xpad.begin() + (2 * t + 1) * E);
        valid[2 * t + 1] = 1;
      }
      const auto padded = ref::route<float>(cfg, xpad, 2 * T, bias, valid);
      for (std::int64_t t = 0; t < T; ++t) {
        INFO("E " << E << " k " << k << " ties " << ties << " token " << t);
        const std::vector<float> row(x.begin() + t * E, x.begin() + (t + 1) * E);
        const auto alone = ref::route<float>(cfg, row, 1, bias);
        const std::int64_t tp = std::find(perm.begin(), perm.end(), t) - perm.begin();
        for (std::int32_t j = 0; j < k; ++j) {
          const std::int32_t id = alone.gating.ids[j];
          const float gt = alone.gating.gates[j], w = alone.dispatch.weight[j];
          REQUIRE(alone.dispatch.fates[j] == fate::kept);
          CHECK(whole.gating.ids[t * k + j] == id);
          CHECK(whole.gating.gates[t * k + j] == gt);
          CHECK(whole.dispatch.weight[t * k + j] == w);
          CHECK(permuted.gating.ids[tp * k + j] == id);
          CHECK(permuted.gating.gates[tp * k + j] == gt);
          CHECK(permuted.dispatch.weight[tp * k + j] == w);
          CHECK(padded.gating.ids[(2 * t + 1) * k + j] == id);
          CHECK(padded.dispatch.weight[(2 * t + 1) * k + j] == w);
          CHECK(padded.dispatch.fates[(2 * t) * k + j] == fate::masked);
        }
      }
      // per-expert loads are a property of the multiset of tokens
      CHECK(whole.dispatch.load == permuted.dispatch.load);
      CHECK(whole.losses.aux.counts == permuted.losses.aux.counts);
      CHECK(whole.losses.aux.value == Approx(permuted.losses.aux.value).epsilon(1e-12));
    }
  }
}

TEST_CASE("batch composition: score-priority drops are invariant to batch order",
          "[batch_composition][reliability]") {
  const std::int64_t T = 64;
  for (auto dropped : {drop_policy::zero_weight, drop_policy::fallback}) {
    for (std::int32_t k : {1, 2}) {
      routing_config cfg;
      cfg.num_experts = 8;
      cfg.top_k = k;
      cfg.capacity.factor = 0.75;  // drops on every skewed batch
      cfg.dispatch.prio = priority::score_per_expert;
      cfg.dispatch.dropped = dropped;
      cfg.dispatch.fallback.capacity = 5;  // dedicated fallback, bounded: reroute order matters
      auto x = random_logits(T, 8, 99u + static_cast<std::uint32_t>(k), false);
      for (std::int64_t t = 0; t < T; ++t) x[t * 8 + (t % 3)] += 1.0f;  // skew to experts 0..2
      const auto base = ref::route<float>(cfg, x, T);
      REQUIRE(base.dispatch.total_dropped + base.dispatch.total_rerouted > 0);
      // the property needs distinct gates between tokens (per expert for the grant order,
      // across experts for the reroute order): check it holds for this batch
      {
        std::vector<std::pair<float, std::int64_t>> gs;
        for (std::size_t a = 0; a < base.gating.ids.size(); ++a)
          gs.push_back({base.gating.gates[a], static_cast<std::int64_t>(a) / k});
        std::sort(gs.begin(), gs.end());
        for (std::size_t i = 1; i < gs.size(); ++i)
          if (gs[i].first == gs[i - 1].first) REQUIRE(gs[i].second == gs[i - 1].second);
      }
      for (std::uint32_t seed : {1u, 2u, 3u}) {
        const auto perm = shuffled(T, seed);
        const auto r = ref::route<float>(cfg, permute_rows(x, 8, perm), T);
        CHECK(r.dispatch.total_dropped == base.dispatch.total_dropped);
        CHECK(r.dispatch.total_rerouted == base.dispatch.total_rerouted);
        for (std::int64_t i = 0; i < T; ++i)
          for (std::int32_t j = 0; j < k; ++j) {
            const std::int64_t a = i * k + j, b = perm[i] * k + j;
            INFO("policy " << static_cast<int>(dropped) << " k " << k << " seed " << seed
                           << " token " << perm[i] << " choice " << j);
            CHECK(r.dispatch.fates[a] == base.dispatch.fates[b]);
            CHECK(r.dispatch.expert[a] == base.dispatch.expert[b]);
            // slots numbered in grant order are ranks by gate: also order-invariant
            CHECK(r.dispatch.slot[a] == base.dispatch.slot[b]);
            CHECK(r.dispatch.weight[a] == base.dispatch.weight[b]);
          }
      }
    }
  }
}

TEST_CASE("batch composition: batch-prioritised drops are invariant to batch order",
          "[batch_composition][reliability]") {
  // Every first choice before any second, each rank by descending top-1 score: with distinct
  // scores no token index decides anything, so a permuted batch routes every token the same.
  const std::int64_t T = 64;
  for (auto dropped : {drop_policy::zero_weight, drop_policy::fallback}) {
    routing_config cfg;
    cfg.num_experts = 8;
    cfg.top_k = 2;
    cfg.gating.select = select_from::scores;
    cfg.gating.renorm = renormalize::after_drop;
    cfg.capacity.factor = 0.75;
    cfg.dispatch.prio = priority::batch_prioritized;
    cfg.dispatch.dropped = dropped;
    cfg.dispatch.fallback.capacity = 5;
    auto x = random_logits(T, 8, 7u, false);
    for (std::int64_t t = 0; t < T; ++t) x[t * 8 + (t % 3)] += 1.0f;
    const auto base = ref::route<float>(cfg, x, T);
    REQUIRE(base.dispatch.total_dropped + base.dispatch.total_rerouted > 0);
    std::vector<float> pr = base.gating.token_priority;
    std::sort(pr.begin(), pr.end());
    REQUIRE(std::adjacent_find(pr.begin(), pr.end()) == pr.end());  // distinct scores
    for (std::uint32_t seed : {1u, 2u, 3u}) {
      const auto perm = shuffled(T, seed);
      const auto r = ref::route<float>(cfg, permute_rows(x, 8, perm), T);
      for (std::int64_t i = 0; i < T; ++i)
        for (std::int32_t j = 0; j < 2; ++j) {
          const std::int64_t a = i * 2 + j, b = perm[i] * 2 + j;
          INFO("policy " << to_string(dropped) << " seed " << seed << " token " << perm[i]);
          CHECK(r.dispatch.fates[a] == base.dispatch.fates[b]);
          CHECK(r.dispatch.expert[a] == base.dispatch.expert[b]);
          CHECK(r.dispatch.slot[a] == base.dispatch.slot[b]);
          CHECK(r.dispatch.weight[a] == base.dispatch.weight[b]);
        }
    }
  }
}

TEST_CASE("batch composition: token_major and choice_major follow the batch order",
          "[batch_composition][reliability]") {
  const std::int64_t T = 40;
  for (auto prio : {priority::token_major, priority::choice_major}) {
    routing_config cfg;
    cfg.num_experts = 6;
    cfg.top_k = 2;
    cfg.capacity.factor = 0.8;
    cfg.dispatch.prio = prio;
    auto x = random_logits(T, 6, 7, false);
    for (std::int64_t t = 0; t < T; ++t) x[t * 6] += 1.5f;  // expert 0 oversubscribed
    const std::int64_t C = expert_capacity(cfg, T);
    const auto base = ref::route<float>(cfg, x, T);
    REQUIRE(base.dispatch.total_dropped > 0);
    for (std::uint32_t seed : {4u, 5u, 6u}) {
      const auto perm = shuffled(T, seed);
      const auto xp = permute_rows(x, 6, perm);
      const auto r = ref::route<float>(cfg, xp, T);
      // the gating is per token; only the capacity decisions see the order
      std::vector<std::int64_t> order;
      if (prio == priority::token_major) {
        for (std::int64_t i = 0; i < T; ++i)
          for (std::int32_t j = 0; j < 2; ++j) order.push_back(i * 2 + j);
      } else {
        for (std::int32_t j = 0; j < 2; ++j)
          for (std::int64_t i = 0; i < T; ++i) order.push_back(i * 2 + j);
      }
      const auto expect = greedy(r.gating, order, C);
      std::int64_t moved = 0;
      for (std::int64_t i = 0; i < T; ++i)
        for (std::int32_t j = 0; j < 2; ++j) {
          INFO("prio " << static_cast<int>(prio) << " seed " << seed << " position " << i
                       << " choice " << j);
          CHECK(r.gating.ids[i * 2 + j] == base.gating.ids[perm[i] * 2 + j]);
          CHECK(r.dispatch.fates[i * 2 + j] == expect[i * 2 + j]);
          moved += r.dispatch.fates[i * 2 + j] != base.dispatch.fates[perm[i] * 2 + j] ? 1 : 0;
        }
      // the order does decide who is dropped (otherwise this test would prove nothing)
      if (seed == 4u) CHECK(moved > 0);
      CHECK(r.dispatch.total_dropped == base.dispatch.total_dropped);
    }
  }
}

TEST_CASE("batch composition: padding tokens take no slot from anyone",
          "[batch_composition][reliability]") {
  const std::int64_t T = 32;
  for (auto prio : {priority::token_major, priority::score_per_expert, priority::choice_major}) {
    routing_config cfg;
    cfg.num_experts = 4;
    cfg.top_k = 2;
    cfg.capacity.mode = capacity_mode::fixed;  // a factor capacity would grow with T
    cfg.capacity.fixed = 9;
    cfg.dispatch.prio = prio;
    const auto x = random_logits(T, 4, 21, false);
    const auto base = ref::route<float>(cfg, x, T);
    REQUIRE(base.dispatch.total_dropped > 0);
    // insert a padding token (with logits that would win everything) after every real token
    std::vector<float> xp(static_cast<std::size_t>(2 * T * 4), 9.0f);
    std::vector<std::uint8_t> valid(static_cast<std::size_t>(2 * T), 0);
    for (std::int64_t t = 0; t < T; ++t) {
      std::copy_n(x.begin() + t * 4, 4, xp.begin() + 2 * t * 4);
      valid[2 * t] = 1;
    }
    const auto r = ref::route<float>(cfg, xp, 2 * T, {}, valid);
    CHECK(r.dispatch.total_masked == T * 2);
    CHECK(r.dispatch.total_dropped == base.dispatch.total_dropped);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int32_t j = 0; j < 2; ++j) {
        INFO("prio " << static_cast<int>(prio) << " token " << t << " choice " << j);
        CHECK(r.dispatch.fates[2 * t * 2 + j] == base.dispatch.fates[t * 2 + j]);
        CHECK(r.dispatch.expert[2 * t * 2 + j] == base.dispatch.expert[t * 2 + j]);
        CHECK(r.dispatch.fates[(2 * t + 1) * 2 + j] == fate::masked);
      }
  }
}

TEST_CASE("batch composition: a capacity group's routing never depends on another group",
          "[batch_composition][reliability][capacity_groups]") {
  const std::int64_t T = 48, GT = 12;
  std::int64_t runs = 0;
  for (priority p : {priority::token_major, priority::choice_major, priority::score_per_expert,
                     priority::random, priority::batch_prioritized})
    for (drop_policy dp :
         {drop_policy::zero_weight, drop_policy::fallback, drop_policy::next_choice})
      for (slot_order so : {slot_order::priority, slot_order::token_index})
        for (capacity_mode m : {capacity_mode::factor, capacity_mode::max_load})
          for (test::dist dd : {test::dist::normal, test::dist::collapsed, test::dist::skewed}) {
            routing_config c;
            c.num_experts = 6;
            c.top_k = 2;
            c.gating.select = select_from::scores;
            c.gating.renorm = renormalize::after_drop;
            c.capacity.mode = m;
            c.capacity.factor = 0.5;
            c.capacity.group_tokens = GT;
            c.dispatch.prio = p;
            c.dispatch.slots = so;
            c.dispatch.dropped = dp;
            c.dispatch.fallback = {-1, 2};
            c.dispatch.random_seed = 77;
            INFO("prio " << to_string(p) << " policy " << to_string(dp) << " slots "
                         << to_string(so) << " mode " << to_string(m) << " dist "
                         << test::name(dd));
            auto x = test::make_logits(T, 6, dd, 5u);
            const auto g = reference::gating<float>(c, x, T);
            const auto d = reference::dispatch(c, g);
            REQUIRE(test::dispatch_violation(c, g, d) == "");
            // change every other group: group 1's fates, experts and weights stay
            std::mt19937 rng(11);
            std::uniform_real_distribution<float> u(-4.0f, 4.0f);
            for (std::int64_t t = 0; t < T; ++t)
              if (t / GT != 1)
                for (std::int32_t e = 0; e < 6; ++e) x[t * 6 + e] = u(rng);
            const auto g2 = reference::gating<float>(c, x, T);
            const auto d2 = reference::dispatch(c, g2);
            REQUIRE(test::dispatch_violation(c, g2, d2) == "");
            if (m == capacity_mode::max_load) continue;  // C itself is the batch's max
            for (std::int64_t a = GT * 2; a < 2 * GT * 2; ++a) {
              REQUIRE(d.fates[a] == d2.fates[a]);
              REQUIRE(d.expert[a] == d2.expert[a]);
              REQUIRE(d.weight[a] == d2.weight[a]);
            }
            ++runs;
          }
  CHECK(runs == 5 * 3 * 2 * 3);
}
