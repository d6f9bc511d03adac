// SPDX-License-Identifier: Apache-2.0
// Hand-worked cases from the design notes (seed 004) and docs/numerics.md: the seed's token
// loop written out on a small batch, capacity examples, aux loss and z-loss computed by hand.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <moeroute/config_fields.hpp>
#include <moeroute/reference.hpp>
#include <vector>

using namespace moeroute;
using Catch::Matchers::WithinRel;

namespace {

// Six tokens over three experts, written so the top-2 of each row is obvious.
//   t0 [3 2 0] -> (0, 1)   t1 [3 0 2] -> (0, 2)   t2 [2 3 0] -> (1, 0)
//   t3 [3 2 0] -> (0, 1)   t4 [0 1 3] -> (2, 1)   t5 [0 0 5] -> (2, 0)  (tie 0/0: lower index)
const std::vector<float> six_tokens = {3, 2, 0, 3, 0, 2, 2, 3, 0, 3, 2, 0, 0, 1, 3, 0, 0, 5};
constexpr std::int64_t six_T = 6;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

TEST_CASE("hand-worked: the seed's token loop on six tokens", "[reference][hand]") {
  // moe_route(k=2, capacity_factor=1.0): capacity = int(1.0 * 6 / 3) = 2, then
  //   t0: e0 -> 1, e1 -> 1          t1: e0 -> 2, e2 -> 1
  //   t2: e1 -> 2, e0 full (drop)   t3: e0 full, e1 full  -> not dispatched
  //   t4: e2 -> 2, e1 full (drop)   t5: e2 full, e0 full  -> not dispatched
  const auto cfg = presets::seed_reference(3, 2, 1.0);
  const auto r = reference::route<float>(cfg, six_tokens, six_T);
  const auto& g = r.gating;
  const auto& d = r.dispatch;
  CHECK(d.capacity == 2);
  CHECK(g.ids == std::vector<std::int32_t>{0, 1, 0, 2, 1, 0, 0, 1, 2, 1, 2, 0});
  CHECK(d.kept == std::vector<std::int64_t>{2, 2, 2});  // counts
  CHECK(d.requested == std::vector<std::int64_t>{5, 4, 3});
  using F = fate;
  CHECK(d.fates == std::vector<F>{F::kept, F::kept, F::kept, F::kept, F::kept, F::dropped,
                                  F::dropped, F::dropped, F::kept, F::dropped, F::dropped,
                                  F::dropped});
  CHECK(d.slot == std::vector<std::int32_t>{0, 0, 1, 0, 1, -1, -1, -1, 1, -1, -1, -1});
  // dispatched = [T, T, T, F, T, F]
  const auto st = reference::compute_stats(d, reference::layout(cfg, d, layout_kind::padded));
  CHECK(st.fully_dropped_tokens == 2);
  CHECK(st.dropped == 6);
  CHECK(st.drop_rate == 0.5);
  // topk_vals / topk_vals.sum(): t0 = (e^3, e^2) / (e^3 + e^2) = (sigmoid(1), sigmoid(-1))
  CHECK_THAT(g.gates[0], WithinRel(sigmoid(1.0), 1e-6));
  CHECK_THAT(g.gates[1], WithinRel(sigmoid(-1.0), 1e-6));
  CHECK_THAT(g.gates[8], WithinRel(sigmoid(2.0), 1e-6));   // t4: (e^3, e^1)
  CHECK_THAT(g.gates[10], WithinRel(sigmoid(5.0), 1e-6));  // t5: (e^5, e^0), tie -> e0
  // the seed returns the renormalised gates unchanged; the combine weight of a kept
  // assignment is that gate, of a dropped one 0
  CHECK(d.weight[0] == g.gates[0]);
  CHECK(d.weight[5] == 0.0f);

  // load_balancing_loss(alpha): f from top-1 = (3, 1, 2) / 6, P = mean softmax
  double P[3] = {0, 0, 0};
  for (int t = 0; t < 6; ++t) {
    double z = 0;
    for (int e = 0; e < 3; ++e) z += std::exp(six_tokens[t * 3 + e]);
    for (int e = 0; e < 3; ++e) P[e] += std::exp(six_tokens[t * 3 + e]) / z / 6.0;
  }
  const double want = 3.0 * (3.0 / 6 * P[0] + 1.0 / 6 * P[1] + 2.0 / 6 * P[2]);
  CHECK_THAT(r.losses.aux.value, WithinRel(want, 1e-6));
  CHECK(r.losses.aux.counts == std::vector<std::int64_t>{3, 1, 2});

  // residual: the two undispatched tokens pass through, the others get sum w * expert(x)
  const auto L = reference::layout(cfg, d, layout_kind::padded);
  const std::int64_t dm = 2;
  std::vector<float> x(six_T * dm);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i + 1);
  std::vector<float> rows(L.num_rows * dm), y(six_T * dm);
  reference::permute<float>(cfg, L, x, six_T, dm, rows);
  reference::combine<float>(cfg, L, d, rows, dm, x, y);  // identity experts
  for (std::int64_t c = 0; c < dm; ++c) {
    CHECK(y[3 * dm + c] == x[3 * dm + c]);
    CHECK(y[5 * dm + c] == x[5 * dm + c]);
    CHECK_THAT(y[0 * dm + c],
               WithinRel(static_cast<double>(x[0 * dm + c]), 1e-6));  // both kept: weights sum to 1
    CHECK_THAT(y[2 * dm + c],
               WithinRel(static_cast<double>(x[2 * dm + c] * g.gates[4]), 1e-6));  // only e1 kept
  }
}

