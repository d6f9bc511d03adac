// SPDX-License-Identifier: Apache-2.0
// Edge cases: T = 0 and 1, k = 1 and k = E, E = 1, capacity 0, all tokens on one expert,
// all-negative logits, rows with NaN / +-Inf (docs/numerics.md, "Non-finite logits"), and
// 16-bit logits routing exactly like the fp32 values they round to.
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <moeroute/reference.hpp>
#include <string>
#include <vector>

#include "../common/invariants.hpp"
#include "../common/test_util.hpp"

using namespace moeroute;
using Catch::Matchers::WithinRel;
using moeroute::test::dist;

namespace {

struct named_config {
  std::string name;
  routing_config cfg;
};

/// Every preset, plus the reroute policies, at E experts (groups where E allows).
std::vector<named_config> configs(std::int32_t E, std::int32_t k) {
  std::vector<named_config> v;
  v.push_back({"seed_reference", presets::seed_reference(E, k, 1.0)});
  if (k == 2) v.push_back({"deepspeed_top2", presets::deepspeed_top2(E, 1.0)});
  v.push_back({"deepspeed_topk", presets::deepspeed_topk(E, k, 1.0)});
  presets::megatron_options o;
  o.capacity_factor = 1.0;
  v.push_back({"megatron", presets::megatron(E, k, o)});
  v.push_back({"megatron dropless", presets::megatron(E, k)});
  v.push_back({"mixtral", presets::mixtral(E, k)});
  v.push_back({"qwen_moe", presets::qwen_moe(E, k)});
  if (k == 1) v.push_back({"switch_top1", presets::switch_top1(E)});
  if (E % 2 == 0 && k % 2 == 0 && k / 2 <= E / 2) {
    auto c = presets::deepseek_v3(E, k, 2, 2);
    c.loss.aux_coefficient = 1.0f;
    v.push_back({"deepseek_v3", c});
  }
  auto c = presets::deepspeed_topk(E, k, 1.0);
  c.dispatch.dropped = drop_policy::next_choice;
  v.push_back({"next_choice", c});
  c.dispatch.dropped = drop_policy::fallback;
  v.push_back({"fallback dedicated", c});
  c.dispatch.prio = priority::random;
  c.gating.score = score_function::sqrt_softplus;
  c.gating.select = select_from::scores;
  v.push_back({"random + sqrt_softplus", c});
  auto s = presets::megatron(E, k, o);
  s.gating.score = score_function::sigmoid;
  s.gating.stage = softmax_stage::before_topk;
  s.gating.select = select_from::scores;
  s.gating.renorm = renormalize::before_drop;
  v.push_back({"sigmoid", s});
  return v;
}

reference::routing_result run(const routing_config& c, const std::vector<float>& x,
                              std::int64_t T) {
  std::vector<float> bias;
  if (c.gating.expert_bias) {
    bias.resize(c.num_experts);
    for (std::int32_t e = 0; e < c.num_experts; ++e) bias[e] = 0.01f * static_cast<float>(e % 3);
  }
  return reference::route<float>(c, x, T, bias);
}

}  // namespace

TEST_CASE("edge: T = 0 is a successful no-op everywhere", "[reference][edge]") {
  for (const auto& [name, c] : configs(8, 2)) {
    INFO(name);
    const auto r = run(c, {}, 0);
    CHECK(r.gating.ids.empty());
    CHECK(r.dispatch.assignments() == 0);
    CHECK(r.losses.aux.value == 0.0);
    CHECK(r.losses.z.value == 0.0);
    CHECK(test::dispatch_violation(c, r.gating, r.dispatch) == "");
    CHECK(r.dispatch.capacity ==
          (c.capacity.mode == capacity_mode::unbounded ? -1 : c.capacity.min_capacity));
    const auto L = reference::layout(c, r.dispatch, layout_kind::compact, 4);
    CHECK(L.num_rows == 0);
    std::vector<float> none;
    reference::permute<float>(c, L, none, 0, 3, none);
    reference::combine<float>(c, L, r.dispatch, none, 3, none, none);
    const auto st = reference::compute_stats(r.dispatch, L);
    CHECK(st.drop_rate == 0.0);
    CHECK(st.fully_dropped_tokens == 0);
    CHECK(st.padding_waste == 0.0);
    CHECK(st.dead_experts == 8);
  }
}

