// SPDX-License-Identifier: Apache-2.0
// Invariants of capacity assignment on random and adversarial batches, for every priority
// mode x drop policy x slot order: no expert above capacity, one token per slot, dense slots,
// conservation, monotone drop rate, dropless drops nothing, and the tie rules.
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <moeroute/config_fields.hpp>
#include <moeroute/reference.hpp>
#include <random>
#include <string>
#include <vector>

#include "../common/invariants.hpp"
#include "../common/test_util.hpp"

using namespace moeroute;
using moeroute::test::dist;

namespace {

constexpr priority all_priorities[] = {priority::token_major, priority::choice_major,
                                       priority::score_per_expert, priority::random,
                                       priority::batch_prioritized};

struct policy_case {
  const char* name;
  drop_policy dropped;
  std::int32_t fallback_expert = -1;
  std::int64_t fallback_capacity = -1;
  std::int32_t max_candidates = 4;
};

const policy_case all_policies[] = {
    {"zero_weight", drop_policy::zero_weight},
    {"residual", drop_policy::residual},
    {"fallback dedicated unbounded", drop_policy::fallback, -1, -1},
    {"fallback dedicated capacity 3", drop_policy::fallback, -1, 3},
    {"fallback routed expert 0", drop_policy::fallback, 0, -1},
    {"next_choice 1", drop_policy::next_choice, -1, -1, 1},
    {"next_choice 3", drop_policy::next_choice, -1, -1, 3},
};

routing_config make_config(std::int32_t E, std::int32_t k, priority p, const policy_case& pc,
                           slot_order so) {
  routing_config c;
  c.num_experts = E;
  c.top_k = k;
  c.gating.select = select_from::scores;
  c.gating.renorm = renormalize::after_drop;
  c.capacity.factor = 1.0;
  c.dispatch.prio = p;
  c.dispatch.slots = so;
  c.dispatch.dropped = pc.dropped;
  c.dispatch.fallback = {pc.fallback_expert, pc.fallback_capacity};
  c.dispatch.reroute.max_candidates = pc.max_candidates;
  c.dispatch.random_seed = 1234;
  return c;
}

std::vector<std::uint8_t> make_valid(std::int64_t T, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> v(static_cast<std::size_t>(T));
  for (auto& b : v) b = (rng() % 5) != 0;  // ~20% padding
  return v;
}

}  // namespace

TEST_CASE("invariants: every priority x drop policy x slot order on random and adversarial batches",
          "[reference][invariants]") {
  const std::pair<std::int32_t, std::int32_t> shapes[] = {{5, 1}, {8, 2}, {7, 3}};
  const double factors[] = {0.25, 0.5, 1.0, 2.0};
  std::int64_t runs = 0;
  for (auto [E, k] : shapes)
    for (priority p : all_priorities)
      for (const auto& pc : all_policies)
        for (slot_order so : {slot_order::priority, slot_order::token_index})
          for (dist dd : test::all_dists)
            for (double f : factors)
              for (bool masked : {false, true}) {
                const std::int64_t T = 48;
                auto cfg = make_config(E, k, p, pc, so);
                cfg.capacity.factor = f;
                const auto x =
                    test::make_logits(T, E, dd, 17u + static_cast<std::uint32_t>(E * 31 + k));
                const auto valid = masked ? make_valid(T, 99u) : std::vector<std::uint8_t>{};
                INFO("E " << E << " k " << k << " prio " << static_cast<int>(p) << " policy "
                          << pc.name << " slots " << static_cast<int>(so) << " dist "
                          << test::name(dd) << " factor " << f << " masked " << masked);
                const auto g = reference::gating<float>(cfg, x, T, {}, valid);
                const auto d = reference::dispatch(cfg, g);
                CHECK(test::dispatch_violation(cfg, g, d) == "");
                if (masked) {
                  std::int64_t pad = 0;
                  for (auto v : valid) pad += v == 0;
                  CHECK(d.total_masked == pad * k);
                } else {
                  CHECK(d.total_masked == 0);
                }
                if (pc.dropped == drop_policy::zero_weight || pc.dropped == drop_policy::residual)
                  CHECK(d.total_rerouted == 0);
                if (pc.dropped == drop_policy::fallback && pc.fallback_expert < 0 &&
                    pc.fallback_capacity < 0)
                  CHECK(d.total_dropped == 0);  // an unbounded shared expert takes every drop
                ++runs;
              }
  CHECK(runs == 3 * 5 * 7 * 2 * 7 * 4 * 2);
}