TEST_CASE("hand-worked: choice-major (GShard top-2) on the same six tokens", "[reference][hand]") {
  // first choices in token order: e0 <- t0, t1 (t3 dropped); e1 <- t2; e2 <- t4, t5
  // then second choices: t0 -> e1 (slot 1); t1 -> e2 full; t2 -> e0 full; t3 -> e1 full;
  // t4 -> e1 full; t5 -> e0 full.  Only t3 is fully dropped.
  auto cfg = presets::seed_reference(3, 2, 1.0);
  cfg.dispatch.prio = priority::choice_major;
  const auto r = reference::route<float>(cfg, six_tokens, six_T);
  const auto& d = r.dispatch;
  CHECK(d.capacity == 2);
  CHECK(d.expert == std::vector<std::int32_t>{0, 1, 0, -1, 1, -1, -1, -1, 2, -1, 2, -1});
  CHECK(d.slot == std::vector<std::int32_t>{0, 1, 1, -1, 0, -1, -1, -1, 0, -1, 1, -1});
  CHECK(d.kept == std::vector<std::int64_t>{2, 2, 2});
  CHECK(d.total_dropped == 6);
  // slot_order::token_index renumbers e1: t0 before t2
  cfg.dispatch.slots = slot_order::token_index;
  const auto r2 = reference::route<float>(cfg, six_tokens, six_T);
  CHECK(r2.dispatch.slot == std::vector<std::int32_t>{0, 0, 1, -1, 1, -1, -1, -1, 0, -1, 1, -1});
}