TEST_CASE("edge: T = 1, k = 1, k = E, E = 1", "[reference][edge]") {
  for (auto [E, k] : {std::pair{1, 1}, std::pair{5, 1}, std::pair{5, 5}, std::pair{8, 8},
                      std::pair{7, 3}, std::pair{33, 2}})
    for (std::int64_t T : {std::int64_t{1}, std::int64_t{2}, std::int64_t{17}})
      for (dist dd : test::all_dists)
        for (const auto& [name, c] : configs(E, k)) {
          INFO(name << " E " << E << " k " << k << " T " << T << " dist " << test::name(dd));
          const auto x = test::make_logits(T, E, dd, 77u);
          const auto r = run(c, x, T);
          REQUIRE(test::dispatch_violation(c, r.gating, r.dispatch) == "");
          if (k == E) {  // every expert once per token
            for (std::int64_t t = 0; t < T; ++t) {
              std::vector<int> seen(E, 0);
              for (std::int32_t j = 0; j < k; ++j) ++seen[r.gating.ids[t * k + j]];
              for (int s : seen) CHECK(s == 1);
            }
          }
          if (E == 1) {
            for (std::int64_t t = 0; t < T; ++t) CHECK(r.gating.ids[t] == 0);
            if (c.gating.score == score_function::softmax) CHECK(r.gating.gates[0] == 1.0f);
          }
          // T = 1: a token picks an expert at most once, so C >= 1 keeps everything
          if (T == 1 && r.dispatch.capacity != 0) CHECK(r.dispatch.total_dropped == 0);
        }
}

TEST_CASE("edge: capacity 0 drops (or reroutes) everything", "[reference][edge]") {
  const std::int64_t T = 12;
  const auto x = test::make_logits(T, 4, dist::normal, 3u);
  for (auto policy : {drop_policy::zero_weight, drop_policy::residual, drop_policy::next_choice,
                      drop_policy::fallback}) {
    routing_config c;
    c.num_experts = 4;
    c.top_k = 2;
    c.capacity.mode = capacity_mode::fixed;
    c.capacity.fixed = 0;
    c.dispatch.dropped = policy;
    const auto r = reference::route<float>(c, x, T);
    INFO("policy " << static_cast<int>(policy));
    CHECK(r.dispatch.capacity == 0);
    CHECK(test::dispatch_violation(c, r.gating, r.dispatch) == "");
    CHECK(r.dispatch.total_kept == 0);
    if (policy == drop_policy::fallback) {
      CHECK(r.dispatch.total_rerouted == T * 2);  // to the unbounded shared expert
      CHECK(r.dispatch.load[4] == T);             // one slot per token (shared)
    } else {
      CHECK(r.dispatch.total_dropped == T * 2);
    }
    const auto L = reference::layout(c, r.dispatch, layout_kind::padded);
    CHECK(L.offsets[4] == 0);
    const std::int64_t d = 3;
    std::vector<float> xx(T * d), rows(L.num_rows * d), y(T * d, -7.0f);
    for (std::size_t i = 0; i < xx.size(); ++i) xx[i] = static_cast<float>(i) * 0.5f;
    reference::permute<float>(c, L, xx, T, d, rows);
    reference::combine<float>(c, L, r.dispatch, rows, d, xx, y);
    for (std::size_t i = 0; i < y.size(); ++i) {
      if (policy == drop_policy::residual)
        CHECK(y[i] == xx[i]);
      else if (policy == drop_policy::fallback)
        CHECK_THAT(y[i],
                   WithinRel(static_cast<double>(xx[i]) * (r.dispatch.weight[(i / d) * 2] +
                                                           r.dispatch.weight[(i / d) * 2 + 1]),
                             1e-6));
      else
        CHECK(y[i] == 0.0f);
    }
    const auto st = reference::compute_stats(r.dispatch, L);
    CHECK(st.fully_dropped_tokens == (policy == drop_policy::fallback ? 0 : T));
  }
}