TEST_CASE("invariants: drop rate is non-increasing in the capacity factor",
          "[reference][invariants]") {
  const double factors[] = {0.05, 0.1, 0.25, 0.4, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 8.0};
  for (priority p : {priority::token_major, priority::choice_major, priority::score_per_expert})
    for (const auto& pc : all_policies) {
      // Every policy, reroutes included: for next_choice and a routed fallback this is not a
      // theorem, but no counterexample turned up in 400k random small batches (T <= 6, E <= 4,
      // integer logits, every C from 0 to T), so it is held to it here too.
      for (dist dd : test::all_dists)
        for (auto [E, k] : {std::pair{8, 2}, std::pair{6, 1}, std::pair{9, 3}}) {
          const std::int64_t T = 64;
          const auto x = test::make_logits(T, E, dd, 5u + static_cast<std::uint32_t>(E));
          double last = 2.0;
          for (double f : factors) {
            auto cfg = make_config(E, k, p, pc, slot_order::priority);
            cfg.capacity.factor = f;
            const auto r = reference::route<float>(cfg, x, T);
            const auto st = reference::compute_stats(
                r.dispatch, reference::layout(cfg, r.dispatch, layout_kind::compact));
            INFO("prio " << static_cast<int>(p) << " policy " << pc.name << " dist "
                         << test::name(dd) << " E " << E << " k " << k << " factor " << f);
            CHECK(st.drop_rate <= last);
            last = st.drop_rate;
          }
          CHECK(last == 0.0);  // factor 8 >= E/k: every expert can hold every token
        }
    }
}

TEST_CASE("invariants: dropless drops nothing", "[reference][invariants]") {
  for (capacity_mode m : {capacity_mode::unbounded, capacity_mode::max_load})
    for (priority p : all_priorities)
      for (const auto& pc : all_policies)
        for (dist dd : test::all_dists) {
          auto cfg = make_config(8, 2, p, pc, slot_order::priority);
          cfg.capacity.mode = m;
          const std::int64_t T = 40;
          const auto x = test::make_logits(T, 8, dd, 3u);
          const auto r = reference::route<float>(cfg, x, T);
          INFO("mode " << static_cast<int>(m) << " prio " << static_cast<int>(p) << " policy "
                       << pc.name << " dist " << test::name(dd));
          CHECK(test::dispatch_violation(cfg, r.gating, r.dispatch) == "");
          CHECK(r.dispatch.total_dropped == 0);
          CHECK(r.dispatch.total_rerouted == 0);
          CHECK(r.dispatch.total_kept == T * 2);
          if (m == capacity_mode::max_load) {
            std::int64_t mx = 0;
            for (auto q : r.dispatch.requested) mx = std::max(mx, q);
            CHECK(r.dispatch.capacity == mx);
          } else {
            CHECK(r.dispatch.capacity == unbounded_capacity);
          }
        }
}