TEST_CASE("hand-worked: capacity examples", "[reference][hand][capacity]") {
  // seed: int(cf * T / E)
  CHECK(expert_capacity(presets::seed_reference(3, 2, 1.0), 6) == 2);
  CHECK(expert_capacity(presets::seed_reference(4, 1, 1.25), 10) == 3);  // 3.125 -> 3
  // DeepSpeed top-k: ceil((T / E) * cf * k), min 4
  CHECK(expert_capacity(presets::deepspeed_topk(4, 1, 1.25), 10) == 4);  // ceil(3.125) = 4
  CHECK(expert_capacity(presets::deepspeed_topk(4, 2, 1.25), 10) == 7);  // ceil(6.25)
  CHECK(expert_capacity(presets::deepspeed_topk(16, 1, 0.5), 16) == 4);  // 0.5 -> min 4
  CHECK(expert_capacity(presets::deepspeed_topk(16, 1, 0.5, 0), 16) == 1);
  // Megatron: ceil((T * k / E) * cf), no minimum
  presets::megatron_options o;
  o.capacity_factor = 1.0;
  CHECK(expert_capacity(presets::megatron(4, 2, o), 16) == 8);
  o.capacity_factor = 0.5;
  CHECK(expert_capacity(presets::megatron(8, 1, o), 64) == 4);
  o.capacity_factor = 1.1;
  CHECK(expert_capacity(presets::megatron(8, 2, o), 100) == 28);  // ceil(27.5)
  // dropless presets have no capacity
  CHECK(expert_capacity(presets::mixtral(), 1000) == unbounded_capacity);
  CHECK(expert_capacity(presets::megatron(8, 2), 1000) == unbounded_capacity);
  // min_capacity, clamp and the eval factor: capacity_test.cpp
}

TEST_CASE("hand-worked: a uniform router gives aux loss exactly alpha (normalized)",
          "[reference][hand][loss]") {
  const float alpha = 0.01f;
  for (auto counts : {aux_counts::top1, aux_counts::all_k}) {
    for (auto score : {score_function::softmax, score_function::sigmoid}) {
      routing_config c;
      c.num_experts = 8;
      c.top_k = 2;
      c.gating.score = score;
      c.gating.select = select_from::scores;
      c.loss.counts = counts;
      c.loss.scale = aux_scale::normalized;
      c.loss.aux_coefficient = alpha;
      const std::vector<float> x(16 * 8, 0.25f);  // every probability is exactly 1/8
      const auto r = reference::route<float>(c, x, 16);
      INFO("counts " << static_cast<int>(counts) << " score " << static_cast<int>(score));
      CHECK(r.losses.aux.value ==
            static_cast<double>(alpha));  // exactly: all terms are powers of 2
      // any f works: P is uniform, so sum_i f_i P_i = counted / E
      CHECK(r.losses.aux.scale == (counts == aux_counts::top1 ? 8.0 : 4.0));

      // E = 6 (P = 1/6 is not exact): within a few ulps
      c.num_experts = 6;
      const std::vector<float> x6(10 * 6, -1.5f);
      const auto r6 = reference::route<float>(c, x6, 10);
      CHECK_THAT(r6.losses.aux.value, WithinRel(static_cast<double>(alpha), 1e-6));
    }
  }
  // the peers' own scalings of the same uniform router: E*sum -> k for all_k; E/k*sum -> 1
  auto c = presets::megatron(8, 2);
  c.loss.aux_coefficient = 1.0f;
  const std::vector<float> x(16 * 8, 0.0f);
  CHECK(reference::route<float>(c, x, 16).losses.aux.value == 1.0);
  c.loss.scale = aux_scale::e_times_sum;
  CHECK(reference::route<float>(c, x, 16).losses.aux.value == 2.0);
}

