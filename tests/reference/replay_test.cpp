// SPDX-License-Identifier: Apache-2.0
// Routing replay in reference::gating (moeroute/replay.hpp, docs/replay.md): hand-worked -1
// slots and score filter, bad input named, the replay of a routing's own ids is the identity
// for every preset (ids, gates, drops, losses, bit for bit), and the gradient of the replayed
// routing equals finite differences of its real forward.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include "../common/finite_difference.hpp"
#include "../common/gating_cases.hpp"
#include "../common/replay_cases.hpp"

using namespace moeroute;
using namespace moeroute::test;
namespace ref = moeroute::reference;

namespace {

template <class V>
bool same_bits(const V& a, const V& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

std::string throws_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const moeroute::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("replay: a -1 slot takes the best expert not replayed, gates from the live logits",
          "[replay]") {
  // softmax over all, top-2 on the scores, renormalised (Qwen3): one token, logits 3 1 2 0
  const routing_config cfg = presets::qwen_moe(4, 2);
  const std::vector<float> x = {3.0f, 1.0f, 2.0f, 0.0f};
  const std::vector<std::int32_t> replay = {1, -1};
  const auto g = ref::gating(cfg, x, 1, {}, {}, {replay});
  REQUIRE(g.ids == std::vector<std::int32_t>{1, 0});  // expert 0 is the best one not replayed
  const double e1 = std::exp(1.0), e3 = std::exp(3.0);
  CHECK(g.gates[0] == Approx(e1 / (e1 + e3)).epsilon(1e-6));
  CHECK(g.gates[1] == Approx(e3 / (e1 + e3)).epsilon(1e-6));
  CHECK(g.replay_replaced == 0);
  // every slot -1 is the router's own choice
  const std::vector<std::int32_t> none = {-1, -1};
  CHECK(ref::gating(cfg, x, 1, {}, {}, {none}).ids == std::vector<std::int32_t>{0, 2});
  // the replayed expert keeps its slot even when the router ranks it first
  const std::vector<std::int32_t> second = {-1, 0};
  CHECK(ref::gating(cfg, x, 1, {}, {}, {second}).ids == std::vector<std::int32_t>{2, 0});
}

TEST_CASE("replay: the score filter gives back experts below ratio * the weakest own score",
          "[replay]") {
  const routing_config cfg = presets::qwen_moe(4, 2);
  const std::vector<float> x = {3.0f, 1.0f, 2.0f, 0.0f};  // own top-2: 0, 2 (weakest: 2)
  const std::vector<std::int32_t> replay = {3, 1};
  // p3 / p2 = e^-2 = 0.135, p1 / p2 = e^-1 = 0.368
  const auto kept_both = ref::gating(cfg, x, 1, {}, {}, {replay, 0.1f});
  CHECK(kept_both.ids == std::vector<std::int32_t>{3, 1});
  CHECK(kept_both.replay_replaced == 0);
  const auto one = ref::gating(cfg, x, 1, {}, {}, {replay, 0.3f});  // 3 given back, 1 kept
  CHECK(one.ids == std::vector<std::int32_t>{0, 1});
  CHECK(one.replay_replaced == 1);
  const auto both = ref::gating(cfg, x, 1, {}, {}, {replay, 0.5f});  // both given back
  CHECK(both.ids == std::vector<std::int32_t>{0, 2});
  CHECK(both.replay_replaced == 2);
  // a padding token's slots are replaced but not counted
  const std::vector<float> x2 = {3.0f, 1.0f, 2.0f, 0.0f, 3.0f, 1.0f, 2.0f, 0.0f};
  const std::vector<std::int32_t> r2 = {3, 1, 3, 1};
  const std::vector<std::uint8_t> valid = {1, 0};
  const auto padded = ref::gating(cfg, x2, 2, {}, valid, {r2, 0.5f});
  CHECK(padded.ids == std::vector<std::int32_t>{0, 2, 0, 2});
  CHECK(padded.replay_replaced == 2);

  // per-expert scores: sigmoid, compared as scores (s_a >= ratio * s_weakest)
  routing_config sig = presets::deepseek_v3(4, 2, 0, 0);
  const std::vector<float> xs = {2.0f, -1.0f, 1.0f, -3.0f};  // own: 0, 2; weakest s(1) = 0.731
  const std::vector<std::int32_t> rs = {1, 3};               // s(-1) = 0.269, s(-3) = 0.047
  const std::vector<float> no_bias(4, 0.0f);
  const auto s1 = ref::gating(sig, xs, 1, no_bias, {}, {rs, 0.3f});  // 0.269 / 0.731 = 0.368
  CHECK(s1.ids == std::vector<std::int32_t>{1, 0});
  CHECK(s1.replay_replaced == 1);
  const double a = 1.0 / (1.0 + std::exp(1.0)), b = 1.0 / (1.0 + std::exp(-2.0));
  CHECK(s1.gates[0] == Approx(sig.gating.scaling_factor * a / (a + b)).epsilon(1e-6));
  const auto s2 = ref::gating(sig, xs, 1, no_bias, {}, {rs, 0.4f});
  CHECK(s2.ids == std::vector<std::int32_t>{0, 2});
  CHECK(s2.replay_replaced == 2);
}

TEST_CASE("replay: a group limit and the expert bias never filter a replayed id", "[replay]") {
  // 8 experts in 4 groups, 1 group kept: the router's own choice stays inside one group
  routing_config cfg = presets::deepseek_v3(8, 2, 4, 1);
  const std::vector<float> x = {4.0f, 3.5f, 0.0f, 0.1f, -1.0f, -2.0f, 1.0f, 0.5f};
  std::vector<float> bias(8, 0.0f);
  bias[7] = -50.0f;  // never chosen by the router
  const std::vector<std::int32_t> r = {7, -1};
  const auto g = ref::gating(cfg, x, 1, bias, {}, {r});
  CHECK(g.ids == std::vector<std::int32_t>{7, 0});  // 7 kept; the -1 slot from the kept group
}

TEST_CASE("replay: bad replay input is rejected, naming the element", "[replay][errors]") {
  const routing_config cfg = presets::qwen_moe(4, 2);
  const std::vector<float> x = {3.0f, 1.0f, 2.0f, 0.0f, 1.0f, 2.0f, 3.0f, 4.0f};
  const auto run = [&](std::vector<std::int32_t> r, float ratio = 0.0f) {
    return throws_message([&] { (void)ref::gating(cfg, x, 2, {}, {}, {r, ratio}); });
  };
  CHECK(run({0, 1, 2, 4}).find("replay ids[3] = 4: not an expert") != std::string::npos);
  CHECK(run({0, 1, -2, 3}).find("replay ids[2] = -2") != std::string::npos);
  CHECK(run({0, 1, 2, 2}).find("replay ids[3] = 2: repeats slot 0 of token 1") !=
        std::string::npos);
  CHECK(run({0, 1, 2}).find("replay ids has 3 elements, expected tokens * top_k = 2 * 2") !=
        std::string::npos);
  CHECK(run({0, 1, 2, 3}, 1.5f).find("replay.min_score_ratio") != std::string::npos);
  CHECK(run({0, 1, 2, 3}, -0.1f).find("replay.min_score_ratio") != std::string::npos);
  CHECK(run({0, 1, 2, 3}, std::nanf("")).find("replay.min_score_ratio") != std::string::npos);
  CHECK(run({-1, -1, -1, -1}).empty());  // all -1 is valid
  CHECK(throws_message([&] {
          (void)ref::gating(cfg, x, 2, {}, {}, {{}, 0.5f});
        }).find("replay.min_score_ratio > 0 but replay.d_ids is null") != std::string::npos);
}

TEST_CASE("replay: replaying a routing's own ids is the identity, for every preset",
          "[replay][identity]") {
  const std::int64_t T = 64;
  for (const std::int32_t E : {16, 64}) {
    const auto cases = replay_cases(E);
    REQUIRE(cases.size() >= std::size(presets::registry));
    for (const auto& c : cases) {
      INFO(c.name << ", E = " << E);
      const auto x = replay_logits(T, E, 7u + static_cast<std::uint32_t>(E));
      const auto bias = replay_bias(c.cfg);
      const auto valid = some_padding(T);
      const auto own = ref::gating(c.cfg, x, T, bias, valid);
      for (const float ratio : {0.0f, 0.5f, 1.0f}) {
        INFO("min_score_ratio " << ratio);
        const auto again = ref::gating(c.cfg, x, T, bias, valid, {own.ids, ratio});
        REQUIRE(again.ids == own.ids);
        REQUIRE(again.reroute_ids == own.reroute_ids);
        REQUIRE(same_bits(again.gates, own.gates));
        REQUIRE(same_bits(again.token_priority, own.token_priority));
        REQUIRE(again.second_skipped == own.second_skipped);
        REQUIRE(again.aux_count == own.aux_count);
        REQUIRE(same_bits(again.aux_score_sum, own.aux_score_sum));
        REQUIRE(again.replay_replaced == 0);
        const auto d0 = ref::dispatch(c.cfg, own), d1 = ref::dispatch(c.cfg, again);
        REQUIRE(d1.fates == d0.fates);
        REQUIRE(d1.slot == d0.slot);
        REQUIRE(same_bits(d1.weight, d0.weight));
        const auto l0 = ref::losses(c.cfg, own), l1 = ref::losses(c.cfg, again);
        REQUIRE(std::memcmp(&l0.aux.value, &l1.aux.value, sizeof(double)) == 0);
        REQUIRE(std::memcmp(&l0.z.value, &l1.z.value, sizeof(double)) == 0);
        REQUIRE(std::memcmp(&l0.sequence_aux, &l1.sequence_aux, sizeof(double)) == 0);
      }
    }
  }
}

TEST_CASE("replay: the gradient of a replayed routing equals finite differences, every preset",
          "[replay][backward]") {
  const std::int64_t T = 6;
  const std::int32_t E = 16;
  std::uint32_t seed = 300;
  for (const auto& c : replay_cases(E)) {
    if (c.cfg.noise_active()) continue;  // a noisy forward is its own test (gating_backward)
    INFO(c.name);
    routing_config cfg = c.cfg;
    const auto x = separated_logits(T, E, seed++, 0.2f);
    const auto bias = replay_bias(cfg);
    const auto own = ref::gating(cfg, x, T, bias, {});
    const auto replay = mixed_replay_ids(cfg, own.ids, T, seed++);
    const auto g = ref::gating(cfg, x, T, bias, {}, {replay});
    const auto dsp = ref::dispatch(cfg, g);
    const auto u = upstream(static_cast<std::size_t>(T * cfg.top_k), seed++);
    const auto xd = to_double(x);
    std::vector<double> an(static_cast<std::size_t>(T * E), 0.0);
    ref::routing_backward<double>(cfg, xd, g, dsp, u, an);
    (void)check_fd_double(
        [&](const std::vector<double>& xs) { return dot(u, weights_double(cfg, xs, g, dsp)); }, xd,
        an);
    // the real forward, replayed: same decisions at every perturbed point
    check_fd_float(
        [&](const std::vector<float>& xs) {
          const auto gp = ref::gating(cfg, xs, T, bias, {}, {replay});
          const auto dp = ref::dispatch(cfg, gp);
          REQUIRE(gp.ids == g.ids);
          REQUIRE(dp.fates == dsp.fates);
          return dot(u, dp.weight);
        },
        x, an);
  }
}

TEST_CASE("record: every layer's ids in vLLM's and Megatron's layouts, replayed back",
          "[replay][record]") {
  const routing_config cfg = presets::qwen_moe(16, 4);
  const std::int64_t T = 10, N = 25;
  const std::int32_t L = 3, k = 4;
  for (const record_layout layout :
       {record_layout::tokens_layers_k, record_layout::layers_tokens_k})
    for (const bool narrow : {false, true}) {
      INFO("layout " << static_cast<int>(layout) << ", int16 " << narrow);
      ref::routing_record<std::int32_t> wide(N, L, k, layout);
      ref::routing_record<std::int16_t> small(N, L, k, layout);
      std::vector<ref::gating_output> routed;
      for (std::int32_t l = 0; l < L; ++l) {
        routed.push_back(ref::gating(cfg, replay_logits(T, 16, 50u + l), T));
        if (narrow) {
          ref::record(cfg, routed.back(), l, /*first_token=*/7, small);
        } else {
          ref::record(cfg, routed.back(), l, 7, wide);
        }
      }
      for (std::int32_t l = 0; l < L; ++l) {
        const auto back = narrow ? ref::replay_ids(small, l, 7, T) : ref::replay_ids(wide, l, 7, T);
        REQUIRE(back == routed[l].ids);
        // the explicit index of each layout
        const std::int64_t t = 4;
        const std::int32_t j = 2;
        const std::int64_t at = layout == record_layout::tokens_layers_k
                                    ? ((7 + t) * L + l) * k + j
                                    : (static_cast<std::int64_t>(l) * N + 7 + t) * k + j;
        const std::int32_t held = narrow ? small.ids[at] : wide.ids[at];
        REQUIRE(held == routed[l].ids[t * k + j]);
      }
      // rows never written stay -1
      REQUIRE((narrow ? ref::replay_ids(small, 0, 0, 7) : ref::replay_ids(wide, 0, 0, 7)) ==
              std::vector<std::int32_t>(7 * k, -1));
    }
  // bad records are named
  ref::routing_record<std::int32_t> rec(5, 2, 4, record_layout::tokens_layers_k);
  const auto g = ref::gating(cfg, replay_logits(T, 16, 1), T);
  CHECK(throws_message([&] { ref::record(cfg, g, 0, 0, rec); }).find("exceeds record_tokens") !=
        std::string::npos);
  CHECK(throws_message([&] { ref::record(cfg, g, 2, 0, rec); }).find("layer = 2") !=
        std::string::npos);
  ref::routing_record<std::int16_t> r16(10, 1, 4, record_layout::tokens_layers_k);
  CHECK(throws_message([&] {
          ref::record(cfg, g, 0, 1, r16);
        }).find("first_token + tokens = 1 + 10 exceeds record_tokens = 10") != std::string::npos);
}