TEST_CASE("invariants: ties go to the lower expert index, then the lower token index",
          "[reference][invariants][ties]") {
  const std::int32_t E = 6, k = 2;
  const std::int64_t T = 10;
  SECTION("equal logits choose the lowest expert indices, in order") {
    for (auto score :
         {score_function::softmax, score_function::sigmoid, score_function::sqrt_softplus})
      for (auto sel : {select_from::logits, select_from::scores}) {
        routing_config c;
        c.num_experts = E;
        c.top_k = 4;
        c.gating.score = score;
        c.gating.select = sel;
        const std::vector<float> x(T * E, 1.0f);
        const auto g = reference::gating(c, x, T);
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int32_t j = 0; j < 4; ++j) CHECK(g.ids[t * 4 + j] == j);
      }
    // a partial tie: [1, 3, 2, 3, 3, 0] -> 1, 3, 4 (the three 3s by index), then 2
    routing_config c;
    c.num_experts = E;
    c.top_k = 4;
    const std::vector<float> x = {1, 3, 2, 3, 3, 0};
    CHECK(reference::gating(c, x, 1).ids == std::vector<std::int32_t>{1, 3, 4, 2});
    // tied group scores: groups {0,1} {2,3} {4,5} all sum to 4 -> group 0
    c.top_k = 2;
    c.gating.group_limit = {3, 1};
    CHECK(reference::gating(c, std::vector<float>{3, 1, 1, 3, 2, 2}, 1).ids ==
          std::vector<std::int32_t>{0, 1});
  }
  SECTION("identical tokens: the lower token indices get the slots") {
    const auto row = test::make_logits(1, E, dist::normal, 8u);
    std::vector<float> x;
    for (std::int64_t t = 0; t < T; ++t) x.insert(x.end(), row.begin(), row.end());
    for (priority p : {priority::token_major, priority::choice_major, priority::score_per_expert})
      for (slot_order so : {slot_order::priority, slot_order::token_index}) {
        routing_config c;
        c.num_experts = E;
        c.top_k = k;
        c.capacity.mode = capacity_mode::fixed;
        c.capacity.fixed = 3;
        c.dispatch.prio = p;
        c.dispatch.slots = so;
        const auto r = reference::route<float>(c, x, T);
        const auto& d = r.dispatch;
        INFO("prio " << static_cast<int>(p) << " slots " << static_cast<int>(so));
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int32_t j = 0; j < k; ++j) {
            const bool want = t < 3;
            CHECK((d.fates[t * k + j] == fate::kept) == want);
            if (want) CHECK(d.slot[t * k + j] == t);
          }
      }
  }
  SECTION("score priority: equal gates at the cut-off keep the lower token index") {
    // k = 1 softmax after top-k: every gate is exactly 1.0 (Megatron top-1)
    presets::megatron_options o;
    o.capacity_factor = 0.5;  // C = ceil(10 * 1 / 6 * 0.5) = 1
    const auto c = presets::megatron(E, 1, o);
    const auto x = test::make_logits(T, E, dist::collapsed, 2u);  // all choose expert 1
    const auto r = reference::route<float>(c, x, T);
    REQUIRE(r.dispatch.capacity == 1);
    for (std::int64_t t = 0; t < T; ++t) {
      REQUIRE(r.gating.ids[t] == 1);
      REQUIRE(r.gating.gates[t] == 1.0f);
      CHECK((r.dispatch.fates[t] == fate::kept) == (t == 0));
    }
  }
  SECTION("score priority keeps the larger gates regardless of token order") {
    auto c = parse_config(
        "num_experts=2 top_k=1 gating.select=scores capacity.mode=fixed capacity.fixed=2 "
        "dispatch.prio=score_per_expert");
    // all choose expert 0 with gates increasing in t: the last two are kept
    const std::vector<float> x = {1, 0, 2, 0, 3, 0, 4, 0};
    auto r = reference::route<float>(c, x, 4);
    CHECK(r.dispatch.fates ==
          std::vector<fate>{fate::dropped, fate::dropped, fate::kept, fate::kept});
    CHECK(r.dispatch.slot == std::vector<std::int32_t>{-1, -1, 1, 0});  // granted by score
    c.dispatch.slots = slot_order::token_index;
    r = reference::route<float>(c, x, 4);
    CHECK(r.dispatch.slot == std::vector<std::int32_t>{-1, -1, 0, 1});
  }
}

