// SPDX-License-Identifier: Apache-2.0
// The differential fuzz harness: the CPU backend against the reference on the same decoded
// input (fuzz_input.hpp). Gating runs on the logits moved onto a 1/64 grid in [-16, 16]
// (NaN / Inf kept), where distinct selection values are far apart compared with the scores'
// rounding, so ids must match exactly; floats within 1e-5 relative. Noise moves the logits off
// the grid: where the selection values are scores of noisy logits, two may lie within the
// scores' rounding of each other (the backend's exp is within 2 ulp; glibc's expf is not
// always correctly rounded), and the backend's documented contract lets their order differ.
// Such an input passes the gating comparison only when every differing id is such a near-tie
// (the reference's selection values of the two experts within 1e-6 relative), and is counted;
// its other gating outputs, which follow the ids, are then not compared (its later stages
// are, on the reference's gating).
// Dispatch, both layouts, permute, combine, their backward passes and the losses run on the
// reference's own gating and must equal the reference bit for bit (d weight within fp32 rounding).
// Shared by the libFuzzer target (fuzz_cpu.cpp) and the replay test (tests/cpu/fuzz_cpu_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <moeroute/cpu/combine.hpp>
#include <moeroute/cpu/combine_backward.hpp>
#include <moeroute/cpu/dispatch.hpp>
#include <moeroute/cpu/gating.hpp>
#include <moeroute/cpu/layout.hpp>
#include <moeroute/cpu/losses.hpp>
#include <moeroute/cpu/permute.hpp>
#include <moeroute/reference.hpp>

#include "../common/gating_compare.hpp"
#include "fuzz_input.hpp"

#ifndef MOEROUTE_FUZZ_FAIL
#define MOEROUTE_FUZZ_FAIL(what)                                                                 \
  do {                                                                                           \
    std::fprintf(stderr, "moeroute cpu fuzz: mismatch: %s (%s:%d)\n", what, __FILE__, __LINE__); \
    __builtin_trap();                                                                            \
  } while (0)
#endif

namespace moeroute::fuzz {

/// How far the differential harness got, over all inputs so far.
struct cpu_reach {
  std::int64_t inputs = 0, compared = 0, with_drops = 0, with_reroutes = 0;
  std::int64_t near_ties = 0;  ///< inputs whose ids differed by near-ties of noisy scores only
};
inline cpu_reach& cpu_reached() {
  static cpu_reach r;
  return r;
}

namespace detail {

template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(T)) == 0;
}

inline void expect(bool ok, const std::string& what) {
  if (!ok) MOEROUTE_FUZZ_FAIL(what.c_str());
}

/// A finite logit onto the 1/64 grid in [-16, 16]; NaN and Inf stay.
inline float on_grid(float x) {
  if (!std::isfinite(x)) return x;
  const float c = x < -16.0f ? -16.0f : (x > 16.0f ? 16.0f : x);
  return std::nearbyint(c * 64.0f) / 64.0f;
}

/// cpu::gating on host vectors, as test::gating_outputs.
inline test::gating_outputs run_cpu_gating(const routing_config& cfg,
                                           const std::vector<float>& logits, std::int64_t T,
                                           const std::vector<float>& bias,
                                           const std::vector<std::uint8_t>& valid) {
  test::gating_outputs g;
  reference::resize_gating_outputs(g, cfg, T, {/*logsumexp=*/true, /*per_token_aux=*/true});
  gating_params<float> p;
  p.d_logits = logits.data();
  p.tokens = T;
  p.d_bias = bias.empty() ? nullptr : bias.data();
  p.d_valid = valid.empty() ? nullptr : valid.data();
  p.out = {g.ids.data(),
           g.gates.data(),
           g.reroute_ids.data(),
           g.logsumexp.data(),
           {g.aux_score_sum.data(), g.aux_count.data(), &g.valid_tokens, &g.z_sum_squares,
            &g.nonfinite, g.seq_score_sum.data(), g.seq_count.data(), g.seq_tokens.data()},
           g.token_priority.data(),
           g.second_skipped.data(),
           g.aux_scores.data(),
           g.aux_count_ids.data()};
  std::vector<unsigned char> ws(cpu::gating_workspace_bytes(cfg, T));
  g.st = cpu::gating(cfg, p, ws.data(), ws.size(), cpu::executor::serial());
  return g;
}

