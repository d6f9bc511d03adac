// SPDX-License-Identifier: Apache-2.0
// CPU backward reference against central finite differences.
//
// Two checks per case, so the test is both exact and honest:
//  1. double: the analytic gradient (the backward in double) against central differences
//     (h = 1e-5) of a double forward written out here. That forward is first checked against
//     the library's real (float) forward at the base point, 1e-6 relative. Tolerance:
//     |fd - analytic| <= 1e-6 * max(|fd|, |analytic|) + 1e-9.
//  2. float: central differences (h = 1e-2) of the REAL forward (reference::gate + dispatch,
//     combine, permute, the loss functions) against the analytic gradient, 2e-4 of the row's
//     largest gradient (float rounding / 2h and h^2 truncation).
// Routing decisions must not flip within a step: every perturbed real forward must reproduce
// the base ids and fates exactly (REQUIREd), which the well-separated logits guarantee.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>
#include <moeroute/reference/backward.hpp>

using namespace moeroute;
namespace ref = moeroute::reference;

namespace {

constexpr double fd_h = 1e-5;
constexpr double fd_rel = 1e-6;
constexpr double fd_abs = 1e-9;
constexpr float fd_h_float = 1e-2f;
constexpr double fd_float_tol = 2e-4;

/// Logits with every pair in a row at least `sep` apart: base + sep * (random permutation)
/// + a small jitter, rounded to float (the double copy holds the same values exactly).
std::vector<float> separated_logits(std::int64_t T, std::int32_t E, std::uint32_t seed,
                                    float sep = 0.4f, float base_spread = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> jitter(0.0f, 0.1f), base(-base_spread, base_spread);
  std::vector<float> x(T * E);
  std::vector<std::int32_t> perm(E);
  for (std::int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const float b = base(rng) - sep * static_cast<float>(E) / 2.0f;
    for (std::int32_t e = 0; e < E; ++e)
      x[t * E + e] = b + sep * static_cast<float>(perm[e]) + jitter(rng);
  }
  return x;
}

/// Logits whose top-2 gap differs from token to token (0.2 + 0.13 t), so the top-2 softmax
/// gates of different tokens stay apart and a score-per-expert priority cannot flip.
std::vector<float> distinct_gap_logits(std::int64_t T, std::int32_t E, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(T * E);
  std::vector<std::int32_t> perm(E);
  for (std::int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const float top = 1.0f, gap = 0.2f + 0.13f * static_cast<float>(t);
    x[t * E + perm[0]] = top;
    x[t * E + perm[1]] = top - gap;
    for (std::int32_t i = 2; i < E; ++i)
      x[t * E + perm[i]] = top - gap - 0.5f - 0.4f * static_cast<float>(i);
  }
  return x;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<double> upstream(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = static_cast<double>(static_cast<float>(u(rng)));  // float-representable
  return v;
}

// ---------------------------------------------------------------------------------------------
// The double forward: the combine weights as a function of the logits with the routing
// decisions (ids, fates) held fixed. Written from docs/numerics.md, independently of the
// backward.

double noise_value(const routing_config& cfg, std::int64_t t, std::int32_t e) {
  const auto& n = cfg.gating.noise;
  const auto r = rng::draw(n.seed, n.offset, rng::stream_gating_noise,
                           static_cast<std::uint64_t>(t) * cfg.num_experts + e);
  return n.kind == noise_kind::gaussian ? rng::normal(r.v[0], r.v[1]) : rng::gumbel(r.v[0]);
}

double score_of(score_function f, double x) {
  if (f == score_function::sigmoid) return 1.0 / (1.0 + std::exp(-x));
  const double sp = x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  return std::sqrt(sp);
}

std::vector<double> softmax_of(const std::vector<double>& v) {
  const double m = *std::max_element(v.begin(), v.end());
  std::vector<double> p(v.size());
  double s = 0;
  for (std::size_t i = 0; i < v.size(); ++i) s += (p[i] = std::exp(v[i] - m));
  for (auto& q : p) q /= s;
  return p;
}

std::vector<double> weights_double(const routing_config& cfg, const std::vector<double>& x,
                                   const ref::gating_output& g, const ref::dispatch_output& dsp) {
  const std::int64_t T = g.tokens;
  const std::int32_t E = g.experts, k = g.k;
  const auto& gc = cfg.gating;
  std::vector<double> w(T * k, 0.0);
  for (std::int64_t t = 0; t < T; ++t) {
    if (!g.valid[t]) continue;
    std::vector<double> xg(x.begin() + t * E, x.begin() + (t + 1) * E);
    if (cfg.noise_active() && gc.noise.target == noise_target::selection_and_gates)
      for (std::int32_t e = 0; e < E; ++e) xg[e] += static_cast<double>(gc.noise.scale) * noise_value(cfg, t, e);
    std::vector<double> gate(k);
    if (gc.score == score_function::softmax && gc.stage == softmax_stage::after_topk) {
      std::vector<double> chosen(k);
      for (std::int32_t j = 0; j < k; ++j) chosen[j] = xg[g.ids[t * k + j]];
      gate = softmax_of(chosen);
    } else {
      std::vector<double> s(E);
      if (gc.score == score_function::softmax) {
        s = softmax_of(xg);
      } else {
        for (std::int32_t e = 0; e < E; ++e) s[e] = score_of(gc.score, xg[e]);
      }
      double sum = 0;
      for (std::int32_t j = 0; j < k; ++j) sum += (gate[j] = s[g.ids[t * k + j]]);
      if (gc.renorm == renormalize::before_drop)
        for (auto& v : gate) v /= (sum + gc.renorm_epsilon);
    }
    if (gc.renorm != renormalize::after_drop)
      for (auto& v : gate) v *= gc.scaling_factor;
    double kept_sum = 0;
    auto alive = [&](std::int32_t j) {
      const fate f = dsp.fates[t * k + j];
      return f == fate::kept || f == fate::rerouted;
    };
    for (std::int32_t j = 0; j < k; ++j)
      if (alive(j)) kept_sum += gate[j];
    for (std::int32_t j = 0; j < k; ++j) {
      if (!alive(j)) continue;
      w[t * k + j] = gc.renorm == renormalize::after_drop
                         ? gate[j] / std::max(kept_sum, static_cast<double>(FLT_EPSILON)) * gc.scaling_factor
                         : gate[j];
    }
  }
  return w;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
double dot(const std::vector<double>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * static_cast<double>(b[i]);
  return s;
}

struct fd_stats {
  std::size_t checked = 0, nonzero = 0;
  double worst_rel = 0;
};

/// Double central differences of f at x against `analytic`, every element.
fd_stats check_fd_double(const std::function<double(const std::vector<double>&)>& f,
                         std::vector<double> x, const std::vector<double>& analytic) {
  fd_stats st;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + fd_h;
    const double up = f(x);
    x[i] = x0 - fd_h;
    const double dn = f(x);
    x[i] = x0;
    const double fd = (up - dn) / (2 * fd_h);
    const double an = analytic[i];
    const double err = std::fabs(fd - an);
    INFO("element " << i << ": finite difference " << fd << ", analytic " << an);
    REQUIRE(err <= fd_rel * std::max(std::fabs(fd), std::fabs(an)) + fd_abs);
    ++st.checked;
    if (std::fabs(an) > 1e-6) {
      ++st.nonzero;
      st.worst_rel = std::max(st.worst_rel, err / std::fabs(an));
    }
  }
  return st;
}

/// Float central differences (h = 1e-2) of the real forward f at x against `analytic`.
void check_fd_float(const std::function<double(const std::vector<float>&)>& f, std::vector<float> x,
                    const std::vector<double>& analytic) {
  double scale = 1.0;
  for (double a : analytic) scale = std::max(scale, std::fabs(a));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    x[i] = x0 + fd_h_float;
    const double up = f(x);
    const double h_up = static_cast<double>(x[i]) - x0;
    x[i] = x0 - fd_h_float;
    const double dn = f(x);
    const double h_dn = static_cast<double>(x0) - x[i];
    x[i] = x0;
    const double fd = (up - dn) / (h_up + h_dn);
    INFO("element " << i << ": real-forward finite difference " << fd << ", analytic " << analytic[i]);
    REQUIRE(std::fabs(fd - analytic[i]) <= fd_float_tol * scale);
  }
}

/// The routing decisions of the real forward at x equal the base ones.
void require_same_decisions(const routing_config& cfg, const std::vector<float>& x, std::int64_t T,
                            const std::vector<float>& bias, const std::vector<std::uint8_t>& valid,
                            const ref::gating_output& g0, const ref::dispatch_output& d0,
                            ref::gating_output* g_out = nullptr, ref::dispatch_output* d_out = nullptr) {
  auto g = ref::gate(cfg, x, T, bias, valid);
  auto d = ref::dispatch(cfg, g);
  INFO("a perturbation flipped a routing decision: use better separated logits");
  REQUIRE(g.ids == g0.ids);
  REQUIRE(g.aux_count == g0.aux_count);
  REQUIRE(g.seq_count == g0.seq_count);
  REQUIRE(d.fates == d0.fates);
  REQUIRE(d.expert == d0.expert);
  if (g_out) *g_out = std::move(g);
  if (d_out) *d_out = std::move(d);
}

struct gating_case {
  std::string name;
  routing_config cfg;
  std::int64_t T = 0;
  std::vector<float> logits;
  std::vector<float> bias;
  std::vector<std::uint8_t> valid;
};

/// Both finite-difference checks of gating_backward for one case; returns the forward.
fd_stats check_gating_case(const gating_case& c, std::uint32_t seed) {
  INFO("case " << c.name);
  const auto& cfg = c.cfg;
  const auto g = ref::gate(cfg, c.logits, c.T, c.bias, c.valid);
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
  ref::gating_backward<double>(cfg, x, g, dsp, u, an);
  const auto st = check_fd_double(
      [&](const std::vector<double>& xs) { return dot(u, weights_double(cfg, xs, g, dsp)); }, x, an);

  // the float backward agrees with the double one
  std::vector<float> an_f(TE, 0.0f), u_f(u.begin(), u.end());
  ref::gating_backward(cfg, c.logits, g, dsp, u_f, an_f);
  for (std::int64_t i = 0; i < TE; ++i) REQUIRE(std::fabs(an_f[i] - an[i]) <= 1e-6 * std::fabs(an[i]) + 1e-7);

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

routing_config plain(std::int32_t E, std::int32_t k) {
  routing_config c;
  c.num_experts = E;
  c.top_k = k;
  c.capacity.mode = capacity_mode::unbounded;
  c.dispatch.dropped = drop_policy::zero_weight;
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
  cases.push_back(make_case("softmax over the k chosen (Mixtral), E = 7, k = 3", presets::mixtral(7, 3), 8, 14));
  {
    auto c = presets::mixtral(5, 2);
    c.gating.scaling_factor = 0.6f;
    cases.push_back(make_case("softmax over the k chosen, scaling 0.6", c, 6, 15));
  }
  {
    auto c = plain(6, 1);
    c.gating.score = score_function::sigmoid;
    c.gating.select = select_from::scores;
    cases.push_back(make_case("sigmoid, top-1, no renorm", c, 8, 16));
    c.top_k = 3;
    c.gating.renorm = renormalize::before_drop;
    c.gating.renorm_epsilon = 1e-20f;
    cases.push_back(make_case("sigmoid, top-3, renorm before drop (+1e-20)", c, 8, 17));
  }
  {
    auto c = plain(6, 2);
    c.gating.score = score_function::sqrt_softplus;
    c.gating.select = select_from::scores;
    cases.push_back(make_case("sqrt-softplus, top-2, no renorm", c, 8, 18));
    c.top_k = 3;
    c.gating.renorm = renormalize::before_drop;
    c.gating.scaling_factor = 2.0f;
    cases.push_back(make_case("sqrt-softplus, top-3, renorm before drop, scaling 2", c, 8, 19));
  }
  {
    auto c = make_case("DeepSeek-V3 style: sigmoid, bias, groups, renorm, scaling 2.5",
                       presets::deepseek_v3(8, 4, 4, 2), 10, 20);
    c.bias = {0.05f, -0.03f, 0.2f, 0.0f, -0.1f, 0.12f, 0.01f, -0.2f};
    cases.push_back(c);
  }
  {
    auto c = plain(4, 4);
    c.gating.renorm = renormalize::before_drop;
    cases.push_back(make_case("k = E, renorm before drop (gradient 0 in exact arithmetic)", c, 5, 21));
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
    const auto g = ref::gate(ds, c1.logits, c1.T);
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
    const auto g = ref::gate(c, gc.logits, gc.T);
    REQUIRE(g.gates[0] + g.gates[1] < FLT_EPSILON);  // token 0: clamped
    REQUIRE(g.gates[2] + g.gates[3] > FLT_EPSILON);  // token 1: not
    check_gating_case(gc, 33);
  }
  // Megatron "probs" priority (score per expert) with capacity and softmax after top-k
  {
    presets::megatron_options o;
    o.capacity_factor = 0.75;
    auto c = make_case("Megatron top-2, probs priority, capacity 0.75", presets::megatron(4, 2, o), 12, 34);
    c.logits = distinct_gap_logits(12, 4, 34);
    const auto d = ref::dispatch(c.cfg, ref::gate(c.cfg, c.logits, 12));
    REQUIRE(d.total_dropped > 0);
    check_gating_case(c, 35);
  }
  // residual: fully dropped tokens pass x through, their gates get nothing
  check_gating_case(make_case("Switch top-1, residual, capacity 0.5",
                              presets::switch_top1(4, 0.5, 1), 12, 36), 37);
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
    const auto g = ref::gate(c.cfg, c.logits, c.T, {}, c.valid);
    const auto d = ref::dispatch(c.cfg, g);
    std::vector<float> dw(c.T * 2, 1.0f), dl(c.T * 4, 0.0f);
    ref::gating_backward(c.cfg, c.logits, g, d, dw, dl);
    for (std::int32_t e = 0; e < 4; ++e) CHECK(dl[1 * 4 + e] == 0.0f);
  }
}

TEST_CASE("backward: noise is a constant; gates from noisy logits pass the gradient to x",
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
  check_gating_case(make_case("gumbel, selection and gates, softmax after top-k", c, 8, 52, 0.6f), 53);
  c.gating.noise.kind = noise_kind::gaussian;
  c.gating.noise.target = noise_target::selection_only;
  c.gating.stage = softmax_stage::before_topk;
  check_gating_case(make_case("gaussian, selection only (gates from clean logits)", c, 8, 54, 0.6f), 55);
}

TEST_CASE("backward: expert bias, ids and dropped assignments get no gradient",
          "[backward][gating]") {
  auto c = presets::deepseek_v3(8, 2, 4, 2);
  auto gc = make_case("bias", c, 6, 60);
  std::vector<float> bias(8, 0.0f);
  const auto g0 = ref::gate(c, gc.logits, gc.T, bias);
  const auto d0 = ref::dispatch(c, g0);
  std::vector<float> dw(gc.T * 2), dl(gc.T * 8, 0.0f);
  for (std::size_t i = 0; i < dw.size(); ++i) dw[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;
  ref::gating_backward(c, gc.logits, g0, d0, dw, dl);
  // with the ids unchanged, the bias value does not enter the gradient
  bias = {0.01f, -0.01f, 0.02f, 0.0f, -0.02f, 0.015f, 0.0f, 0.005f};
  const auto g1 = ref::gate(c, gc.logits, gc.T, bias);
  REQUIRE(g1.ids == g0.ids);
  std::vector<float> dl1(gc.T * 8, 0.0f);
  ref::gating_backward(c, gc.logits, g1, ref::dispatch(c, g1), dw, dl1);
  CHECK(dl1 == dl);
  // an upstream gradient on dropped assignments is ignored
  auto ds = presets::deepspeed_top2(4, 0.5, 1);
  const auto x = separated_logits(10, 4, 61);
  const auto g = ref::gate(ds, x, 10);
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
  ref::gating_backward(ds, x, g, d, up, da);
  ref::gating_backward(ds, x, g, d, up_masked, db);
  CHECK(da == db);
}

TEST_CASE("backward: non-finite logits get zero gradient, the rest stays finite",
          "[backward][gating][nonfinite]") {
  auto c = plain(4, 2);
  c.gating.renorm = renormalize::before_drop;
  std::vector<float> x = {0.5f, std::numeric_limits<float>::quiet_NaN(), 1.5f, -0.5f,
                          std::numeric_limits<float>::infinity(), 0.0f, 1.0f, 2.0f};
  const auto g = ref::gate(c, x, 2);
  const auto d = ref::dispatch(c, g);
  std::vector<float> dw = {1.0f, -2.0f, 0.5f, 3.0f}, dl(8, 0.0f), da(8, 0.0f), dz(8, 0.0f);
  ref::gating_backward(c, x, g, d, dw, dl);
  ref::aux_loss_backward(c, x, g, da);
  ref::z_loss_backward(c, x, g, dz);
  for (const auto* v : {&dl, &da, &dz}) {
    CHECK((*v)[1] == 0.0f);
    CHECK((*v)[4] == 0.0f);
    for (float f : *v) CHECK(std::isfinite(f));
  }
  CHECK(dl[0] != 0.0f);  // row 0 still has a real gradient
}

TEST_CASE("backward: zero tokens is a no-op; wrong shapes throw", "[backward][shapes]") {
  auto c = presets::mixtral(4, 2);
  std::vector<float> none;
  const auto g = ref::gate(c, none, 0);
  const auto d = ref::dispatch(c, g);
  std::vector<float> dl;
  CHECK_NOTHROW(ref::accumulate_logit_grads(c, none, g, d, none, dl));
  const auto x = separated_logits(3, 4, 70);
  const auto g3 = ref::gate(c, x, 3);
  const auto d3 = ref::dispatch(c, g3);
  std::vector<float> dw(6, 1.0f), short_dl(11, 0.0f), ok_dl(12, 0.0f), short_dw(5, 1.0f);
  CHECK_THROWS_AS(ref::gating_backward(c, x, g3, d3, dw, short_dl), moeroute::error);
  CHECK_THROWS_AS(ref::gating_backward(c, x, g3, d3, short_dw, ok_dl), moeroute::error);
  CHECK_THROWS_AS(ref::z_loss_backward(c, dw, g3, ok_dl), moeroute::error);
}

// ---------------------------------------------------------------------------------------------
// Losses

namespace {

/// P[t, :] in double: softmax over all, or s / (sum s + 1e-20).
std::vector<double> aux_p_double(const routing_config& cfg, const double* x, std::int32_t E) {
  std::vector<double> row(x, x + E);
  if (cfg.gating.score == score_function::softmax) return softmax_of(row);
  double s = 0;
  for (auto& v : row) s += (v = score_of(cfg.gating.score, v));
  for (auto& v : row) v /= (s + 1e-20);
  return row;
}

double aux_double(const routing_config& cfg, const std::vector<double>& x, const ref::gating_output& g) {
  const std::int32_t E = g.experts;
  std::vector<double> psum(E, 0.0);
  for (std::int64_t t = 0; t < g.tokens; ++t) {
    if (!g.valid[t]) continue;
    const auto p = aux_p_double(cfg, &x[t * E], E);
    for (std::int32_t e = 0; e < E; ++e) psum[e] += p[e];
  }
  const double T = static_cast<double>(g.valid_tokens);
  double s = 0;
  for (std::int32_t e = 0; e < E; ++e) s += (static_cast<double>(g.aux_count[e]) / T) * (psum[e] / T);
  return cfg.loss.aux_coefficient * ref::aux_scale_value(cfg) * s;
}

double seq_aux_double(const routing_config& cfg, const std::vector<double>& x, const ref::gating_output& g) {
  const std::int32_t E = g.experts;
  const std::int64_t L = cfg.loss.sequence_length;
  double total = 0;
  std::int64_t used = 0;
  for (std::int64_t q = 0; q < g.sequences; ++q) {
    std::vector<double> psum(E, 0.0);
    std::int64_t n = 0;
    for (std::int64_t t = q * L; t < (q + 1) * L; ++t) {
      if (!g.valid[t]) continue;
      ++n;
      const auto p = aux_p_double(cfg, &x[t * E], E);
      for (std::int32_t e = 0; e < E; ++e) psum[e] += p[e];
    }
    if (n == 0) continue;
    double s = 0;
    for (std::int32_t e = 0; e < E; ++e)
      s += (static_cast<double>(g.seq_count[q * E + e]) / static_cast<double>(n)) * (psum[e] / static_cast<double>(n));
    total += ref::aux_scale_value(cfg) * s;
    ++used;
  }
  return used ? cfg.loss.aux_coefficient * total / static_cast<double>(used) : 0.0;
}

double z_double(const routing_config& cfg, const std::vector<double>& x, const ref::gating_output& g) {
  const std::int32_t E = g.experts;
  double s = 0;
  for (std::int64_t t = 0; t < g.tokens; ++t) {
    if (!g.valid[t]) continue;
    double m = -1e300, se = 0;
    for (std::int32_t e = 0; e < E; ++e) m = std::max(m, x[t * E + e]);
    for (std::int32_t e = 0; e < E; ++e) se += std::exp(x[t * E + e] - m);
    const double l = m + std::log(se);
    s += l * l;
  }
  return cfg.loss.z_coefficient * s / static_cast<double>(g.valid_tokens);
}

void check_losses(const std::string& name, const routing_config& cfg, std::int64_t T,
                  const std::vector<float>& logits, const std::vector<float>& bias = {},
                  const std::vector<std::uint8_t>& valid = {}) {
  INFO("case " << name);
  const auto g = ref::gate(cfg, logits, T, bias, valid);
  const auto dsp = ref::dispatch(cfg, g);
  const auto x = to_double(logits);
  const std::int64_t TE = T * cfg.num_experts;
  // the double forwards are the real ones
  REQUIRE(aux_double(cfg, x, g) == Approx(ref::aux_loss(cfg, g).value).epsilon(1e-6));
  REQUIRE(z_double(cfg, x, g) == Approx(ref::z_loss(cfg, g).value).epsilon(1e-6));
  if (cfg.loss.sequence_length > 0)
    REQUIRE(seq_aux_double(cfg, x, g) == Approx(ref::sequence_aux_loss(cfg, g)).epsilon(1e-6));

  {
    std::vector<double> an(TE, 0.0);
    ref::aux_loss_backward<double>(cfg, x, g, an);
    check_fd_double([&](const std::vector<double>& xs) { return aux_double(cfg, xs, g); }, x, an);
    check_fd_float(
        [&](const std::vector<float>& xs) {
          ref::gating_output gp;
          require_same_decisions(cfg, xs, T, bias, valid, g, dsp, &gp);
          return ref::aux_loss(cfg, gp).value;
        },
        logits, an);
  }
  {
    std::vector<double> an(TE, 0.0);
    ref::z_loss_backward<double>(cfg, x, g, an);
    check_fd_double([&](const std::vector<double>& xs) { return z_double(cfg, xs, g); }, x, an);
    check_fd_float(
        [&](const std::vector<float>& xs) {
          return ref::z_loss(cfg, ref::gate(cfg, xs, T, bias, valid)).value;
        },
        logits, an);
  }
  if (cfg.loss.sequence_length > 0) {
    std::vector<double> an(TE, 0.0);
    ref::sequence_aux_loss_backward<double>(cfg, x, g, an);
    check_fd_double([&](const std::vector<double>& xs) { return seq_aux_double(cfg, xs, g); }, x, an);
    check_fd_float(
        [&](const std::vector<float>& xs) {
          ref::gating_output gp;
          require_same_decisions(cfg, xs, T, bias, valid, g, dsp, &gp);
          return ref::sequence_aux_loss(cfg, gp);
        },
        logits, an);
  }
  // the one call: routing + aux + sequence aux + z, against the FD of the weighted total
  {
    const auto u = upstream(T * cfg.top_k, 77);
    ref::logit_grad_weights w;
    w.routing = 0.5;
    w.aux = 2.0;
    w.sequence_aux = 3.0;
    w.z = 0.25;
    std::vector<double> an(TE, 0.0);
    ref::accumulate_logit_grads<double>(cfg, x, g, dsp, u, an, w);
    const bool seq = cfg.loss.sequence_length > 0;
    check_fd_double(
        [&](const std::vector<double>& xs) {
          return w.routing * dot(u, weights_double(cfg, xs, g, dsp)) + w.aux * aux_double(cfg, xs, g) +
                 (seq ? w.sequence_aux * seq_aux_double(cfg, xs, g) : 0.0) + w.z * z_double(cfg, xs, g);
        },
        x, an);
  }
}

}  // namespace

TEST_CASE("backward: aux-loss, sequence aux-loss and z-loss gradients match finite differences",
          "[backward][losses]") {
  {
    auto c = presets::deepspeed_top2(4, 1.0, 1);  // softmax P, top-1 counts, E * sum
    c.loss.z_coefficient = 0.3f;
    check_losses("DeepSpeed top-2 aux + z", c, 10, separated_logits(10, 4, 80));
  }
  {
    presets::megatron_options o;  // fresh top-k counts, E/k scaling
    check_losses("Megatron top-2 (softmax)", presets::megatron(6, 2, o), 9, separated_logits(9, 6, 81));
    o.score = score_function::sigmoid;
    o.groups = 3;
    o.group_topk = 1;
    o.expert_bias = true;
    o.scaling_factor = 2.5f;
    check_losses("Megatron sigmoid, normalised scores P = s / (sum s + 1e-20)",
                 presets::megatron(6, 2, o), 9, separated_logits(9, 6, 82),
                 {0.1f, -0.1f, 0.05f, 0.0f, 0.02f, -0.03f});
  }
  {
    auto c = plain(5, 2);
    c.gating.score = score_function::sqrt_softplus;
    c.gating.select = select_from::scores;
    c.loss.counts = aux_counts::all_k;
    c.loss.aux_coefficient = 0.01f;
    c.loss.sequence_length = 4;
    check_losses("sqrt-softplus, sequence aux (L = 4), coefficient 0.01", c, 12, separated_logits(12, 5, 83));
  }
  {
    auto c = presets::mixtral(6, 2);
    c.loss.sequence_length = 3;
    // token 4 padding; the last sequence entirely padding (left out of the mean)
    check_losses("Mixtral, sequence aux with a valid mask", c, 9, separated_logits(9, 6, 84), {},
                 {1, 1, 1, 1, 0, 1, 0, 0, 0});
  }
}

TEST_CASE("backward: global-batch aux loss from sums equals the unsharded gradient",
          "[backward][losses][sharding]") {
  // Two ranks each hold half a batch: the global loss uses the summed counts and token total;
  // each rank's gradient from aux_loss_backward_from_sums is its rows of the full gradient.
  presets::megatron_options o;
  const auto c = presets::megatron(6, 2, o);
  const std::int64_t T = 12, half = 6;
  const auto x = separated_logits(T, 6, 90);
  const auto g = ref::gate(c, x, T);
  std::vector<float> full(T * 6, 0.0f);
  ref::aux_loss_backward(c, x, g, full);
  std::vector<float> xa(x.begin(), x.begin() + half * 6), xb(x.begin() + half * 6, x.end());
  const auto ga = ref::gate(c, xa, half), gb = ref::gate(c, xb, half);
  std::vector<std::int64_t> counts(6);
  for (int e = 0; e < 6; ++e) counts[e] = ga.aux_count[e] + gb.aux_count[e];
  REQUIRE(counts == g.aux_count);
  std::vector<float> da(half * 6, 0.0f), db(half * 6, 0.0f);
  ref::aux_loss_backward_from_sums(c, xa, ga, counts, T, da);
  ref::aux_loss_backward_from_sums(c, xb, gb, counts, T, db);
  for (std::int64_t i = 0; i < half * 6; ++i) {
    CHECK(da[i] == full[i]);
    CHECK(db[i] == full[half * 6 + i]);
  }
  // and the forward: the loss from the summed sums is the unsharded loss
  std::vector<double> psum(6);
  for (int e = 0; e < 6; ++e) psum[e] = ga.aux_score_sum[e] + gb.aux_score_sum[e];
  CHECK(ref::aux_loss_from_sums(c, psum, counts, T) == Approx(ref::aux_loss(c, g).value).epsilon(1e-12));
}

// ---------------------------------------------------------------------------------------------
// Combine and permute

namespace {

struct routed {
  routing_config cfg;
  ref::gating_output g;
  ref::dispatch_output d;
  ref::expert_layout L;
};

routed route_for_combine(routing_config cfg, std::int64_t T, std::uint32_t seed, bool padded) {
  routed r;
  r.cfg = cfg;
  const auto x = separated_logits(T, cfg.num_experts, seed);
  r.g = ref::gate(cfg, x, T);
  r.d = ref::dispatch(cfg, r.g);
  r.L = padded ? ref::padded_layout(r.d) : ref::compact_layout(r.d, 4);
  return r;
}

/// y = sum_j w_j eo[row_j] (+ x for residual pass-through), in double.
std::vector<double> combine_double(const routed& r, const std::vector<double>& w,
                                   const std::vector<double>& eo, const std::vector<double>& x,
                                   std::int64_t d) {
  const std::int64_t T = r.d.tokens;
  const std::int32_t k = r.d.k;
  std::vector<double> y(T * d, 0.0);
  for (std::int64_t t = 0; t < T; ++t) {
    bool any = false;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t row = r.L.assignment_row[t * k + j];
      if (row < 0) continue;
      any = true;
      for (std::int64_t c = 0; c < d; ++c) y[t * d + c] += w[t * k + j] * eo[row * d + c];
    }
    if (r.cfg.dispatch.dropped == drop_policy::residual && !any && r.d.fates[t * k] != fate::masked)
      for (std::int64_t c = 0; c < d; ++c) y[t * d + c] = x[t * d + c];
  }
  return y;
}

void check_combine(const std::string& name, const routed& r, std::int64_t d) {
  INFO("case " << name);
  const std::int64_t T = r.d.tokens, rows = r.L.num_rows;
  const std::int32_t k = r.d.k;
  const auto eo = upstream(rows * d, 5), x = upstream(T * d, 6), dy = upstream(T * d, 7);
  const std::vector<double> w(r.d.weight.begin(), r.d.weight.end());
  std::vector<double> d_eo(rows * d), d_w(T * k), d_x(T * d);
  ref::combine_backward<double>(r.cfg, r.d, r.L, eo, d, dy, d_eo, d_w, d_x);
  const auto loss_eo = [&](const std::vector<double>& v) { return dot(dy, combine_double(r, w, v, x, d)); };
  const auto loss_w = [&](const std::vector<double>& v) { return dot(dy, combine_double(r, v, eo, x, d)); };
  const auto loss_x = [&](const std::vector<double>& v) { return dot(dy, combine_double(r, w, eo, v, d)); };
  check_fd_double(loss_eo, eo, d_eo);
  // d weight counts only surviving assignments (the weight of a dropped one is identically 0)
  std::vector<double> d_w_alive = d_w;
  for (std::int64_t a = 0; a < T * k; ++a)
    if (r.L.assignment_row[a] < 0) REQUIRE(d_w[a] == 0.0);
  check_fd_double(loss_w, w, d_w_alive);
  check_fd_double(loss_x, x, d_x);

  // the real forward, in float
  std::vector<float> eo_f(eo.begin(), eo.end()), x_f(x.begin(), x.end()), y(T * d);
  const auto real = [&](const ref::dispatch_output& dd, const std::vector<float>& e, const std::vector<float>& xx) {
    ref::combine<float>(r.cfg, dd, r.L, e, d, xx, y);
    return dot(dy, y);
  };
  check_fd_float([&](const std::vector<float>& v) { return real(r.d, v, x_f); }, eo_f, d_eo);
  check_fd_float([&](const std::vector<float>& v) { return real(r.d, eo_f, v); }, x_f, d_x);
  check_fd_float(
      [&](const std::vector<float>& v) {
        ref::dispatch_output dd = r.d;
        dd.weight = v;
        return real(dd, eo_f, x_f);
      },
      r.d.weight, d_w_alive);
  // float backward = double backward to float rounding
  std::vector<float> dy_f(dy.begin(), dy.end()), d_eo_f(rows * d), d_w_f(T * k), d_x_f(T * d);
  ref::combine_backward(r.cfg, r.d, r.L, eo_f, d, dy_f, d_eo_f, d_w_f, d_x_f);
  for (std::int64_t i = 0; i < rows * d; ++i) REQUIRE(d_eo_f[i] == Approx(d_eo[i]).margin(1e-6));
  for (std::int64_t i = 0; i < T * k; ++i) REQUIRE(d_w_f[i] == Approx(d_w[i]).margin(1e-5));
}

}  // namespace

TEST_CASE("backward: combine gradient (d expert_out, d weight, residual d x) matches finite differences",
          "[backward][combine]") {
  check_combine("DeepSpeed top-2, padded, capacity 0.5",
                route_for_combine(presets::deepspeed_top2(4, 0.5, 1), 10, 100, true), 3);
  check_combine("Mixtral dropless, compact block 4",
                route_for_combine(presets::mixtral(5, 2), 9, 101, false), 5);
  const auto sw = route_for_combine(presets::switch_top1(4, 0.5, 1), 12, 102, true);
  REQUIRE(sw.d.total_dropped > 0);  // residual pass-through is exercised
  check_combine("Switch top-1 residual, padded", sw, 4);
  auto fb = presets::deepspeed_top2(4, 0.5, 1);
  fb.dispatch.dropped = drop_policy::fallback;
  fb.dispatch.fallback.expert = 0;
  const auto shared = route_for_combine(fb, 12, 103, true);
  bool any_shared = false;
  for (std::int64_t t = 0; t < 12; ++t)
    any_shared = any_shared || (shared.L.assignment_row[t * 2] >= 0 &&
                                shared.L.assignment_row[t * 2] == shared.L.assignment_row[t * 2 + 1]);
  REQUIRE(any_shared);  // a rerouted assignment shares its token's row
  check_combine("fallback to routed expert 0 (shared rows)", shared, 3);
}

TEST_CASE("backward: permute gradient sums a token's distinct rows, matches finite differences",
          "[backward][permute]") {
  auto fb = presets::deepspeed_top2(4, 0.5, 1);
  fb.dispatch.dropped = drop_policy::fallback;
  fb.dispatch.fallback.expert = 0;
  for (const bool padded : {true, false}) {
    const auto r = route_for_combine(fb, 12, 103, padded);
    const std::int64_t d = 3, T = 12, rows = r.L.num_rows;
    INFO("padded " << padded);
    const auto dbuf = upstream(rows * d, 8), x = upstream(T * d, 9);
    std::vector<double> dx(T * d);
    ref::permute_backward<double>(r.d, r.L, dbuf, d, dx);
    // double forward: buf[row] = x[row_token[row]]
    const auto loss = [&](const std::vector<double>& xs) {
      double s = 0;
      for (std::int64_t row = 0; row < rows; ++row) {
        const std::int32_t t = r.L.row_token[row];
        if (t < 0) continue;
        for (std::int64_t c = 0; c < d; ++c) s += dbuf[row * d + c] * xs[t * d + c];
      }
      return s;
    };
    check_fd_double(loss, x, dx);
    // the real permute, in float
    std::vector<float> x_f(x.begin(), x.end()), buf(rows * d);
    check_fd_float(
        [&](const std::vector<float>& xs) {
          ref::permute<float>(r.L, xs, T, d, buf);
          double s = 0;
          for (std::int64_t i = 0; i < rows * d; ++i) s += dbuf[i] * static_cast<double>(buf[i]);
          return s;
        },
        x_f, dx);
    // accumulate adds on top of what is there
    std::vector<double> acc(T * d, 1.0);
    ref::permute_backward<double>(r.d, r.L, dbuf, d, acc, true);
    for (std::int64_t i = 0; i < T * d; ++i) CHECK(acc[i] == Approx(dx[i] + 1.0).margin(1e-15));
  }
}

TEST_CASE("backward: combine and permute backward are bitwise deterministic", "[backward][determinism]") {
  const auto r = route_for_combine(presets::mixtral(6, 3), 16, 110, false);
  const std::int64_t d = 7, rows = r.L.num_rows, T = 16;
  const auto eo = upstream(rows * d, 1), dy = upstream(T * d, 2);
  std::vector<float> eo_f(eo.begin(), eo.end()), dy_f(dy.begin(), dy.end());
  std::vector<float> a1(rows * d), w1(T * 3), a2(rows * d), w2(T * 3), x1(T * d), x2(T * d);
  ref::combine_backward(r.cfg, r.d, r.L, eo_f, d, dy_f, a1, w1);
  ref::combine_backward(r.cfg, r.d, r.L, eo_f, d, dy_f, a2, w2);
  CHECK(a1 == a2);
  CHECK(w1 == w2);
  ref::permute_backward(r.d, r.L, a1, d, x1);
  ref::permute_backward(r.d, r.L, a2, d, x2);
  CHECK(x1 == x2);
}

TEST_CASE("backward: combine/permute backward in bf16 storage", "[backward][combine][dtype]") {
  const auto r = route_for_combine(presets::mixtral(4, 2), 6, 120, false);
  const std::int64_t d = 2, rows = r.L.num_rows, T = 6;
  std::vector<bf16_bits> eo(rows * d), dy(T * d), d_eo(rows * d), dx(T * d);
  for (std::int64_t i = 0; i < rows * d; ++i) eo[i] = to_bf16(0.25f * static_cast<float>(i % 7) - 0.5f);
  for (std::int64_t i = 0; i < T * d; ++i) dy[i] = to_bf16(0.5f * static_cast<float>(i % 3) - 0.5f);
  std::vector<float> dw(T * 2);
  ref::combine_backward<bf16_bits>(r.cfg, r.d, r.L, eo, d, dy, d_eo, dw);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int32_t j = 0; j < 2; ++j) {
      const std::int64_t row = r.L.assignment_row[t * 2 + j];
      float want = 0.0f;
      for (std::int64_t c = 0; c < d; ++c) want += to_float(dy[t * d + c]) * to_float(eo[row * d + c]);
      CHECK(dw[t * 2 + j] == want);
    }
  ref::permute_backward<bf16_bits>(r.d, r.L, d_eo, d, dx);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < d; ++c) {
      float want = 0.0f;  // both weights of the token times dy, each rounded to bf16 first
      for (std::int32_t j = 0; j < 2; ++j)
        want += to_float(to_bf16(r.d.weight[t * 2 + j] * to_float(dy[t * d + c])));
      CHECK(to_float(dx[t * d + c]) == to_float(to_bf16(want)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Expert-bias update

TEST_CASE("backward: expert-bias update follows sign(mean load - load)", "[backward][bias]") {
  std::vector<float> bias = {0.0f, 0.5f, -0.25f, 0.0f};
  const std::vector<std::int64_t> load = {10, 2, 6, 6};  // mean 6
  ref::update_expert_bias(bias, load, {0.125f, false});
  CHECK(bias == std::vector<float>{-0.125f, 0.625f, -0.25f, 0.0f});  // sign(0) = 0
  ref::update_expert_bias(bias, load, {0.125f, true});
  // -0.25, 0.75, -0.25, 0.0 -> mean 0.0625 -> recentred
  CHECK(bias == std::vector<float>{-0.3125f, 0.6875f, -0.3125f, -0.0625f});
  double s = 0;
  for (float b : bias) s += b;
  CHECK(s == 0.0);
  std::vector<float> b2 = {1.0f, 2.0f};
  ref::update_expert_bias(b2, std::vector<std::int64_t>{0, 0}, {0.5f, false});
  CHECK(b2 == std::vector<float>{1.0f, 2.0f});  // balanced (all zero) loads: no change
  CHECK_THROWS_AS(ref::update_expert_bias(b2, load, {}), moeroute::error);
  CHECK_THROWS_AS(ref::update_expert_bias(b2, std::vector<std::int64_t>{1, 2}, {-1.0f, false}),
                  moeroute::error);
}

TEST_CASE("backward: load accumulator ignores a recomputed micro-batch", "[backward][bias]") {
  ref::expert_load_accumulator acc(3);
  const std::vector<std::int64_t> a = {1, 2, 3}, b = {4, 0, 1};
  CHECK(acc.add(a, 0));
  CHECK(acc.add(b, 1));
  CHECK_FALSE(acc.add(a, 0));  // activation checkpointing recomputes micro-batch 0
  CHECK(acc.counts() == std::vector<std::int64_t>{5, 2, 4});
  CHECK(acc.micro_batches() == 2);
  acc.reset();
  CHECK(acc.counts() == std::vector<std::int64_t>{0, 0, 0});
  CHECK(acc.add(a, 0));  // a new step may reuse the id
  CHECK(acc.counts() == a);
  CHECK_THROWS_AS(acc.add(std::vector<std::int64_t>{1, 2}, 5), moeroute::error);
  CHECK_THROWS_AS(ref::expert_load_accumulator(0), moeroute::error);

  // from a routed micro-batch: requested loads, before drop
  auto c = presets::deepspeed_top2(4, 0.5, 1);
  const auto x = separated_logits(8, 4, 130);
  const auto d = ref::dispatch(c, ref::gate(c, x, 8));
  ref::expert_load_accumulator acc4(4);
  CHECK(acc4.add(d, 7));
  CHECK_FALSE(acc4.add(d, 7));
  CHECK(acc4.counts() == d.requested);
  std::int64_t total = 0;
  for (auto v : acc4.counts()) total += v;
  CHECK(total == 16);
}

TEST_CASE("backward: expert-bias update balances a collapsed router", "[backward][bias]") {
  // all tokens prefer expert 0; the bias (selection only) must spread the load
  auto c = presets::deepseek_v3(4, 1, 1, 0);
  c.gating.group_limit = {};
  std::vector<float> x(32 * 4);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  for (std::int64_t t = 0; t < 32; ++t)
    for (int e = 0; e < 4; ++e) x[t * 4 + e] = (e == 0 ? 1.0f : 0.0f) + u(rng);
  std::vector<float> bias(4, 0.0f);
  std::int64_t first_max = 0, last_max = 0;
  for (int step = 0; step < 200; ++step) {
    const auto d = ref::dispatch(c, ref::gate(c, x, 32, bias));
    const std::int64_t mx = *std::max_element(d.requested.begin(), d.requested.end());
    if (step == 0) first_max = mx;
    last_max = mx;
    ref::update_expert_bias(bias, d.requested, {0.01f, true});
  }
  CHECK(first_max == 32);
  CHECK(last_max <= 12);  // near 8 = 32 / 4
}