TEST_CASE("invariants: random priority is seeded and deterministic", "[reference][invariants]") {
  auto c = make_config(8, 2, priority::random, all_policies[0], slot_order::priority);
  c.capacity.factor = 0.5;
  const std::int64_t T = 64;
  const auto x = test::make_logits(T, 8, dist::skewed, 4u);
  const auto a = reference::route<float>(c, x, T), b = reference::route<float>(c, x, T);
  CHECK(a.dispatch.fates == b.dispatch.fates);
  CHECK(a.dispatch.slot == b.dispatch.slot);
  c.dispatch.random_seed = 4321;
  const auto other = reference::route<float>(c, x, T);
  CHECK(other.dispatch.fates != a.dispatch.fates);
  c.dispatch.random_seed = 1234;
  c.dispatch.random_offset = 1;
  CHECK(reference::route<float>(c, x, T).dispatch.fates != a.dispatch.fates);
  // the same number kept per expert as any other priority (min(requested, C))
  for (std::int32_t e = 0; e < 8; ++e)
    CHECK(other.dispatch.kept[e] ==
          std::min<std::int64_t>(other.dispatch.requested[e], other.dispatch.capacity));
}

TEST_CASE("invariants: reroutes (fallback, next_choice) by hand", "[reference][invariants]") {
  // four identical tokens preferring experts 0 > 1 > 2 > 3, k = 1, C = 1
  const std::vector<float> x = {4, 3, 2, 1, 4, 3, 2, 1, 4, 3, 2, 1, 4, 3, 2, 1};
  routing_config c;
  c.num_experts = 4;
  c.top_k = 1;
  c.capacity.mode = capacity_mode::fixed;
  c.capacity.fixed = 1;
  SECTION("next_choice walks down each token's ranking in rounds") {
    c.dispatch.dropped = drop_policy::next_choice;
    c.dispatch.reroute.max_candidates = 2;
    const auto d = reference::route<float>(c, x, 4).dispatch;
    // t0 keeps e0; round 0: t1 -> e1, t2, t3 try e1 (full); round 1: t2 -> e2, t3 full
    CHECK(d.fates == std::vector<fate>{fate::kept, fate::rerouted, fate::rerouted, fate::dropped});
    CHECK(d.expert == std::vector<std::int32_t>{0, 1, 2, -1});
    CHECK(d.reroute_rounds == 2);
    CHECK(d.rerouted[0] == 2);
    CHECK(d.dropped[0] == 1);
    CHECK(d.received == std::vector<std::int64_t>{0, 1, 1, 0});
  }
  SECTION("fallback to a dedicated shared expert with capacity 2") {
    c.dispatch.dropped = drop_policy::fallback;
    c.dispatch.fallback = {-1, 2};
    const auto d = reference::route<float>(c, x, 4).dispatch;
    CHECK(d.total_experts == 5);
    CHECK(d.expert == std::vector<std::int32_t>{0, 4, 4, -1});
    CHECK(d.slot == std::vector<std::int32_t>{0, 0, 1, -1});
    CHECK(d.fallback_capacity == 2);
    CHECK(d.load == std::vector<std::int64_t>{1, 0, 0, 0, 2});
  }
  SECTION("fallback to routed expert 3 uses its spare slot") {
    c.dispatch.dropped = drop_policy::fallback;
    c.dispatch.fallback = {3, -1};
    const auto d = reference::route<float>(c, x, 4).dispatch;
    CHECK(d.expert == std::vector<std::int32_t>{0, 3, -1, -1});
    CHECK(d.load[3] == 1);
  }
}