/// True when every id (and reroute id) of `got` that differs from the reference's `want` is a
/// near-tie: the reference's selection values of the two experts (scores of the noisy logits,
/// + bias, as reference::gating makes them) within 1e-6 relative; false when none differs.
/// For noisy configs that select from scores.
inline bool differs_by_near_ties_only(const routing_config& cfg, const std::vector<float>& logits,
                                      const std::vector<float>& bias,
                                      const reference::gating_output& want,
                                      const test::gating_outputs& got) {
  const auto& g = cfg.gating;
  const std::int32_t E = cfg.num_experts, k = cfg.top_k, R = cfg.reroute_candidates();
  if (!got.st.ok() || got.ids.size() != want.ids.size() ||
      got.reroute_ids.size() != want.reroute_ids.size())
    return false;
  std::vector<float> x(static_cast<std::size_t>(E)), xn(x.size()), sel(x.size());
  bool differs = false;
  for (std::int64_t t = 0; t < want.tokens; ++t) {
    const auto id = [&](const auto& o, std::int32_t j) {
      return j < k ? o.ids[t * k + j] : o.reroute_ids[t * R + (j - k)];
    };
    bool row_differs = false;
    for (std::int32_t j = 0; j < k + R; ++j) row_differs |= id(want, j) != id(got, j);
    if (!row_differs) continue;
    differs = true;
    for (std::int32_t e = 0; e < E; ++e)
      x[e] = reference::detail::sanitize(logits[static_cast<std::size_t>(t * E + e)]);
    reference::detail::noisy_logits(g.noise, x.data(), t, E, xn.data());
    reference::detail::scores_row(g.score, xn.data(), E, sel.data());
    if (g.expert_bias)
      for (std::int32_t e = 0; e < E; ++e)
        sel[e] = reference::detail::sanitize(sel[e] + bias[static_cast<std::size_t>(e)]);
    for (std::int32_t j = 0; j < k + R; ++j) {
      const std::int32_t a = id(want, j), b = id(got, j);
      if (a == b) continue;
      if (b < 0 || b >= E) return false;
      const double va = sel[a], vb = sel[b];
      if (!(std::fabs(va - vb) <= 1e-6 * std::fmax(std::fabs(va), std::fabs(vb)))) return false;
    }
  }
  return differs;
}

