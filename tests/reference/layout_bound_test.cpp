// SPDX-License-Identifier: Apache-2.0
// The compact layout's row bound is tight: aligned_rows_bound equals the largest row count any
// distribution of assignments over segments can need (brute force over small shapes), and for
// dropless routing a routing that needs exactly compact_max_rows rows exists — built here and
// laid out by the reference.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include <moeroute/layout_rows.hpp>
#include <moeroute/reference.hpp>

namespace moeroute::test {
namespace {

/// The largest sum over S segments of b * ceil(n_s / b) with 0 <= n_s <= U and sum n_s <= N:
/// dynamic programming over segments (best[used] = most rows with `used` assignments).
std::int64_t brute_force_rows(std::int64_t N, std::int64_t S, std::int64_t U, std::int64_t b) {
  std::vector<std::int64_t> best(static_cast<std::size_t>(N + 1), -1);
  best[0] = 0;
  for (std::int64_t s = 0; s < S; ++s) {
    std::vector<std::int64_t> next(best.size(), -1);
    for (std::int64_t used = 0; used <= N; ++used) {
      if (best[used] < 0) continue;
      for (std::int64_t n = 0; n <= U && used + n <= N; ++n)
        next[used + n] = std::max(next[used + n], best[used] + (n + b - 1) / b * b);
    }
    best = next;
  }
  return *std::max_element(best.begin(), best.end());
}

/// Per-expert loads that need aligned_rows_bound(T k, E, T, b) rows: one row on each of
/// min(E, T k) experts, then whole blocks where there is room, then the rest where it opens no
/// block.
std::vector<std::int64_t> worst_loads(std::int64_t T, std::int32_t k, std::int32_t E,
                                      std::int64_t b) {
  const std::int64_t N = T * k;
  std::vector<std::int64_t> n(static_cast<std::size_t>(E), 0);
  std::int64_t left = N;
  for (std::int32_t e = 0; e < E && left > 0; ++e, --left) n[e] = 1;
  for (bool grew = true; grew && left >= b;) {
    grew = false;
    for (std::int32_t e = 0; e < E && left >= b; ++e)
      if (n[e] > 0 && n[e] + b <= T) {
        n[e] += b;
        left -= b;
        grew = true;
      }
  }
  for (std::int32_t e = 0; e < E && left > 0; ++e) {
    const std::int64_t blocks_end = std::min<std::int64_t>(T, (n[e] + b - 1) / b * b);
    const std::int64_t add = std::min(left, blocks_end - n[e]);
    n[e] += add;
    left -= add;
  }
  REQUIRE(left == 0);
  return n;
}

/// A routing [T, k] with those loads and distinct experts per token: the loads laid end to end,
/// entry i to token i % T (every load is at most T, so a token never meets an expert twice).
std::vector<std::int32_t> ids_with_loads(std::int64_t T, std::int32_t k,
                                         const std::vector<std::int64_t>& n) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T * k), -1);
  std::int64_t i = 0;
  for (std::size_t e = 0; e < n.size(); ++e)
    for (std::int64_t c = 0; c < n[e]; ++c, ++i)
      ids[(i % T) * k + i / T] = static_cast<std::int32_t>(e);
  return ids;
}

}  // namespace

TEST_CASE("aligned_rows_bound is the exact worst case", "[reference][layout]") {
  int cases = 0;
  for (std::int64_t N = 0; N <= 12; ++N)
    for (std::int64_t S = 1; S <= 5; ++S)
      for (std::int64_t U = 1; U <= 6; ++U)
        for (std::int64_t b = 1; b <= 5; ++b) {
          if (N > S * U) continue;  // more assignments than the segments hold
          INFO("N " << N << " S " << S << " U " << U << " b " << b);
          REQUIRE(aligned_rows_bound(N, S, U, b) == brute_force_rows(N, S, U, b));
          ++cases;
        }
  CHECK(cases > 1000);
}

TEST_CASE("compact_max_rows: tight, never above vLLM's sizing, and needed by a real routing",
          "[reference][layout]") {
  struct shape {
    std::int64_t T;
    std::int32_t E, k;
    std::int64_t b;
  };
  // decode (T k < E), T <= b, many tokens, and a single expert
  const shape shapes[] = {{1, 64, 2, 16},  {3, 64, 2, 16},    {5, 256, 8, 64},  {4, 4, 4, 4},
                          {6, 8, 2, 4},    {100, 8, 2, 16},   {257, 32, 4, 32}, {33, 1, 1, 8},
                          {64, 128, 8, 1}, {1000, 60, 6, 128}};
  for (const auto& s : shapes) {
    INFO("T " << s.T << " E " << s.E << " k " << s.k << " block " << s.b);
    routing_config cfg;
    cfg.num_experts = s.E;
    cfg.top_k = s.k;
    cfg.capacity.mode = capacity_mode::unbounded;
    const std::int64_t bound = compact_max_rows(cfg, s.T, s.b);
    const std::int64_t numel = s.T * s.k;
    const std::int64_t vllm = numel < s.E ? numel * s.b : numel + s.E * (s.b - 1);
    CHECK(bound <= vllm);
    CHECK(bound % s.b == 0);
    // the worst routing, as ids an engine chose: every row of the bound is used
    const auto ids = ids_with_loads(s.T, s.k, worst_loads(s.T, s.k, s.E, s.b));
    const std::vector<float> gates(ids.size(), 0.5f);
    const auto g = reference::routing_from_ids(cfg, {ids, gates});
    const auto L = reference::layout(cfg, reference::dispatch(cfg, g), layout_kind::compact, s.b);
    CHECK(L.num_rows == bound);
  }
}

}  // namespace moeroute::test