TEST_CASE("invariants: the checker itself reports corrupted results", "[reference][invariants]") {
  auto c = make_config(8, 2, priority::token_major, all_policies[0], slot_order::priority);
  c.capacity.factor = 0.5;
  const auto x = test::make_logits(32, 8, dist::skewed, 6u);
  const auto g = reference::gating<float>(c, x, 32);
  const auto d0 = reference::dispatch(c, g);
  REQUIRE(test::dispatch_violation(c, g, d0).empty());
  REQUIRE(d0.total_dropped > 0);
  std::int64_t kept_a = -1, drop_a = -1;
  for (std::int64_t a = 0; a < 64; ++a) {
    if (kept_a < 0 && d0.fates[a] == fate::kept) kept_a = a;
    if (drop_a < 0 && d0.fates[a] == fate::dropped) drop_a = a;
  }
  auto d = d0;
  d.slot[kept_a] += 1000;
  CHECK_THAT(test::dispatch_violation(c, g, d), Catch::Contains("slots not dense"));
  d = d0;
  d.fates[drop_a] = fate::kept;
  CHECK_THAT(test::dispatch_violation(c, g, d), Catch::Contains("kept at another expert"));
  d = d0;
  ++d.requested[0];
  CHECK_THAT(test::dispatch_violation(c, g, d), Catch::Contains("per-expert counts"));
  d = d0;
  d.capacity = 1;
  CHECK_THAT(test::dispatch_violation(c, g, d), Catch::Contains("capacity differs"));
  REQUIRE(test::gating_violation(c, g).empty());
  auto g2 = g;
  g2.ids[1] = g2.ids[0];
  CHECK_THAT(test::gating_violation(c, g2), Catch::Contains("duplicate id"));
  g2 = g;
  g2.gates[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(test::gating_violation(c, g2), Catch::Contains("gate not finite"));
  g2 = g;
  ++g2.aux_count[2];
  CHECK_THAT(test::gating_violation(c, g2), Catch::Contains("aux counts"));
  // two tokens in one slot
  d = d0;
  std::int64_t other = -1;
  for (std::int64_t a = 0; a < 64; ++a)
    if (a / 2 != kept_a / 2 && d0.expert[a] == d0.expert[kept_a]) {
      other = a;
      break;
    }
  REQUIRE(other >= 0);
  d.slot[other] = d0.slot[kept_a];
  CHECK_THAT(test::dispatch_violation(c, g, d), Catch::Contains("slot used twice"));
}

TEST_CASE("invariants: noisy gating stays valid, seeded and training-only",
          "[reference][invariants]") {
  const std::int64_t T = 32;
  const auto x = test::make_logits(T, 8, dist::ties, 10u);
  for (noise_kind kind : {noise_kind::gaussian, noise_kind::gumbel})
    for (noise_target target : {noise_target::selection_only, noise_target::selection_and_gates})
      for (priority p : all_priorities) {
        auto c = make_config(8, 2, p, all_policies[0], slot_order::priority);
        c.gating.noise = {kind, 1.0f, 99, 0, target, true};
        INFO("kind " << static_cast<int>(kind) << " target " << static_cast<int>(target) << " prio "
                     << static_cast<int>(p));
        const auto a = reference::route<float>(c, x, T);
        CHECK(test::dispatch_violation(c, a.gating, a.dispatch) == "");
        const auto b = reference::route<float>(c, x, T);
        CHECK(a.gating.ids == b.gating.ids);
        CHECK(a.gating.gates == b.gating.gates);
        c.gating.noise.offset = 1;  // the next step draws different noise
        CHECK(reference::route<float>(c, x, T).gating.ids != a.gating.ids);
        c.training = false;  // evaluation: no noise, the clean routing
        auto clean = c;
        clean.gating.noise.kind = noise_kind::none;
        CHECK(reference::route<float>(c, x, T).gating.ids ==
              reference::route<float>(clean, x, T).gating.ids);
        // the z-loss always uses the clean logits
        CHECK(a.losses.z.value == reference::route<float>(clean, x, T).losses.z.value);
      }
}