/// The CPU stages after gating on the reference's gating `g`, against the reference.
inline void check_stages(const decoded_case& c, const reference::gating_output& g,
                         const reference::dispatch_output& want) {
  const routing_config& cfg = c.cfg;
  const std::int64_t T = g.tokens, n = T * cfg.top_k;
  const std::int32_t E = cfg.num_experts, ET = cfg.total_experts();
  // dispatch
  std::vector<std::int32_t> expert(n), slot(n);
  std::vector<float> weight(n);
  std::vector<fate> fates(n);
  std::vector<std::int64_t> requested(E), kept(E), rerouted(E), dropped(E), received(ET), load(ET);
  dispatch_totals totals{};
  dispatch_params dp;
  dp.tokens = T;
  dp.gated.d_ids = g.ids.data();
  dp.gated.d_gates = g.gates.data();
  dp.gated.d_reroute_ids = g.reroute_ids.data();
  dp.gated.d_token_priority = g.token_priority.data();
  dp.gated.d_second_skipped = g.second_skipped.data();
  dp.d_valid = g.valid.data();
  dp.out = {expert.data(),    slot.data(), weight.data(),   fates.data(),
            requested.data(), kept.data(), rerouted.data(), dropped.data(),
            received.data(),  load.data(), &totals};
  std::vector<unsigned char> ws(cpu::dispatch_workspace_bytes(cfg, T));
  const status ds = cpu::dispatch(cfg, dp, ws.data(), ws.size());
  expect(ds.ok(), "cpu::dispatch failed: " + ds.message);
  if (T == 0) return;  // T = 0 writes nothing (as cuda::dispatch)
  expect(expert == want.expert && slot == want.slot && fates == want.fates,
         "dispatch: expert / slot / fate differ from the reference");
  expect(requested == want.requested && kept == want.kept && rerouted == want.rerouted &&
             dropped == want.dropped && received == want.received && load == want.load,
         "dispatch: per-expert counts differ from the reference");
  const dispatch_totals wt = want.totals();
  expect(std::memcmp(&totals, &wt, sizeof wt) == 0, "dispatch: totals differ");
  expect(same_bits(weight.data(), want.weight.data(), weight.size()), "dispatch: weights differ");
  if (want.total_dropped > 0) ++cpu_reached().with_drops;
  if (want.total_rerouted > 0) ++cpu_reached().with_reroutes;
  // layouts, and the rows through each
  for (const std::int64_t block : {std::int64_t{0}, c.block_size}) {
    const layout_kind kind = block == 0 ? layout_kind::padded : layout_kind::compact;
    const std::int64_t bs = block == 0 ? 1 : block;
    if (kind == layout_kind::padded && cfg.capacity.mode == capacity_mode::unbounded) continue;
    const auto L = reference::layout(cfg, want, kind, bs);
    const std::int64_t max_rows = layout_max_rows(cfg, T, kind, bs);
    std::vector<std::int64_t> offsets(ET + 1), rows_used(ET), arow(n);
    std::vector<std::int32_t> row_token(max_rows), block_expert(max_rows / bs);
    std::int64_t num_rows = -1;
    layout_params lp;
    lp.kind = kind;
    lp.block_size = bs;
    lp.tokens = T;
    lp.max_rows = max_rows;
    lp.dispatched = dp.out;
    lp.out = {offsets.data(),
              rows_used.data(),
              row_token.data(),
              arow.data(),
              kind == layout_kind::compact ? block_expert.data() : nullptr,
              &num_rows};
    const status ls = cpu::layout(cfg, lp);
    expect(ls.ok(), "cpu::layout failed: " + ls.message);
    expect(num_rows == L.num_rows && offsets == L.offsets && rows_used == L.rows_used &&
               arow == L.assignment_row &&
               std::equal(L.row_token.begin(), L.row_token.end(), row_token.begin()),
           "layout differs from the reference");
    // permute, combine and both backward passes with d = hidden (float)
    const std::int64_t d = c.hidden;
    std::vector<float> x(static_cast<std::size_t>(T * d)),
        eo(static_cast<std::size_t>(L.num_rows * d));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.25f - 1.5f;
    for (std::size_t i = 0; i < eo.size(); ++i) eo[i] = static_cast<float>(i % 7) * 0.5f - 1.0f;
    std::vector<float> buf(static_cast<std::size_t>(max_rows * d)), want_buf(eo.size());
    reference::permute<float>(cfg, L, x, T, d, want_buf);
    permute_params<float> pp{x.data(), T, d, lp.out, max_rows, buf.data()};
    expect(cpu::permute(cfg, pp).ok(), "cpu::permute failed");
    expect(same_bits(buf.data(), want_buf.data(), want_buf.size()), "permute differs");
    std::vector<float> y(x.size()), want_y(x.size()), eo_full(buf.size());
    std::copy(eo.begin(), eo.end(), eo_full.begin());
    reference::combine<float>(cfg, L, want, eo, d, x, want_y);
    combine_params<float> cp{eo_full.data(), max_rows, T, d, lp.out, dp.out, x.data(), y.data()};
    expect(cpu::combine(cfg, cp).ok(), "cpu::combine failed");
    expect(same_bits(y.data(), want_y.data(), y.size()), "combine differs");
    std::vector<float> w_deo(eo.size()), w_dx(x.size()), w_dw(static_cast<std::size_t>(n));
    reference::combine_backward<float>(cfg, L, want, eo, d, x, w_deo, w_dw, w_dx);
    std::vector<float> deo(buf.size()), dx(x.size()), dw(static_cast<std::size_t>(n));
    combine_backward_params<float> bp{eo_full.data(), x.data(), max_rows,   T,         d,
                                      lp.out,         dp.out,   deo.data(), dw.data(), dx.data()};
    expect(cpu::combine_backward(cfg, bp).ok(), "cpu::combine_backward failed");
    expect(same_bits(deo.data(), w_deo.data(), w_deo.size()) &&
               same_bits(dx.data(), w_dx.data(), dx.size()),
           "combine backward (d expert_out / d x) differs");
    for (std::size_t i = 0; i < dw.size(); ++i)
      expect(std::fabs(dw[i] - w_dw[i]) <= 1e-5f * (std::fabs(w_dw[i]) + static_cast<float>(d)),
             "combine backward d weight differs");
  }
  // losses from the reference's sums
  const auto wl = reference::losses(cfg, g);
  double aux = -1, seq = -1, z = -1;
  loss_params lp;
  lp.tokens = T;
  lp.sums = reference::view(g).sums;
  lp.sums.d_z_sum_squares = &wl.z.sum_squares;  // (gating_output keeps no z sum)
  lp.sums.d_nonfinite = nullptr;
  lp.d_aux_loss = &aux;
  lp.d_sequence_aux_loss = &seq;
  lp.d_z_loss = &z;
  expect(cpu::losses(cfg, lp).ok(), "cpu::losses failed");
  if (T > 0)
    expect(same_bits(&aux, &wl.aux.value, 1) && same_bits(&seq, &wl.sequence_aux, 1) &&
               same_bits(&z, &wl.z.value, 1),
           "losses differ");
}

}  // namespace detail