TEST_CASE("edge: all tokens on one expert", "[reference][edge]") {
  const std::int64_t T = 40;
  const auto x = test::make_logits(T, 8, dist::collapsed, 9u);  // everyone's top-1 is expert 1
  for (const auto& [name, c] : configs(8, 1)) {
    INFO(name);
    const auto r = run(c, x, T);
    REQUIRE(test::dispatch_violation(c, r.gating, r.dispatch) == "");
    if (c.gating.expert_bias) continue;
    CHECK(r.dispatch.requested[1] == T);
    if (r.dispatch.capacity >= 0 && c.dispatch.dropped != drop_policy::next_choice &&
        c.dispatch.dropped != drop_policy::fallback)
      CHECK(r.dispatch.kept[1] == std::min<std::int64_t>(T, r.dispatch.capacity));
    const auto st = reference::compute_stats(
        r.dispatch, reference::layout(c, r.dispatch, layout_kind::compact));
    CHECK(st.dead_experts == 7);
    CHECK(st.max_load == T);
  }
}

TEST_CASE("edge: all-negative and extreme finite logits", "[reference][edge]") {
  const std::int64_t T = 16;
  std::vector<float> huge_neg(T * 6, -FLT_MAX), big(T * 6);
  for (std::int64_t i = 0; i < T * 6; ++i)
    big[i] = (i % 7 == 0 ? 1e30f : -1e30f) * static_cast<float>(1 + i % 3);
  for (const auto& xs : {test::make_logits(T, 6, dist::negative, 1u), huge_neg, big})
    for (const auto& [name, c] : configs(6, 2)) {
      INFO(name);
      const auto r = run(c, xs, T);
      CHECK(test::dispatch_violation(c, r.gating, r.dispatch) == "");
      for (float v : r.gating.logsumexp) CHECK(std::isfinite(v));
      CHECK(std::isfinite(r.losses.aux.value));
      CHECK(r.gating.nonfinite_logits == 0);
    }
  // all -FLT_MAX: a uniform tie, ids 0 and 1, softmax 1/6 each
  const auto r = reference::route<float>(presets::seed_reference(6, 2), huge_neg, T);
  CHECK(r.gating.ids[0] == 0);
  CHECK(r.gating.ids[1] == 1);
  CHECK(r.gating.gates[0] == 0.5f);
}

TEST_CASE("edge: rows with NaN and +-Inf route to valid, distinct ids with finite gates",
          "[reference][edge][nonfinite]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  const std::int32_t E = 6;
  // one row per pattern
  const std::vector<std::vector<float>> rows = {
      {nan, nan, nan, nan, nan, nan}, {1, nan, 2, nan, 3, 0},
      {0, 0, 0, inf, 0, 0},           {inf, 1, inf, 2, inf, 3},
      {-inf, -inf, 0, -inf, 1, -inf}, {-inf, -inf, -inf, -inf, -inf, -inf},
      {inf, inf, inf, inf, inf, inf}, {nan, inf, -inf, nan, inf, -inf},
      {0.5f, -1, 2, 0, 1, -2},
  };
  std::vector<float> x;
  for (const auto& row : rows) x.insert(x.end(), row.begin(), row.end());
  const std::int64_t T = static_cast<std::int64_t>(rows.size());
  for (std::int32_t k : {1, 2, 6})
    for (const auto& [name, c] : configs(E, k)) {
      INFO(name << " k " << k);
      const auto r = run(c, x, T);
      REQUIRE(test::dispatch_violation(c, r.gating, r.dispatch) ==
              "");  // ids valid, distinct, gates finite
      CHECK(r.gating.nonfinite_logits == 6 + 2 + 1 + 3 + 4 + 6 + 6 + 6);
      for (float w : r.dispatch.weight) CHECK(std::isfinite(w));
      for (double s : r.losses.aux.score_sum) CHECK(std::isfinite(s));
      CHECK(std::isfinite(r.losses.aux.value));
    }
  // the documented treatment (NaN -> -FLT_MAX, +-Inf -> +-FLT_MAX)
  routing_config c;
  c.num_experts = E;
  c.top_k = 2;
  c.gating.select = select_from::scores;
  const auto g = reference::gating(c, x, T);
  CHECK(g.ids[0] == 0);  // all NaN: a tie, lowest indices, uniform gates
  CHECK(g.ids[1] == 1);
  CHECK_THAT(g.gates[0], WithinRel(1.0 / 6.0, 1e-6));
  CHECK(g.ids[2] == 4);  // NaN loses to every number
  CHECK(g.ids[3] == 2);
  CHECK(g.ids[4] == 3);  // +Inf wins with probability 1
  CHECK(g.gates[4] == 1.0f);
  CHECK(g.gates[5] == 0.0f);
  CHECK(g.ids[6] == 0);  // three +Inf tie: lowest two, a third each
  CHECK(g.ids[7] == 2);
  CHECK_THAT(g.gates[6], WithinRel(1.0 / 3.0, 1e-6));
  CHECK(g.ids[8] == 4);  // -Inf loses to finite values
  CHECK(g.ids[9] == 2);
  CHECK(g.ids[14] == 1);  // NaN < -Inf? both -FLT_MAX: +Inf at 1 and 4 first
  CHECK(g.ids[15] == 4);
}

