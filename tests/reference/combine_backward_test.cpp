// SPDX-License-Identifier: Apache-2.0
// Reference combine and permute backward against central finite differences of a double
// combine, determinism, and 16-bit storage.
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

// ---------------------------------------------------------------------------------------------
// Combine and permute

namespace {

struct routed {
  routing_config cfg;
  ref::gating_output g;
  ref::dispatch_output d;
  ref::layout_output L;
};

routed route_for_combine(routing_config cfg, std::int64_t T, std::uint32_t seed, bool padded) {
  routed r;
  r.cfg = cfg;
  const auto x = separated_logits(T, cfg.num_experts, seed);
  r.g = ref::gating(cfg, x, T);
  r.d = ref::dispatch(cfg, r.g);
  r.L = padded ? ref::layout(r.cfg, r.d, layout_kind::padded)
               : ref::layout(r.cfg, r.d, layout_kind::compact, 4);
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
  ref::combine_backward<double>(r.cfg, r.L, r.d, eo, d, dy, d_eo, d_w, d_x);
  const auto loss_eo = [&](const std::vector<double>& v) {
    return dot(dy, combine_double(r, w, v, x, d));
  };
  const auto loss_w = [&](const std::vector<double>& v) {
    return dot(dy, combine_double(r, v, eo, x, d));
  };
  const auto loss_x = [&](const std::vector<double>& v) {
    return dot(dy, combine_double(r, w, eo, v, d));
  };
  check_fd_double(loss_eo, eo, d_eo);
  // d weight counts only surviving assignments (the weight of a dropped one is identically 0)
  std::vector<double> d_w_alive = d_w;
  for (std::int64_t a = 0; a < T * k; ++a)
    if (r.L.assignment_row[a] < 0) REQUIRE(d_w[a] == 0.0);
  check_fd_double(loss_w, w, d_w_alive);
  check_fd_double(loss_x, x, d_x);

  // the real forward, in float
  std::vector<float> eo_f(eo.begin(), eo.end()), x_f(x.begin(), x.end()), y(T * d);
  const auto real = [&](const ref::dispatch_output& dd, const std::vector<float>& e,
                        const std::vector<float>& xx) {
    ref::combine<float>(r.cfg, r.L, dd, e, d, xx, y);
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
  ref::combine_backward(r.cfg, r.L, r.d, eo_f, d, dy_f, d_eo_f, d_w_f, d_x_f);
  for (std::int64_t i = 0; i < rows * d; ++i) REQUIRE(d_eo_f[i] == Approx(d_eo[i]).margin(1e-6));
  for (std::int64_t i = 0; i < T * k; ++i) REQUIRE(d_w_f[i] == Approx(d_w[i]).margin(1e-5));
}

}  // namespace

TEST_CASE(
    "backward: combine gradient (d expert_out, d weight, residual d x) matches finite differences",
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
    any_shared =
        any_shared || (shared.L.assignment_row[t * 2] >= 0 &&
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
    ref::permute_backward<double>(r.cfg, r.L, r.d, dbuf, d, dx);
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
          ref::permute<float>(r.cfg, r.L, xs, T, d, buf);
          double s = 0;
          for (std::int64_t i = 0; i < rows * d; ++i) s += dbuf[i] * static_cast<double>(buf[i]);
          return s;
        },
        x_f, dx);
    // accumulate adds on top of what is there
    std::vector<double> acc(T * d, 1.0);
    ref::permute_backward<double>(r.cfg, r.L, r.d, dbuf, d, acc, true);
    for (std::int64_t i = 0; i < T * d; ++i) CHECK(acc[i] == Approx(dx[i] + 1.0).margin(1e-15));
  }
}

TEST_CASE("backward: combine and permute backward are bitwise deterministic",
          "[backward][determinism]") {
  const auto r = route_for_combine(presets::mixtral(6, 3), 16, 110, false);
  const std::int64_t d = 7, rows = r.L.num_rows, T = 16;
  const auto eo = upstream(rows * d, 1), dy = upstream(T * d, 2);
  std::vector<float> eo_f(eo.begin(), eo.end()), dy_f(dy.begin(), dy.end());
  std::vector<float> a1(rows * d), w1(T * 3), a2(rows * d), w2(T * 3), x1(T * d), x2(T * d);
  ref::combine_backward(r.cfg, r.L, r.d, eo_f, d, dy_f, a1, w1);
  ref::combine_backward(r.cfg, r.L, r.d, eo_f, d, dy_f, a2, w2);
  CHECK(a1 == a2);
  CHECK(w1 == w2);
  ref::permute_backward(r.cfg, r.L, r.d, a1, d, x1);
  ref::permute_backward(r.cfg, r.L, r.d, a2, d, x2);
  CHECK(x1 == x2);
}

TEST_CASE("backward: combine/permute backward in bf16 storage", "[backward][combine][dtype]") {
  const auto r = route_for_combine(presets::mixtral(4, 2), 6, 120, false);
  const std::int64_t d = 2, rows = r.L.num_rows, T = 6;
  std::vector<bf16_bits> eo(rows * d), dy(T * d), d_eo(rows * d), dx(T * d);
  for (std::int64_t i = 0; i < rows * d; ++i)
    eo[i] = to_bf16(0.25f * static_cast<float>(i % 7) - 0.5f);
  for (std::int64_t i = 0; i < T * d; ++i) dy[i] = to_bf16(0.5f * static_cast<float>(i % 3) - 0.5f);
  std::vector<float> dw(T * 2);
  ref::combine_backward<bf16_bits>(r.cfg, r.L, r.d, eo, d, dy, d_eo, dw);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int32_t j = 0; j < 2; ++j) {
      const std::int64_t row = r.L.assignment_row[t * 2 + j];
      float want = 0.0f;
      for (std::int64_t c = 0; c < d; ++c)
        want += to_float(dy[t * d + c]) * to_float(eo[row * d + c]);
      CHECK(dw[t * 2 + j] == want);
    }
  ref::permute_backward<bf16_bits>(r.cfg, r.L, r.d, d_eo, d, dx);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < d; ++c) {
      float want = 0.0f;  // both weights of the token times dy, each rounded to bf16 first
      for (std::int32_t j = 0; j < 2; ++j)
        want += to_float(to_bf16(r.d.weight[t * 2 + j] * to_float(dy[t * d + c])));
      CHECK(to_float(dx[t * d + c]) == to_float(to_bf16(want)));
    }
  }
}
