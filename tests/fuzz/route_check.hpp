// SPDX-License-Identifier: Apache-2.0
// The routing fuzz harness: decodes a config and a batch of logits from raw bytes
// (fuzz_input.hpp), runs the whole CPU reference (gating, dispatch, both layouts, permute,
// combine, stats, losses) and checks every invariant the library promises
// (tests/common/invariants.hpp, docs/reliability.md) plus what only raw inputs can tell (the
// non-finite count, the top-k of plain logits). Shared by the libFuzzer target (fuzz_route.cpp,
// built with clang) and by the corpus replay test in the normal test run
// (tests/reference/fuzz_corpus_test.cpp, built with the default compiler).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <moeroute/reference.hpp>

#include "../common/invariants.hpp"
#include "fuzz_input.hpp"

#ifndef MOEROUTE_FUZZ_FAIL
/// What a violated invariant does: print it and trap (libFuzzer records the input as a crash).
#define MOEROUTE_FUZZ_FAIL(what)                                                            \
  do {                                                                                      \
    std::fprintf(stderr, "moeroute fuzz: invariant violated: %s (%s:%d)\n", what, __FILE__, \
                 __LINE__);                                                                 \
    __builtin_trap();                                                                       \
  } while (0)
#endif
#define MOEROUTE_FUZZ_CHECK(cond)           \
  do {                                      \
    if (!(cond)) MOEROUTE_FUZZ_FAIL(#cond); \
  } while (0)
/// Fails with the checker's message unless it returned "".
#define MOEROUTE_FUZZ_EXPECT_NONE(violation)                         \
  do {                                                               \
    const std::string moeroute_v = (violation);                      \
    if (!moeroute_v.empty()) MOEROUTE_FUZZ_FAIL(moeroute_v.c_str()); \
  } while (0)

namespace moeroute::fuzz {

/// `fn` must throw moeroute::error with `code`.
template <class F>
bool throws_code(F&& fn, status_code code) {
  try {
    fn();
  } catch (const error& e) {
    return e.get_status().code == code;
  }
  return false;
}

/// What only the raw logits tell: the non-finite count and, when selection is on the plain
/// logits, an independent top-k (sanitised logits, larger first, ties to the lower index).
inline void check_against_logits(const decoded_case& c, const reference::gating_output& g) {
  const routing_config& cfg = c.cfg;
  const std::int32_t E = cfg.num_experts, k = cfg.top_k, R = cfg.reroute_candidates();
  const bool plain_selection = cfg.gating.select == select_from::logits && !cfg.noise_active() &&
                               !cfg.gating.expert_bias && cfg.gating.group_limit.groups <= 1 &&
                               cfg.gating.second_expert.policy != second_expert_policy::sampling;
  std::int64_t nonfinite = 0;
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    std::vector<float> x(E);
    for (std::int32_t e = 0; e < E; ++e) {
      const float raw = logit_at(c, t * E + e);
      if (!std::isfinite(raw)) ++nonfinite;
      x[e] = std::isnan(raw) ? -FLT_MAX : std::clamp(raw, -FLT_MAX, FLT_MAX);
    }
    if (!plain_selection) continue;
    const auto better = [&](std::int32_t a, std::int32_t b) {
      return x[a] > x[b] || (x[a] == x[b] && a < b);
    };
    const auto ranked = [&](std::int32_t j) {
      return j < k ? g.ids[t * k + j] : g.reroute_ids[t * R + j - k];
    };
    std::vector<std::uint8_t> seen(E, 0);
    for (std::int32_t j = 0; j < k + R; ++j) {
      seen[ranked(j)] = 1;
      if (j + 1 < k + R) MOEROUTE_FUZZ_CHECK(better(ranked(j), ranked(j + 1)));
    }
    for (std::int32_t e = 0; e < E; ++e)
      if (!seen[e]) MOEROUTE_FUZZ_CHECK(better(ranked(k + R - 1), e));
  }
  MOEROUTE_FUZZ_CHECK(g.nonfinite_logits == nonfinite);
}

/// Both layouts, permute and combine with identity experts, and the statistics.
inline void check_layouts(const decoded_case& c, const reference::dispatch_output& d) {
  const routing_config& cfg = c.cfg;
  const std::int64_t T = c.tokens, dh = c.hidden;
  const std::int32_t k = cfg.top_k;
  std::vector<float> x(static_cast<std::size_t>(T * dh));
  for (std::int64_t i = 0; i < T * dh; ++i) x[i] = static_cast<float>(i % 251) * 0.25f - 7.0f;
  std::vector<float> y_first;
  for (layout_kind kind : {layout_kind::padded, layout_kind::compact}) {
    const bool padded = kind == layout_kind::padded;
    if (padded && d.capacity < 0) {
      MOEROUTE_FUZZ_CHECK(
          throws_code([&] { (void)reference::layout(cfg, d, kind); }, status_code::unsupported));
      continue;
    }
    const std::int64_t groups = cfg.capacity_groups(T);
    if (padded && d.capacity * groups * d.total_experts > (std::int64_t{1} << 16))
      continue;  // keep buffers small
    if (padded) ++reach().padded;
    const auto L = reference::layout(cfg, d, kind, padded ? 1 : c.block_size);
    MOEROUTE_FUZZ_EXPECT_NONE(test::layout_violation(d, L, groups));
    std::vector<float> permuted(static_cast<std::size_t>(L.num_rows * dh), -1.0f);
    reference::permute<float>(cfg, L, x, T, dh, permuted);
    for (std::int64_t row = 0; row < L.num_rows; ++row)
      for (std::int64_t col = 0; col < dh; ++col) {
        const std::int32_t t = L.row_token[row];
        MOEROUTE_FUZZ_CHECK(permuted[row * dh + col] == (t < 0 ? 0.0f : x[t * dh + col]));
      }
    // identity experts: y[t] = sum_j w_j x[t] in rank order; residual passes x through
    std::vector<float> y(static_cast<std::size_t>(T * dh), -1.0f);
    reference::combine<float>(cfg, L, d, permuted, dh, x, y);
    std::int64_t fully = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      bool any = false;
      for (std::int32_t j = 0; j < k; ++j) any = any || d.expert[t * k + j] >= 0;
      const bool live = d.fates[t * k] != fate::masked;
      fully += !any && live ? 1 : 0;
      const bool pass = cfg.dispatch.dropped == drop_policy::residual && !any && live;
      for (std::int64_t col = 0; col < dh; ++col) {
        float acc = 0.0f;
        for (std::int32_t j = 0; j < k; ++j)
          if (d.expert[t * k + j] >= 0) acc += d.weight[t * k + j] * x[t * dh + col];
        MOEROUTE_FUZZ_CHECK(y[t * dh + col] == (pass ? x[t * dh + col] : acc));
      }
    }
    if (y_first.empty()) y_first = y;
    MOEROUTE_FUZZ_CHECK(y_first == y);  // both layouts give the same combine
    const auto st = reference::compute_stats(d, L);
    MOEROUTE_FUZZ_CHECK(st.assignments == T * k && st.kept == d.total_kept &&
                        st.dropped == d.total_dropped && st.rerouted == d.total_rerouted &&
                        st.masked == d.total_masked);
    MOEROUTE_FUZZ_CHECK(st.drop_rate >= 0.0 && st.drop_rate <= 1.0);
    MOEROUTE_FUZZ_CHECK(st.padding_waste >= 0.0 && st.padding_waste <= 1.0);
    MOEROUTE_FUZZ_CHECK(st.rows == L.num_rows && st.empty_rows == L.padding_rows());
    MOEROUTE_FUZZ_CHECK(st.dead_experts >= 0 && st.dead_experts <= cfg.num_experts);
    MOEROUTE_FUZZ_CHECK(st.fully_dropped_tokens == fully);
  }
}