TEST_CASE("edge: fp16 and bf16 logits route exactly like the fp32 values they round to",
          "[reference][edge][dtype]") {
  const std::int64_t T = 64;
  for (dist dd : test::all_dists)
    for (const auto& [name, c] : configs(8, 2)) {
      INFO(name << " dist " << test::name(dd));
      auto x = test::make_logits(T, 8, dd, 21u);
      if (dd == dist::normal) {  // include non-finite and out-of-fp16-range values
        x[3] = std::numeric_limits<float>::quiet_NaN();
        x[17] = std::numeric_limits<float>::infinity();
        x[40] = 1e6f;    // overflows fp16 to +inf
        x[41] = -1e-9f;  // fp16 subnormal / zero
      }
      std::vector<half_bits> h(x.size());
      std::vector<bf16_bits> b(x.size());
      std::vector<float> xh(x.size()), xb(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        h[i] = to_half(x[i]);
        b[i] = to_bf16(x[i]);
        xh[i] = to_float(h[i]);
        xb[i] = to_float(b[i]);
      }
      std::vector<float> bias;
      if (c.gating.expert_bias) bias.assign(8, 0.02f);
      const auto rh = reference::route<half_bits>(c, h, T, bias);
      const auto rb = reference::route<bf16_bits>(c, b, T, bias);
      const auto fh = reference::route<float>(c, xh, T, bias);
      const auto fb = reference::route<float>(c, xb, T, bias);
      CHECK(rh.gating.ids == fh.gating.ids);
      CHECK(rh.gating.gates == fh.gating.gates);  // bitwise
      CHECK(rh.dispatch.slot == fh.dispatch.slot);
      CHECK(rh.dispatch.weight == fh.dispatch.weight);
      CHECK(rh.losses.aux.value == fh.losses.aux.value);
      CHECK(rh.losses.z.value == fh.losses.z.value);
      CHECK(rb.gating.ids == fb.gating.ids);
      CHECK(rb.gating.gates == fb.gating.gates);
      CHECK(rb.dispatch.slot == fb.dispatch.slot);
      CHECK(rb.dispatch.weight == fb.dispatch.weight);
      CHECK(rb.losses.aux.value == fb.losses.aux.value);
      CHECK(rb.losses.z.value == fb.losses.z.value);
    }
  // the conversions themselves on known values
  CHECK(to_float(to_half(1.0f)) == 1.0f);
  CHECK(to_half(1.0f).bits == 0x3C00);
  CHECK(to_half(-2.0f).bits == 0xC000);
  CHECK(to_half(65504.0f).bits == 0x7BFF);
  CHECK(to_half(1e6f).bits == 0x7C00);
  CHECK(to_float(half_bits{0x0001}) == std::ldexp(1.0f, -24));
  CHECK(to_bf16(1.0f).bits == 0x3F80);
  CHECK(to_float(to_bf16(3.0f)) == 3.0f);
  CHECK(to_bf16(1.00390625f).bits == 0x3F80);  // halfway: round to even
  CHECK(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(to_float(to_half(std::numeric_limits<float>::quiet_NaN()))));
}
