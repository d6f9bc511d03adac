// SPDX-License-Identifier: Apache-2.0
// Routing replay on the CPU backend (moeroute/replay.hpp): every preset with mixed replay ids
// (own, other, -1) and the score filter equals reference::gating, the replaced count included;
// serial, OpenMP and reverse-order runs agree bit for bit; replaying one's own ids is the
// identity; bad ids are invalid_argument naming the element.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <moeroute/cpu/gating.hpp>
#include <moeroute/cpu/record.hpp>
#include <moeroute/cpu/router.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/reference/record.hpp>

#include "../common/replay_cases.hpp"
#include "gating_harness.hpp"

using namespace moeroute;
using namespace moeroute::test;

namespace {

/// cpu::gating with replay ids against reference::gating with the same; "" when they agree.
std::string check_replay(const routing_config& cfg, const std::vector<float>& x, std::int64_t T,
                         const std::vector<float>& bias, const std::vector<std::uint8_t>& valid,
                         const std::vector<std::int32_t>& replay, float ratio) {
  const auto ref = reference::gating<float>(cfg, x, T, bias, valid, {replay, ratio});
  cpu_gating_buffers<float> b(cfg, x, T, bias, valid, 0);
  std::int64_t replaced = -1, invalid = -1;
  b.p.replay = {replay.data(), ratio, &replaced, &invalid};
  gating_outputs serial;
  if (auto m = run_three_ways(cfg, b, serial); !m.empty()) return m;
  if (replaced != ref.replay_replaced)
    return "replaced " + std::to_string(replaced) + " != reference " +
           std::to_string(ref.replay_replaced);
  if (invalid != 0) return "invalid written as " + std::to_string(invalid);
  return compare(ref, serial);
}

}  // namespace

TEST_CASE("cpu replay equals the reference for every preset, mixed ids and the filter",
          "[replay]") {
  std::uint32_t seed = 40;
  for (const std::int32_t E : {16, 64, 256})
    for (const auto& c : replay_cases(E)) {
      for (const std::int64_t T : {1, 37, 300}) {
        INFO(c.name << ", E = " << E << ", T = " << T);
        const auto x = replay_logits(T, E, seed++);
        const auto bias = replay_bias(c.cfg);
        const auto valid = some_padding(T);
        const auto own = reference::gating<float>(c.cfg, x, T, bias, valid);
        const auto replay = mixed_replay_ids(c.cfg, own.ids, T, seed++);
        for (const float ratio : {0.0f, 0.4f, 1.0f}) {
          INFO("min_score_ratio " << ratio);
          REQUIRE(check_replay(c.cfg, x, T, bias, valid, replay, ratio) == "");
        }
        // identity: the backend's own ids replayed give its own outputs
        cpu_gating_buffers<float> b(c.cfg, x, T, bias, valid, 0);
        const gating_outputs first = b.run(c.cfg, cpu::executor{});
        const std::vector<std::int32_t> ids = first.ids;
        std::int64_t replaced = -1;
        b.p.replay = {ids.data(), 0.5f, &replaced, nullptr};
        REQUIRE(same_bits(first, b.run(c.cfg, cpu::executor{}), "replayed") == "");
        REQUIRE(replaced == 0);
      }
    }
}

TEST_CASE("cpu replay: bad ids and options are invalid_argument naming them", "[replay]") {
  const routing_config cfg = presets::qwen_moe(8, 2);
  const std::vector<float> x(16, 0.5f);
  cpu_gating_buffers<float> b(cfg, x, 2, {}, {}, 0);
  std::vector<std::int32_t> r = {0, 1, 2, 8};
  b.p.replay.d_ids = r.data();
  auto g = b.run(cfg, cpu::executor::serial());
  CHECK(g.st.code == status_code::invalid_argument);
  CHECK(g.st.message.find("replay.d_ids[3] = 8") != std::string::npos);
  r = {0, 1, 3, 3};
  g = b.run(cfg, cpu::executor::serial());
  CHECK(g.st.message.find("replay.d_ids[3] = 3: repeats slot 0 of token 1") != std::string::npos);
  r = {0, 1, 3, -1};
  b.p.replay.min_score_ratio = 2.0f;
  g = b.run(cfg, cpu::executor::serial());
  CHECK(g.st.message.find("replay.min_score_ratio") != std::string::npos);
  b.p.replay.min_score_ratio = 0.5f;
  CHECK(b.run(cfg, cpu::executor::serial()).st.ok());
}