/// One input: decode; for a valid config, batch and bias, the CPU backend against the
/// reference. Returns 0 (libFuzzer's convention).
inline int cpu_one(const std::uint8_t* data, std::size_t size) {
  byte_reader in(data, size);
  decoded_case c = decode(in);
  ++cpu_reached().inputs;
  if (!validate(c.cfg).ok() || !validate_tokens(c.cfg, c.tokens).ok()) return 0;
  decode_data(in, c);
  for (float b : c.bias)
    if (!std::isfinite(b)) return 0;
  // gating on the grid logits (as float), every output compared
  std::vector<float> logits(c.logits_f.size() + c.logits_h.size() + c.logits_b.size());
  for (std::size_t i = 0; i < c.logits_f.size(); ++i) logits[i] = detail::on_grid(c.logits_f[i]);
  for (std::size_t i = 0; i < c.logits_h.size(); ++i)
    logits[i] = detail::on_grid(to_float(c.logits_h[i]));
  for (std::size_t i = 0; i < c.logits_b.size(); ++i)
    logits[i] = detail::on_grid(to_float(c.logits_b[i]));
  std::vector<float> bias(c.bias);
  for (float& b : bias) b = std::nearbyint(std::fmax(-4.0f, std::fmin(4.0f, b)) * 8.0f) / 8.0f;
  const auto g = reference::gating<float>(c.cfg, std::span<const float>(logits), c.tokens,
                                          std::span<const float>(bias),
                                          std::span<const std::uint8_t>(c.valid));
  const auto got = detail::run_cpu_gating(c.cfg, logits, c.tokens, bias, c.valid);
  std::string m = test::compare(g, got);
  if (!m.empty() && c.cfg.noise_active() && c.cfg.gating.select == select_from::scores &&
      detail::differs_by_near_ties_only(c.cfg, logits, bias, g, got)) {
    ++cpu_reached().near_ties;  // off-grid noisy scores within rounding: see the file comment
    m.clear();
  }
  detail::expect(m.empty(), "gating: " + m);
  // the later stages on the reference's gating
  detail::check_stages(c, g, reference::dispatch(c.cfg, g));
  ++cpu_reached().compared;
  return 0;
}

}  // namespace moeroute::fuzz