TEST_CASE("hand-worked: aux loss and sequence aux loss on four tokens", "[reference][hand][loss]") {
  // p = (1/4, 3/4) for rows [0, ln 3], (3/4, 1/4) for [ln 3, 0]; top-1 follows the larger.
  const float l3 = static_cast<float>(std::log(3.0));
  const std::vector<float> x = {0, l3, l3, 0, 0, l3, 0, l3};
  auto c = parse_config(
      "num_experts=2 top_k=1 capacity.mode=unbounded loss.counts=top1 loss.scale=e_times_sum "
      "loss.aux_coefficient=1");
  // f = (1/4, 3/4), P = (3/8, 5/8): sum f P = 3/32 + 15/32 = 9/16; E * 9/16 = 9/8
  auto r = reference::route<float>(c, x, 4);
  CHECK_THAT(r.losses.aux.value, WithinRel(1.125, 1e-6));
  CHECK(r.losses.aux.counts == std::vector<std::int64_t>{1, 3});
  CHECK_THAT(r.losses.aux.score_sum[0], WithinRel(1.5, 1e-6));
  // sequences of 2: (f, P) = ((1/2, 1/2), (1/2, 1/2)) -> 1; ((0, 1), (1/4, 3/4)) -> 1.5
  c.loss.sequence_length = 2;
  r = reference::route<float>(c, x, 4);
  CHECK_THAT(r.losses.sequence_aux, WithinRel(1.25, 1e-6));
  // a valid mask: token 1 is padding -> f = (0, 1), P = (1/4, 3/4) -> 2 * 3/4
  c.loss.sequence_length = 0;
  const std::vector<std::uint8_t> valid = {1, 0, 1, 1};
  r = reference::route<float>(c, x, 4, {}, valid);
  CHECK(r.losses.aux.tokens == 3);
  CHECK_THAT(r.losses.aux.value, WithinRel(1.5, 1e-6));
  // sharded: sums of two halves give the global loss exactly
  c.loss.sequence_length = 0;
  const auto full = reference::route<float>(c, x, 4);
  const std::vector<float> a(x.begin(), x.begin() + 4), b(x.begin() + 4, x.end());
  const auto ra = reference::route<float>(c, a, 2), rb = reference::route<float>(c, b, 2);
  std::vector<double> ss(2);
  std::vector<std::int64_t> cc(2);
  for (int e = 0; e < 2; ++e) {
    ss[e] = ra.losses.aux.score_sum[e] + rb.losses.aux.score_sum[e];
    cc[e] = ra.losses.aux.counts[e] + rb.losses.aux.counts[e];
  }
  CHECK_THAT(reference::aux_loss_from_sums(c, ss, cc, 4), WithinRel(full.losses.aux.value, 1e-12));
  CHECK((ra.losses.aux.value + rb.losses.aux.value) / 2 !=
        full.losses.aux.value);  // why the sums are returned
}

TEST_CASE("hand-worked: z-loss on known logits", "[reference][hand][loss]") {
  // row 0 [0 0 0 0]: lse = ln 4;  row 1 [1 3]-like: [1, 3, -inf-ish]: use [1 3 1 3]
  //   lse = 3 + ln(2 + 2 e^-2);  row 2 [-2 -2 -2 -2]: lse = -2 + ln 4
  const std::vector<float> x = {0, 0, 0, 0, 1, 3, 1, 3, -2, -2, -2, -2};
  routing_config c;
  c.num_experts = 4;
  c.top_k = 1;
  c.loss.z_coefficient = 0.001f;
  const auto r = reference::route<float>(c, x, 3);
  const double l0 = std::log(4.0), l1 = 3.0 + std::log(2.0 + 2.0 * std::exp(-2.0)),
               l2 = -2.0 + std::log(4.0);
  CHECK_THAT(r.gating.logsumexp[0], WithinRel(l0, 1e-6));
  CHECK_THAT(r.gating.logsumexp[1], WithinRel(l1, 1e-6));
  CHECK_THAT(r.gating.logsumexp[2], WithinRel(l2, 1e-6));
  const double want = (l0 * l0 + l1 * l1 + l2 * l2) / 3.0;
  CHECK_THAT(r.losses.z.value, WithinRel(static_cast<double>(0.001f) * want, 1e-6));
  CHECK_THAT(r.losses.z.sum_squares, WithinRel(l0 * l0 + l1 * l1 + l2 * l2, 1e-6));
  CHECK(r.losses.z.tokens == 3);
  // padding tokens count nowhere
  const std::vector<std::uint8_t> valid = {0, 1, 0};
  const auto rv = reference::route<float>(c, x, 3, {}, valid);
  CHECK_THAT(rv.losses.z.value, WithinRel(static_cast<double>(0.001f) * l1 * l1, 1e-6));
  // no valid token: 0, not NaN
  const auto r0 = reference::route<float>(c, x, 3, {}, std::vector<std::uint8_t>{0, 0, 0});
  CHECK(r0.losses.z.value == 0.0);
  CHECK(r0.losses.aux.value == 0.0);
}

