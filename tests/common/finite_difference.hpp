// SPDX-License-Identifier: Apache-2.0
// The finite-difference oracle of the backward tests: well-separated logits (no routing
// decision flips within a step), central differences in double (h = 1e-5) against an analytic
// gradient and in float (h = 1e-2) of the library's real forward, and double forwards of the
// combine weights and the losses written from docs/numerics.md, independently of the backward.
//
//  1. double: |fd - analytic| <= 1e-6 * max(|fd|, |analytic|) + 1e-9, after the double forward
//     is checked against the library's float forward at the base point (1e-6 relative).
//  2. float: |fd - analytic| <= 2e-4 of the row's largest gradient (float rounding / 2h and
//     h^2 truncation).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <moeroute/config_fields.hpp>
#include <moeroute/reference.hpp>

namespace moeroute::test {

namespace ref = moeroute::reference;

inline constexpr double fd_h = 1e-5;
inline constexpr double fd_rel = 1e-6;
inline constexpr double fd_abs = 1e-9;
inline constexpr float fd_h_float = 1e-2f;
inline constexpr double fd_float_tol = 2e-4;

/// Logits with every pair in a row at least `sep` apart: base + sep * (random permutation)
/// + a small jitter, rounded to float (the double copy holds the same values exactly).
inline std::vector<float> separated_logits(std::int64_t T, std::int32_t E, std::uint32_t seed,
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
inline std::vector<float> distinct_gap_logits(std::int64_t T, std::int32_t E, std::uint32_t seed) {
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

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

inline std::vector<double> upstream(std::size_t n, std::uint32_t seed) {
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

inline double noise_value(const routing_config& cfg, std::int64_t t, std::int32_t e) {
  const auto& n = cfg.gating.noise;
  const auto r = rng::draw(n.seed, n.offset, rng::stream_gating_noise,
                           static_cast<std::uint64_t>(t) * cfg.num_experts + e);
  return n.kind == noise_kind::gaussian ? rng::normal(r.v[0], r.v[1]) : rng::gumbel(r.v[0]);
}

inline double score_of(score_function f, double x) {
  if (f == score_function::sigmoid) return 1.0 / (1.0 + std::exp(-x));
  const double sp = x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  return std::sqrt(sp);
}

inline std::vector<double> softmax_of(const std::vector<double>& v) {
  const double m = *std::max_element(v.begin(), v.end());
  std::vector<double> p(v.size());
  double s = 0;
  for (std::size_t i = 0; i < v.size(); ++i) s += (p[i] = std::exp(v[i] - m));
  for (auto& q : p) q /= s;
  return p;
}

inline std::vector<double> weights_double(const routing_config& cfg, const std::vector<double>& x,
                                          const ref::gating_output& g,
                                          const ref::dispatch_output& dsp) {
  const std::int64_t T = g.tokens;
  const std::int32_t E = g.experts, k = g.k;
  const auto& gc = cfg.gating;
  std::vector<double> w(T * k, 0.0);
  for (std::int64_t t = 0; t < T; ++t) {
    if (!g.valid[t]) continue;
    std::vector<double> xg(x.begin() + t * E, x.begin() + (t + 1) * E);
    if (cfg.noise_active() && gc.noise.target == noise_target::selection_and_gates)
      for (std::int32_t e = 0; e < E; ++e)
        xg[e] += static_cast<double>(gc.noise.scale) * noise_value(cfg, t, e);
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
    auto alive = [&](std::int32_t j) { return holds_row(dsp.fates[t * k + j]); };
    for (std::int32_t j = 0; j < k; ++j)
      if (alive(j)) kept_sum += gate[j];
    for (std::int32_t j = 0; j < k; ++j) {
      if (!alive(j)) continue;
      w[t * k + j] =
          gc.renorm == renormalize::after_drop
              ? gate[j] / std::max(kept_sum, static_cast<double>(FLT_EPSILON)) * gc.scaling_factor
              : gate[j];
    }
  }
  return w;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
inline double dot(const std::vector<double>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * static_cast<double>(b[i]);
  return s;
}

struct fd_stats {
  std::size_t checked = 0, nonzero = 0;
  double worst_rel = 0;
};

/// Double central differences of f at x against `analytic`, every element.
inline fd_stats check_fd_double(const std::function<double(const std::vector<double>&)>& f,
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
inline void check_fd_float(const std::function<double(const std::vector<float>&)>& f,
                           std::vector<float> x, const std::vector<double>& analytic) {
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
    INFO("element " << i << ": real-forward finite difference " << fd << ", analytic "
                    << analytic[i]);
    REQUIRE(std::fabs(fd - analytic[i]) <= fd_float_tol * scale);
  }
}

/// P[t, :] in double: softmax over all, or s / (sum s + 1e-20).
inline std::vector<double> aux_p_double(const routing_config& cfg, const double* x,
                                        std::int32_t E) {
  std::vector<double> row(x, x + E);
  if (cfg.gating.score == score_function::softmax) return softmax_of(row);
  double s = 0;
  for (auto& v : row) s += (v = score_of(cfg.gating.score, v));
  for (auto& v : row) v /= (s + 1e-20);
  return row;
}

inline double aux_double(const routing_config& cfg, const std::vector<double>& x,
                         const ref::gating_output& g) {
  const std::int32_t E = g.experts;
  std::vector<double> psum(E, 0.0);
  for (std::int64_t t = 0; t < g.tokens; ++t) {
    if (!g.valid[t]) continue;
    const auto p = aux_p_double(cfg, &x[t * E], E);
    for (std::int32_t e = 0; e < E; ++e) psum[e] += p[e];
  }
  const double T = static_cast<double>(g.valid_tokens);
  double s = 0;
  for (std::int32_t e = 0; e < E; ++e)
    s += (static_cast<double>(g.aux_count[e]) / T) * (psum[e] / T);
  return cfg.loss.aux_coefficient * aux_loss_scale(cfg) * s;
}

inline double seq_aux_double(const routing_config& cfg, const std::vector<double>& x,
                             const ref::gating_output& g) {
  const std::int32_t E = g.experts;
  const std::int64_t L = cfg.loss.sequence_length;
  double total = 0;
  std::int64_t used = 0;
  const std::int64_t S = g.sequences;
  const bool strided = cfg.loss.sequence_order == token_order::position_major;
  for (std::int64_t q = 0; q < S; ++q) {
    std::vector<double> psum(E, 0.0);
    std::int64_t n = 0;
    for (std::int64_t pos = 0; pos < L; ++pos) {
      const std::int64_t t = strided ? pos * S + q : q * L + pos;  // [L, S] or [S, L]
      if (!g.valid[t]) continue;
      ++n;
      const auto p = aux_p_double(cfg, &x[t * E], E);
      for (std::int32_t e = 0; e < E; ++e) psum[e] += p[e];
    }
    if (n == 0) continue;
    double s = 0;
    for (std::int32_t e = 0; e < E; ++e)
      s += (static_cast<double>(g.seq_count[q * E + e]) / static_cast<double>(n)) *
           (psum[e] / static_cast<double>(n));
    total += aux_loss_scale(cfg) * s;
    ++used;
  }
  if (cfg.loss.sequence_reduce == sequence_reduction::sum) return cfg.loss.aux_coefficient * total;
  return used ? cfg.loss.aux_coefficient * total / static_cast<double>(used) : 0.0;
}

inline double z_double(const routing_config& cfg, const std::vector<double>& x,
                       const ref::gating_output& g) {
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

/// The routing decisions of the real forward at x equal the base ones.
inline void require_same_decisions(const routing_config& cfg, const std::vector<float>& x,
                                   std::int64_t T, const std::vector<float>& bias,
                                   const std::vector<std::uint8_t>& valid,
                                   const ref::gating_output& g0, const ref::dispatch_output& d0,
                                   ref::gating_output* g_out = nullptr,
                                   ref::dispatch_output* d_out = nullptr) {
  auto g = ref::gating(cfg, x, T, bias, valid);
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

/// A config that drops nothing and renormalises nothing: the plainest routing of E, k; then
/// `fields` ("name=value ...", see moeroute/config_fields.hpp) on top.
inline routing_config plain(std::int32_t E, std::int32_t k, std::string_view fields = {}) {
  routing_config c;
  c.num_experts = E;
  c.top_k = k;
  c.capacity.mode = capacity_mode::unbounded;
  c.dispatch.dropped = drop_policy::zero_weight;
  throw_if_error(set_fields(c, fields));
  return c;
}

}  // namespace moeroute::test