/// One fuzz input: decode, route, check. Returns 0 (libFuzzer's convention).
inline int route_one(const std::uint8_t* data, std::size_t size) {
  byte_reader in(data, size);
  decoded_case c = decode(in);
  ++reach().inputs;
  const routing_config& cfg = c.cfg;

  // validate() must answer for any config without crashing, with a message naming the field.
  const status vs = validate(cfg);
  if (!vs.ok()) {
    ++reach().bad_config;
    MOEROUTE_FUZZ_CHECK(vs.code == status_code::invalid_config && !vs.message.empty());
    MOEROUTE_FUZZ_CHECK(throws_code([&] { (void)reference::gating(cfg, std::vector<float>{}, 0); },
                                    status_code::invalid_config));
    return 0;
  }
  const status ts = validate_tokens(cfg, c.tokens);
  if (!ts.ok()) {
    ++reach().bad_tokens;
    MOEROUTE_FUZZ_CHECK(ts.code == status_code::invalid_shape && !ts.message.empty());
    MOEROUTE_FUZZ_CHECK(
        throws_code([&] { (void)reference::gating(cfg, std::vector<float>{}, c.tokens); },
                    status_code::invalid_shape));
    return 0;
  }
  decode_data(in, c);
  bool bias_ok = true;
  for (float b : c.bias) bias_ok = bias_ok && std::isfinite(b);

  reference::routing_result r;
  try {
    r = run_route(c);
  } catch (const error& e) {
    // the only input this harness can make invalid here is a non-finite expert bias
    MOEROUTE_FUZZ_CHECK(!bias_ok && e.get_status().code == status_code::invalid_argument);
    ++reach().bad_bias;
    return 0;
  }
  ++reach().routed;
  MOEROUTE_FUZZ_CHECK(bias_ok);
  const auto& g = r.gating;
  const auto& d = r.dispatch;
  MOEROUTE_FUZZ_CHECK(g.tokens == c.tokens);
  MOEROUTE_FUZZ_EXPECT_NONE(test::gating_violation(cfg, g));
  check_against_logits(c, g);
  MOEROUTE_FUZZ_EXPECT_NONE(test::dispatch_violation(cfg, g, d));
  if (d.total_dropped > 0) ++reach().with_drops;
  if (d.total_rerouted > 0) ++reach().with_reroutes;

  // losses: finite, non-negative, over the valid tokens, and reproducible from their sums
  const auto& l = r.losses;
  MOEROUTE_FUZZ_CHECK(std::isfinite(l.aux.value) && l.aux.value >= 0.0);
  MOEROUTE_FUZZ_CHECK(std::isfinite(l.sequence_aux) && l.sequence_aux >= 0.0);
  MOEROUTE_FUZZ_CHECK(std::isfinite(l.z.value) && l.z.value >= 0.0);
  MOEROUTE_FUZZ_CHECK(l.aux.tokens == g.valid_tokens && l.z.tokens == g.valid_tokens);
  MOEROUTE_FUZZ_CHECK(reference::aux_loss_from_sums(cfg, l.aux.score_sum, l.aux.counts,
                                                    l.aux.tokens) == l.aux.value);

  check_layouts(c, d);
  return 0;
}

}  // namespace moeroute::fuzz