TEST_CASE("hand-worked: gating formulas (sigmoid, bias, groups, scaling, after-top-k softmax)",
          "[reference][hand]") {
  // one token, E = 4: logits [0, 1, 2, 3]
  const std::vector<float> x = {0, 1, 2, 3};
  SECTION("softmax after top-k (Mixtral): softmax over the two chosen logits") {
    const auto c = presets::mixtral(4, 2);
    const auto g = reference::gating(c, x, 1);
    CHECK(g.ids == std::vector<std::int32_t>{3, 2});
    CHECK_THAT(g.gates[0], WithinRel(sigmoid(1.0), 1e-6));
    CHECK_THAT(g.gates[1], WithinRel(sigmoid(-1.0), 1e-6));
  }
  SECTION("sigmoid, bias for selection only, renormalised, scaled") {
    auto c = presets::deepseek_v3(4, 2, 2, 1);                 // 2 groups of 2, pick 1 group
    const std::vector<float> bias = {1.0f, 1.0f, 0.0f, 0.0f};  // group 0 wins on biased scores
    const auto g = reference::gating(c, x, 1, bias);
    // biased: (1.5, 1.731, 0.881, 0.953): group 0 = 3.23 > group 1 = 1.83 -> experts {1, 0}
    CHECK(g.ids == std::vector<std::int32_t>{1, 0});
    const double s0 = sigmoid(0.0), s1 = sigmoid(1.0);  // gates use the unbiased scores
    CHECK_THAT(g.gates[0], WithinRel(2.5 * s1 / (s0 + s1), 1e-6));
    CHECK_THAT(g.gates[1], WithinRel(2.5 * s0 / (s0 + s1), 1e-6));
  }
  SECTION("group score is the sum of the group's top-(k/group_topk)") {
    routing_config c;
    c.num_experts = 6;
    c.top_k = 2;
    c.gating.select = select_from::logits;
    c.gating.group_limit = {3, 1};  // groups {0,1} {2,3} {4,5}; one group, its top-2
    // group sums: 5+0=5, 4+4=8, 6-9=-3: group 1 wins although expert 4 has the largest logit
    const std::vector<float> y = {5, 0, 4, 4, 6, -9};
    const auto g = reference::gating(c, y, 1);
    CHECK(g.ids == std::vector<std::int32_t>{2, 3});
  }
  SECTION("sqrt-softplus") {
    routing_config c;
    c.num_experts = 4;
    c.top_k = 1;
    c.gating.score = score_function::sqrt_softplus;
    c.gating.select = select_from::scores;
    const auto g = reference::gating(c, x, 1);
    CHECK(g.ids[0] == 3);
    CHECK_THAT(g.gates[0], WithinRel(std::sqrt(std::log1p(std::exp(3.0))), 1e-6));
  }
  SECTION("after-drop renormalisation with a scaling factor") {
    auto c = presets::deepspeed_topk(4, 2, 1.0, 0);
    c.gating.scaling_factor = 2.0f;
    c.capacity.mode = capacity_mode::fixed;
    c.capacity.fixed = 1;
    // two identical tokens: the second loses both slots; the first keeps both
    const std::vector<float> xx = {0, 1, 2, 3, 0, 1, 2, 3};
    const auto r = reference::route<float>(c, xx, 2);
    const double p3 = std::exp(3.0), p2 = std::exp(2.0);
    CHECK_THAT(r.dispatch.weight[0], WithinRel(2.0 * p3 / (p3 + p2), 1e-6));
    CHECK_THAT(r.dispatch.weight[1], WithinRel(2.0 * p2 / (p3 + p2), 1e-6));
    CHECK(r.dispatch.weight[2] == 0.0f);
    CHECK(r.dispatch.weight[3] == 0.0f);
  }
}
