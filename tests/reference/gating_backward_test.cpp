// SPDX-License-Identifier: Apache-2.0
// Reference gating backward (routing_backward, and gating_backward as a whole) against central
// finite differences (tests/common/finite_difference.hpp). Routing decisions must not flip
// within a step: every perturbed real forward must reproduce the base ids and fates exactly
// (REQUIREd), which the well-separated logits guarantee.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include "../common/finite_difference.hpp"

using namespace moeroute;
using namespace moeroute::test;
namespace ref = moeroute::reference;

namespace {

struct gating_case {
  std::string name;
  routing_config cfg;
  std::int64_t T = 0;
  std::vector<float> logits;
  std::vector<float> bias;
  std::vector<std::uint8_t> valid;
};

/// Both finite-difference checks of routing_backward for one case; returns the forward.
fd_stats check_gating_case(const gating_case& c, std::uint32_t seed) {
  INFO("case " << c.name);
  const auto& cfg = c.cfg;
  const auto g = ref::gating(cfg, c.logits, c.T, c.bias, c.valid);
  const auto dsp = ref::dispatch(cfg, g);
  const std::int64_t TE = c.T * cfg.num_experts;
  const auto u = upstream(c.T * cfg.top_k, seed);
  const auto x = to_double(c.logits);

  // the double forward is the real forward, in double
  const auto w0 = weights_double(cfg, x, g, dsp);
  for (std::size_t a = 0; a < w0.size(); ++a) {
    INFO("weight " << a << ": double " << w0[a] << ", real " << dsp.weight[a]);
    REQUIRE(std::fabs(w0[a] - dsp.weight[a]) <= 1e-6 * std::fabs(w0[a]) + 1e-12);
  }

  std::vector<double> an(TE, 0.0);
  ref::routing_backward<double>(cfg, x, g, dsp, u, an);
  const auto st = check_fd_double(
      [&](const std::vector<double>& xs) { return dot(u, weights_double(cfg, xs, g, dsp)); }, x,
      an);

  // the float backward agrees with the double one
  std::vector<float> an_f(TE, 0.0f), u_f(u.begin(), u.end());
  ref::routing_backward(cfg, c.logits, g, dsp, u_f, an_f);
  for (std::int64_t i = 0; i < TE; ++i)
    REQUIRE(std::fabs(an_f[i] - an[i]) <= 1e-6 * std::fabs(an[i]) + 1e-7);

  check_fd_float(
      [&](const std::vector<float>& xs) {
        ref::gating_output gp;
        ref::dispatch_output dp;
        require_same_decisions(cfg, xs, c.T, c.bias, c.valid, g, dsp, &gp, &dp);
        return dot(u, dp.weight);
      },
      c.logits, an);
  return st;
}

gating_case make_case(std::string name, routing_config cfg, std::int64_t T, std::uint32_t seed,
                      float sep = 0.4f) {
  gating_case c;
  c.name = std::move(name);
  c.cfg = cfg;
  c.T = T;
  c.logits = separated_logits(T, cfg.num_experts, seed, sep);
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("backward: gating gradient matches finite differences for every score function",
          "[backward][gating]") {
  std::vector<gating_case> cases;
  {
    auto c = plain(6, 2);
    cases.push_back(make_case("softmax over all, no renorm, top-2 on logits", c, 9, 11));
    c.gating.renorm = renormalize::before_drop;
    c.gating.scaling_factor = 1.7f;
    cases.push_back(make_case("softmax over all, renorm before drop, scaling 1.7", c, 9, 12));
    c.gating.select = select_from::scores;
    c.gating.renorm_epsilon = 0.05f;
    cases.push_back(make_case("softmax over all, before drop + epsilon 0.05, on scores", c, 7, 13));
  }
  cases.push_back(make_case("softmax over the k chosen (Mixtral), E = 7, k = 3",
                            presets::mixtral(7, 3), 8, 14));
  {
    auto c = presets::mixtral(5, 2);
    c.gating.scaling_factor = 0.6f;
    cases.push_back(make_case("softmax over the k chosen, scaling 0.6", c, 6, 15));
  }
  // the per-expert score functions, with and without renormalisation (T = 8)
  struct per_expert {
    const char* name;
    std::int32_t k;
    const char* fields;  // on top of plain(6, k)
  };
  const per_expert scores[] = {
      {"sigmoid, top-1, no renorm", 1, "gating.score=sigmoid gating.select=scores"},
      {"sigmoid, top-3, renorm before drop (+1e-20)", 3,
       "gating.score=sigmoid gating.select=scores gating.renorm=before_drop "
       "gating.renorm_epsilon=1e-20"},
      {"sqrt-softplus, top-2, no renorm", 2, "gating.score=sqrt_softplus gating.select=scores"},
      {"sqrt-softplus, top-3, renorm before drop, scaling 2", 3,
       "gating.score=sqrt_softplus gating.select=scores gating.renorm=before_drop "
       "gating.scaling_factor=2"}};
  std::uint32_t seed = 16;
  for (const per_expert& e : scores)
    cases.push_back(make_case(e.name, plain(6, e.k, e.fields), 8, seed++));
  {
    auto c = make_case("DeepSeek-V3 style: sigmoid, bias, groups, renorm, scaling 2.5",
                       presets::deepseek_v3(8, 4, 4, 2), 10, 20);
    c.bias = {0.05f, -0.03f, 0.2f, 0.0f, -0.1f, 0.12f, 0.01f, -0.2f};
    cases.push_back(c);
  }
  {
    auto c = plain(4, 4);
    c.gating.renorm = renormalize::before_drop;
    cases.push_back(
        make_case("k = E, renorm before drop (gradient 0 in exact arithmetic)", c, 5, 21));
  }
  fd_stats total;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto st = check_gating_case(cases[i], 100 + static_cast<std::uint32_t>(i));
    total.checked += st.checked;
    total.nonzero += st.nonzero;
    total.worst_rel = std::max(total.worst_rel, st.worst_rel);
  }
  CHECK(total.nonzero > total.checked / 2);  // the checks compare real, non-zero gradients
  CHECK(total.worst_rel <= fd_rel);
}

TEST_CASE("backward: gating gradient through capacity drops and every drop policy",
          "[backward][gating][dispatch]") {
  // DeepSpeed top-2: choice-major, renormalise over the survivors (after drop)
  auto ds = presets::deepspeed_top2(4, 0.5, 1);
  auto c1 = make_case("after drop (DeepSpeed top-2), capacity 0.5", ds, 12, 30);
  {
    const auto g = ref::gating(ds, c1.logits, c1.T);
    const auto d = ref::dispatch(ds, g);
    std::int64_t one = 0, none = 0;
    for (std::int64_t t = 0; t < c1.T; ++t) {
      const int alive = (d.fates[t * 2] == fate::kept) + (d.fates[t * 2 + 1] == fate::kept);
      one += alive == 1;
      none += alive == 0;
    }
    REQUIRE(one > 0);   // the renormalisation over one survivor
    REQUIRE(none > 0);  // all dropped: weight 0, no gradient
  }
  check_gating_case(c1, 31);

  // after drop with the FLT_EPSILON clamp active: sigmoid gates ~1e-8 on half the tokens
  {
    auto c = plain(5, 2);
    c.gating.score = score_function::sigmoid;
    c.gating.select = select_from::scores;
    c.gating.renorm = renormalize::after_drop;
    c.gating.scaling_factor = 1.5f;
    auto gc = make_case("after drop, FLT_EPSILON clamp", c, 8, 32, 0.5f);
    for (std::int64_t t = 0; t < gc.T; t += 2)
      for (std::int32_t e = 0; e < 5; ++e) gc.logits[t * 5 + e] -= 19.0f;
    const auto g = ref::gating(c, gc.logits, gc.T);
    REQUIRE(g.gates[0] + g.gates[1] < FLT_EPSILON);  // token 0: clamped
    REQUIRE(g.gates[2] + g.gates[3] > FLT_EPSILON);  // token 1: not
    check_gating_case(gc, 33);
  }
  // Megatron "probs" priority (score per expert) with capacity and softmax after top-k
  {
    presets::megatron_options o;
    o.capacity_factor = 0.75;
    auto c = make_case("Megatron top-2, probs priority, capacity 0.75", presets::megatron(4, 2, o),
                       12, 34);
    c.logits = distinct_gap_logits(12, 4, 34);
    const auto d = ref::dispatch(c.cfg, ref::gating(c.cfg, c.logits, 12));
    REQUIRE(d.total_dropped > 0);
    check_gating_case(c, 35);
  }
  // residual: fully dropped tokens pass x through, their gates get nothing
  check_gating_case(
      make_case("Switch top-1, residual, capacity 0.5", presets::switch_top1(4, 0.5, 1), 12, 36),
      37);
  // fallback to a routed expert and to a dedicated one: rerouted weights keep their gates
  {
    auto c = presets::deepspeed_top2(4, 0.5, 1);
    c.dispatch.dropped = drop_policy::fallback;
    c.dispatch.fallback.expert = 0;
    check_gating_case(make_case("fallback to routed expert 0, after drop", c, 12, 38), 39);
    c.dispatch.fallback.expert = -1;
    c.dispatch.fallback.capacity = 3;
    c.gating.renorm = renormalize::before_drop;
    check_gating_case(make_case("dedicated fallback, before drop", c, 12, 40), 41);
  }
  {
    auto c = presets::seed_reference(6, 2, 0.5);
    c.dispatch.dropped = drop_policy::next_choice;
    c.dispatch.reroute.max_candidates = 2;
    check_gating_case(make_case("next choice, token-major", c, 12, 42), 43);
  }
  // padding tokens (valid = 0) pass no gradient
  {
    auto c = make_case("valid mask", presets::deepspeed_top2(4, 1.0, 1), 8, 44);
    c.valid = {1, 0, 1, 1, 0, 1, 1, 1};
    check_gating_case(c, 45);
    const auto g = ref::gating(c.cfg, c.logits, c.T, {}, c.valid);
    const auto d = ref::dispatch(c.cfg, g);
    std::vector<float> dw(c.T * 2, 1.0f), dl(c.T * 4, 0.0f);
    ref::routing_backward(c.cfg, c.logits, g, d, dw, dl);
    for (std::int32_t e = 0; e < 4; ++e) CHECK(dl[1 * 4 + e] == 0.0f);
  }
}

TEST_CASE("backward: noise is a constant, gates from noisy logits pass the gradient to x",
          "[backward][gating][noise]") {
  auto c = plain(6, 2);
  c.gating.renorm = renormalize::before_drop;
  c.gating.noise.kind = noise_kind::gaussian;
  c.gating.noise.scale = 0.05f;
  c.gating.noise.seed = 7;
  c.gating.noise.target = noise_target::selection_and_gates;
  check_gating_case(make_case("gaussian, selection and gates", c, 8, 50, 0.6f), 51);
  c.gating.noise.kind = noise_kind::gumbel;
  c.gating.noise.scale = 0.02f;
  c.gating.stage = softmax_stage::after_topk;
  check_gating_case(make_case("gumbel, selection and gates, softmax after top-k", c, 8, 52, 0.6f),
                    53);
  c.gating.noise.kind = noise_kind::gaussian;
  c.gating.noise.target = noise_target::selection_only;
  c.gating.stage = softmax_stage::before_topk;
  check_gating_case(make_case("gaussian, selection only (gates from clean logits)", c, 8, 54, 0.6f),
                    55);
}

TEST_CASE("backward: expert bias, ids and dropped assignments get no gradient",
          "[backward][gating]") {
  auto c = presets::deepseek_v3(8, 2, 4, 2);
  auto gc = make_case("bias", c, 6, 60);
  std::vector<float> bias(8, 0.0f);
  const auto g0 = ref::gating(c, gc.logits, gc.T, bias);
  const auto d0 = ref::dispatch(c, g0);
  std::vector<float> dw(gc.T * 2), dl(gc.T * 8, 0.0f);
  for (std::size_t i = 0; i < dw.size(); ++i) dw[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;
  ref::routing_backward(c, gc.logits, g0, d0, dw, dl);
  // with the ids unchanged, the bias value does not enter the gradient
  bias = {0.01f, -0.01f, 0.02f, 0.0f, -0.02f, 0.015f, 0.0f, 0.005f};
  const auto g1 = ref::gating(c, gc.logits, gc.T, bias);
  REQUIRE(g1.ids == g0.ids);
  std::vector<float> dl1(gc.T * 8, 0.0f);
  ref::routing_backward(c, gc.logits, g1, ref::dispatch(c, g1), dw, dl1);
  CHECK(dl1 == dl);
  // an upstream gradient on dropped assignments is ignored
  auto ds = presets::deepspeed_top2(4, 0.5, 1);
  const auto x = separated_logits(10, 4, 61);
  const auto g = ref::gating(ds, x, 10);
  const auto d = ref::dispatch(ds, g);
  std::vector<float> up(20, 1.0f), up_masked(20, 1.0f);
  std::int64_t dropped = 0;
  for (std::size_t a = 0; a < up.size(); ++a)
    if (d.fates[a] == fate::dropped) {
      up[a] = 1000.0f;
      up_masked[a] = 0.0f;
      ++dropped;
    }
  REQUIRE(dropped > 0);
  std::vector<float> da(40, 0.0f), db(40, 0.0f);
  ref::routing_backward(ds, x, g, d, up, da);
  ref::routing_backward(ds, x, g, d, up_masked, db);
  CHECK(da == db);
}

TEST_CASE("backward: non-finite logits get zero gradient, the rest stays finite",
          "[backward][gating][nonfinite]") {
  auto c = plain(4, 2);
  c.gating.renorm = renormalize::before_drop;
  std::vector<float> x = {0.5f,
                          std::numeric_limits<float>::quiet_NaN(),
                          1.5f,
                          -0.5f,
                          std::numeric_limits<float>::infinity(),
                          0.0f,
                          1.0f,
                          2.0f};
  const auto g = ref::gating(c, x, 2);
  const auto d = ref::dispatch(c, g);
  std::vector<float> dw = {1.0f, -2.0f, 0.5f, 3.0f}, dl(8, 0.0f), da(8, 0.0f), dz(8, 0.0f);
  ref::routing_backward(c, x, g, d, dw, dl);
  ref::aux_loss_backward(c, x, g, da);
  ref::z_loss_backward(c, x, g, dz);
  for (const auto* v : {&dl, &da, &dz}) {
    CHECK((*v)[1] == 0.0f);
    CHECK((*v)[4] == 0.0f);
    for (float f : *v) CHECK(std::isfinite(f));
  }
  CHECK(dl[0] != 0.0f);  // row 0 still has a real gradient
}

TEST_CASE("backward: zero tokens is a no-op, wrong shapes throw", "[backward][shapes]") {
  auto c = presets::mixtral(4, 2);
  std::vector<float> none;
  const auto g = ref::gating(c, none, 0);
  const auto d = ref::dispatch(c, g);
  std::vector<float> dl;
  CHECK_NOTHROW(ref::gating_backward(c, none, g, d, none, dl));
  const auto x = separated_logits(3, 4, 70);
  const auto g3 = ref::gating(c, x, 3);
  const auto d3 = ref::dispatch(c, g3);
  std::vector<float> dw(6, 1.0f), short_dl(11, 0.0f), ok_dl(12, 0.0f), short_dw(5, 1.0f);
  CHECK_THROWS_AS(ref::routing_backward(c, x, g3, d3, dw, short_dl), moeroute::error);
  CHECK_THROWS_AS(ref::routing_backward(c, x, g3, d3, short_dw, ok_dl), moeroute::error);
  CHECK_THROWS_AS(ref::z_loss_backward(c, dw, g3, ok_dl), moeroute::error);
}