TEST_CASE("cpu record equals the reference in both layouts and widths", "[replay][record]") {
  const routing_config cfg = presets::deepseek_v3(64, 8, 8, 4);
  const std::int64_t T = 300, N = 700;
  const std::int32_t L = 2;
  const auto g = reference::gating<float>(cfg, replay_logits(T, 64, 9), T, replay_bias(cfg), {});
  for (const record_layout layout :
       {record_layout::tokens_layers_k, record_layout::layers_tokens_k}) {
    reference::routing_record<std::int16_t> want(N, L, 8, layout);
    reference::record(cfg, g, 1, 333, want);
    std::vector<std::int16_t> got(want.ids.size(), -1);
    record_params<std::int16_t> p = want.params(1, 333, T);
    p.d_ids = g.ids.data();
    p.d_record = got.data();
    REQUIRE(cpu::record(cfg, p).ok());
    REQUIRE(got == want.ids);
    p.first_token = 401;  // 401 + 300 > 700
    const status st = cpu::record(cfg, p);
    CHECK(st.code == status_code::invalid_argument);
    CHECK(st.message.find("exceeds record_tokens = 700") != std::string::npos);
  }
}

TEST_CASE("cpu::router routes with replay: its own ids give the same batch, others move it",
          "[replay][router]") {
  routing_config cfg = presets::mixtral(8, 2);
  cfg.capacity.mode = capacity_mode::factor;
  cfg.capacity.factor = 1.0;
  const std::int64_t T = 64;
  cpu::router<float> r(cfg, T, 16);
  const auto x = replay_logits(T, 8, 21);
  REQUIRE(r.route(x).ok());
  const std::vector<std::int32_t> own(r.gated().d_ids, r.gated().d_ids + T * 2);
  const std::vector<float> weight(r.dispatched().d_weight, r.dispatched().d_weight + T * 2);
  const dispatch_totals totals = r.totals();
  std::int64_t replaced = -1;
  REQUIRE(r.route(x, gating_replay{own.data(), 0.2f, &replaced, nullptr}).ok());
  REQUIRE(std::equal(own.begin(), own.end(), r.gated().d_ids));
  REQUIRE(std::equal(weight.begin(), weight.end(), r.dispatched().d_weight));
  REQUIRE(r.totals().dropped == totals.dropped);
  REQUIRE(replaced == 0);
  // every token's first choice forced to expert 0: it overflows, as the reference says
  std::vector<std::int32_t> forced(own.size(), -1);
  for (std::int64_t t = 0; t < T; ++t) forced[t * 2] = 0;
  REQUIRE(r.route(x, gating_replay{forced.data()}).ok());
  const auto g = reference::gating<float>(cfg, x, T, {}, {}, {forced});
  const auto d = reference::dispatch(cfg, g);
  REQUIRE(std::equal(g.ids.begin(), g.ids.end(), r.gated().d_ids));
  REQUIRE(r.totals().dropped == d.total_dropped);
  REQUIRE(d.total_dropped > 0);
  // a bad id is the router's error, naming it
  forced[5] = 8;
  const status st = r.route(x, gating_replay{forced.data()});
  REQUIRE(st.code == status_code::invalid_argument);
  REQUIRE(st.message.find("replay.d_ids[5] = 8") != std::string::npos);
}
