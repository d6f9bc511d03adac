// SPDX-License-Identifier: Apache-2.0
// The stages after gating on an engine's own top-k (ids and gates chosen elsewhere, never
// from moeroute's gating): reference::routing_from_ids + reference::dispatch against
// cpu::dispatch on the same arrays over every priority, drop policy, slot order and capacity
// mode, then both layouts; the errors bad ids get in each backend; and vLLM's
// moe_align_block_size reproduced from given ids by the compact layout, with and without its
// expert_map (the local-expert view of the layout).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <moeroute/cpu/dispatch.hpp>
#include <moeroute/cpu/layout.hpp>
#include <moeroute/reference.hpp>

#include "../common/dispatch_cases.hpp"
#include "../common/dispatch_compare.hpp"
#include "dispatch_harness.hpp"
#include "layout_harness.hpp"

namespace moeroute::test {
namespace {

/// An engine's routing: distinct experts per token (k ids, then R reroute candidates), half
/// of the first choices on the lowest free expert so that capacity drops, gates in (0, 1).
struct given {
  std::vector<std::int32_t> ids, reroute;
  std::vector<float> gates, priority;
  std::vector<std::uint8_t> skipped, valid;

  given(const routing_config& cfg, std::int64_t T, std::uint64_t seed, bool masked) {
    lcg r(seed);
    const std::int32_t E = cfg.num_experts, k = cfg.top_k, R = cfg.reroute_candidates();
    for (std::int64_t t = 0; t < T; ++t) {
      std::vector<std::int32_t> pool(static_cast<std::size_t>(E));
      for (std::int32_t e = 0; e < E; ++e) pool[e] = e;
      for (std::int32_t j = 0; j < k + R; ++j) {
        const std::size_t at = r.next() % 2 == 0 ? 0 : r.next() % pool.size();
        (j < k ? ids : reroute).push_back(pool[at]);
        pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(at));
      }
      for (std::int32_t j = 0; j < k; ++j) gates.push_back(r.uniform(0.01f, 1.0f));
      if (cfg.dispatch.prio == priority::batch_prioritized)
        priority.push_back(r.uniform(0.0f, 1.0f));
      if (cfg.gating.second_expert.policy == second_expert_policy::random)
        skipped.push_back(static_cast<std::uint8_t>(r.next() % 2));
    }
    if (masked) valid = make_valid(T);
  }

  [[nodiscard]] reference::given_routing view() const {
    return {ids, gates, reroute, priority, skipped, valid};
  }
};

void check_given(std::int64_t T, std::int32_t E, std::int32_t k, const case_spec& s,
                 std::uint64_t seed) {
  INFO(describe(s, T, E, k));
  const routing_config cfg = make_config(E, k, s, T);
  const given in(cfg, T, seed, s.masked);
  const auto g = reference::routing_from_ids(cfg, in.view());
  REQUIRE(g.tokens == T);
  const auto want = reference::dispatch(cfg, g);
  cpu_dispatch c(cfg, g, s.masked);
  const auto st = c.run();
  INFO(st.message);
  REQUIRE(st.ok());
  require_matches(c.h, want);
  // both layouts of the given routing
  const dispatch_view dv{want, want.totals()};
  for (const auto kind : {layout_kind::padded, layout_kind::compact}) {
    if (kind == layout_kind::padded && cfg.capacity.mode == capacity_mode::unbounded) continue;
    const std::int64_t block = kind == layout_kind::compact ? 4 : 1;
    const auto L = reference::layout(cfg, want, kind, block);
    cpu_layout cl(cfg, dv.view(), T, kind, block);
    REQUIRE(cpu::layout(cfg, cl.p).ok());
    REQUIRE(cl.num_rows == L.num_rows);
    require_same("offsets", cl.offsets, L.offsets);
    require_same("assignment_row", cl.assignment_row, L.assignment_row);
    const std::vector<std::int32_t> used(cl.row_token.begin(), cl.row_token.begin() + L.num_rows);
    require_same("row_token", used, L.row_token);
  }
}

}  // namespace

TEST_CASE("external ids: dispatch and layouts of a routing chosen elsewhere, cpu == reference",
          "[cpu][dispatch][external]") {
  struct shape {
    std::int64_t T;
    std::int32_t E, k;
  };
  const shape shapes[] = {{1, 6, 2},   {7, 6, 2},     {300, 60, 4},
                          {300, 8, 8}, {1000, 64, 1}, {96, 60, 2}};
  int i = 0;
  for (const auto& sh : shapes)
    for (int j = 0; j < 40; ++j, ++i) check_given(sh.T, sh.E, sh.k, spec_for(i), 77 + i);
  CHECK(i == 240);
}

TEST_CASE("external ids: bad ids and gates get an error naming the element in every backend",
          "[cpu][dispatch][external]") {
  routing_config cfg = presets::megatron(8, 2);
  const std::vector<std::int32_t> ids = {0, 1, 2, 3, 4, 5};
  const std::vector<float> gates = {0.5f, 0.5f, 0.6f, 0.4f, 0.9f, 0.1f};
  const auto ref_error = [&](const reference::given_routing& r) -> std::string {
    try {
      (void)reference::routing_from_ids(cfg, r);
    } catch (const error& e) {
      return e.what();
    }
    return "no error";
  };
  const auto cpu_error = [&](std::vector<std::int32_t> i, std::vector<float> g,
                             std::vector<std::int32_t> reroute = {}) -> std::string {
    reference::gating_output out;  // the harness reads the arrays through this
    out.tokens = static_cast<std::int64_t>(i.size()) / cfg.top_k;
    out.ids = std::move(i);
    out.gates = std::move(g);
    out.reroute_ids = std::move(reroute);
    out.valid.assign(static_cast<std::size_t>(out.tokens), 1);
    cpu_dispatch c(cfg, out, false);
    const status s = c.run();
    return s.ok() ? "no error" : s.message;
  };
  using Catch::Matchers::Contains;
  CHECK(ref_error({ids, gates}) == "no error");
  CHECK(cpu_error(ids, gates) == "no error");
  CHECK_THAT(ref_error({std::vector<std::int32_t>(ids.begin(), ids.begin() + 5), gates}),
             Contains("ids has 5 elements: not a multiple of top_k = 2"));
  CHECK_THAT(ref_error({ids, std::vector<float>(gates.begin(), gates.begin() + 4)}),
             Contains("gating_output.gates has 4 elements, expected 6"));
  auto bad = ids;
  bad[3] = 8;
  CHECK_THAT(ref_error({bad, gates}), Contains("gating_output.ids[3] = 8 is outside"));
  CHECK_THAT(cpu_error(bad, gates), Contains("gated.d_ids[3] is outside [0, num_experts)"));
  bad = ids;
  bad[5] = 4;  // token 2 names expert 4 twice
  CHECK_THAT(ref_error({bad, gates}),
             Contains("gating_output.ids[5] = 4: token 2 names that expert twice"));
  CHECK_THAT(cpu_error(bad, gates),
             Contains("gated.d_ids[5] = 4: token 2 names that expert twice"));
  auto nan_gates = gates;
  nan_gates[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(ref_error({ids, nan_gates}), Contains("gating_output.gates[1] is not finite"));
  CHECK_THAT(cpu_error(ids, nan_gates), Contains("gated.d_gates[1] is not finite"));
  // an array the config reads, missing; and reroute candidates that repeat an id
  cfg.dispatch.prio = priority::batch_prioritized;
  CHECK_THAT(ref_error({ids, gates}), Contains("gating_output.token_priority has 0 elements"));
  cfg = presets::megatron(8, 2);
  cfg.dispatch.dropped = drop_policy::next_choice;
  cfg.dispatch.reroute.max_candidates = 1;
  const std::vector<std::int32_t> reroute = {7, 3, 6};  // token 1 chose 2 and 3 already
  CHECK_THAT(ref_error({ids, gates, reroute}),
             Contains("gating_output.reroute_ids[1] = 3: token 1 names that expert twice"));
  CHECK_THAT(cpu_error(ids, gates, reroute),
             Contains("gated.d_reroute_ids[1] = 3: token 1 already names that expert"));
}

namespace {

/// vLLM's moe_align_block_size, as its test's golden torch implementation defines it
/// (tests/kernels/moe/test_moe_align_block_size.py): the flat assignment indices t * k + j
/// stably sorted by expert; each non-empty expert's run padded to a multiple of the block with
/// the sentinel numel; the expert of every block, -1 past the last; the padded row count.
struct vllm_align {
  std::vector<std::int32_t> sorted_ids, expert_ids;
  std::int64_t post_pad = 0;
};

/// vLLM's test topk_ids [T, k]: per token, the first k of a random permutation of the experts.
std::vector<std::int32_t> vllm_topk_ids(std::int64_t T, std::int32_t E, std::int32_t k,
                                        std::uint64_t seed) {
  lcg r(seed);
  std::vector<std::int32_t> ids;
  std::vector<std::int32_t> perm(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int32_t e = 0; e < E; ++e) perm[e] = e;
    for (std::int32_t j = 0; j < k; ++j) {
      std::swap(perm[j], perm[j + r.next() % (E - j)]);
      ids.push_back(perm[j]);
    }
  }
  return ids;
}

vllm_align vllm_golden(const std::vector<std::int32_t>& topk_ids, std::int32_t E,
                       std::int64_t block, std::int64_t buffer_rows) {
  const auto numel = static_cast<std::int32_t>(topk_ids.size());
  vllm_align v;
  v.sorted_ids.assign(static_cast<std::size_t>(buffer_rows), numel);
  v.expert_ids.assign(static_cast<std::size_t>(buffer_rows / block), -1);
  std::int64_t pos = 0;
  for (std::int32_t e = 0; e < E; ++e) {
    std::int64_t n = 0;
    for (std::int32_t a = 0; a < numel; ++a)
      if (topk_ids[a] == e) v.sorted_ids[pos + n++] = a;
    const std::int64_t padded = (n + block - 1) / block * block;
    for (std::int64_t b = pos / block; b < (pos + padded) / block; ++b) v.expert_ids[b] = e;
    pos += padded;
  }
  v.post_pad = pos;
  return v;
}

}  // namespace

TEST_CASE("external ids: vLLM's moe_align_block_size from the compact layout",
          "[cpu][layout][external]") {
  // vLLM's test grid (NUM_TOKENS x NUM_EXPERTS x TOP_KS x BLOCK_SIZES), its topk_ids: a random
  // permutation's first k per token; the block size cycles through the grid's
  int i = 0;
  const std::int64_t blocks[] = {32, 64, 128, 256};
  for (std::int64_t T : {1, 3, 7, 16, 256, 2256, 4096})
    for (std::int32_t E : {32, 160, 256, 257, 512})
      for (std::int32_t k : {1, 2, 16, 32}) {
        const std::int64_t block = blocks[i++ % 4];
        INFO("T " << T << " E " << E << " k " << k << " block " << block);
        routing_config cfg;
        cfg.num_experts = E;
        cfg.top_k = k;
        cfg.capacity.mode = capacity_mode::unbounded;  // vLLM's fused MoE is dropless
        const auto ids = vllm_topk_ids(T, E, k, static_cast<std::uint64_t>(i));
        const std::vector<float> gates(ids.size(), 1.0f / static_cast<float>(k));
        // moeroute: the CPU backend's dispatch and compact layout of those ids
        const auto g = reference::routing_from_ids(cfg, {ids, gates});
        cpu_dispatch c(cfg, g, false);
        REQUIRE(c.run().ok());
        const const_dispatch_result dv{
            c.h.expert.data(),    c.h.slot.data(), c.h.weight.data(),   c.h.fates.data(),
            c.h.requested.data(), c.h.kept.data(), c.h.rerouted.data(), c.h.dropped.data(),
            c.h.received.data(),  c.h.load.data(), &c.h.totals};
        cpu_layout cl(cfg, dv, T, layout_kind::compact, block);
        REQUIRE(cpu::layout(cfg, cl.p).ok());
        // vLLM's outputs, read off the layout: row -> flat assignment, block -> expert
        const std::int64_t numel = T * k;
        const std::int64_t vllm_rows =
            numel < E ? numel * block : numel + std::int64_t{E} * (block - 1);
        REQUIRE(cl.p.max_rows <= vllm_rows);  // moeroute's bound is never looser
        const vllm_align want = vllm_golden(ids, E, block, vllm_rows);
        REQUIRE(cl.num_rows == want.post_pad);
        std::vector<std::int32_t> sorted(static_cast<std::size_t>(cl.num_rows),
                                         static_cast<std::int32_t>(numel));
        for (std::int64_t a = 0; a < numel; ++a)
          sorted[cl.assignment_row[a]] = static_cast<std::int32_t>(a);
        require_same("sorted_token_ids", sorted,
                     std::vector<std::int32_t>(want.sorted_ids.begin(),
                                               want.sorted_ids.begin() + cl.num_rows));
        const std::size_t nblocks = cl.block_expert.size();
        require_same("expert_ids", cl.block_expert,
                     std::vector<std::int32_t>(
                         want.expert_ids.begin(),
                         want.expert_ids.begin() + static_cast<std::ptrdiff_t>(nblocks)));
      }
  CHECK(i == 140);
}

namespace {

/// Expert maps over ET experts: vLLM's test map (every even expert, in order), one rank's
/// contiguous block of three, and a permuted half.
std::vector<std::vector<std::int32_t>> expert_maps(std::int32_t ET) {
  std::vector<std::vector<std::int32_t>> maps(3, std::vector<std::int32_t>(ET, -1));
  std::int32_t l = 0;
  for (std::int32_t e = 0; e < ET; e += 2) maps[0][e] = l++;
  const std::int32_t per = (ET + 2) / 3;
  for (std::int32_t e = per; e < std::min(ET, 2 * per); ++e) maps[1][e] = e - per;
  l = 0;
  for (std::int32_t e = ET - 1; e >= 0; e -= 2) maps[2][e] = l++;
  return maps;
}

/// The local layout of `map` by the CPU backend against reference::local_layout.
void check_local(const routing_config& cfg, const reference::dispatch_output& d,
                 const std::vector<std::int32_t>& map, std::int64_t block) {
  const auto want = reference::local_layout(cfg, d, block, map);
  const dispatch_view dv{d, d.totals()};
  cpu_layout cl(cfg, dv.view(), d.tokens, layout_kind::compact, block);
  std::int64_t nonlocal = -5;
  cl.p.d_expert_map = map.data();
  cl.p.local_experts = want.total_experts;
  cl.p.out.d_nonlocal = &nonlocal;
  const status st = cpu::layout(cfg, cl.p);
  INFO(st.message);
  REQUIRE(st.ok());
  REQUIRE(cl.num_rows == want.num_rows);
  CHECK(nonlocal == want.nonlocal);
  const auto L = static_cast<std::size_t>(want.total_experts);
  require_same("offsets", std::vector<std::int64_t>(cl.offsets.begin(), cl.offsets.begin() + L + 1),
               want.offsets);
  require_same("rows_used",
               std::vector<std::int64_t>(cl.rows_used.begin(), cl.rows_used.begin() + L),
               want.rows_used);
  require_same("assignment_row", cl.assignment_row, want.assignment_row);
  require_same(
      "row_token",
      std::vector<std::int32_t>(cl.row_token.begin(), cl.row_token.begin() + want.num_rows),
      want.row_token);
  require_same("block_expert",
               std::vector<std::int32_t>(cl.block_expert.begin(),
                                         cl.block_expert.begin() + want.num_rows / block),
               want.block_expert);
  for (std::size_t b = static_cast<std::size_t>(want.num_rows / block); b < cl.block_expert.size();
       ++b)
    REQUIRE(cl.block_expert[b] == -1);
}

}  // namespace

TEST_CASE("external ids: the local-expert view of the compact layout, cpu == reference",
          "[cpu][layout][external]") {
  int i = 0;
  for (const std::int64_t T : {7, 300})
    for (int j = 0; j < 24; ++j, ++i) {
      const case_spec s = spec_for(i);
      INFO(describe(s, T, 12, 3));
      const routing_config cfg = make_config(12, 3, s, T);
      const given in(cfg, T, 900 + i, s.masked);
      const auto d = reference::dispatch(cfg, reference::routing_from_ids(cfg, in.view()));
      for (const auto& map : expert_maps(cfg.total_experts())) check_local(cfg, d, map, 4);
      // ranks that split the experts: each held row is in exactly one rank's layout
      std::int64_t rows_used = 0, held = 0;
      const std::int32_t ET = cfg.total_experts(), R = 3, per = (ET + R - 1) / R;
      for (std::int32_t r = 0; r < R; ++r) {
        std::vector<std::int32_t> map(ET, -1);
        for (std::int32_t e = r * per; e < std::min(ET, (r + 1) * per); ++e) map[e] = e - r * per;
        const auto L = reference::local_layout(cfg, d, 4, map);
        for (const auto u : L.rows_used) rows_used += u;
        for (const auto row : L.assignment_row) held += row >= 0 ? 1 : 0;
        CHECK(L.nonlocal + std::count_if(L.assignment_row.begin(), L.assignment_row.end(),
                                         [](std::int64_t x) { return x >= 0; }) ==
              d.total_kept + d.total_rerouted);
      }
      std::int64_t load = 0;
      for (const auto v : d.load) load += v;
      CHECK(rows_used == load);
      CHECK(held == d.total_kept + d.total_rerouted);
    }
}

TEST_CASE("external ids: vLLM's moe_align_block_size with an expert_map",
          "[cpu][layout][external]") {
  // vLLM's test_moe_align_block_size_with_expert_map grid: m in {16, 32, 2048}, topk in {2, 4},
  // E in {8, 64}, block 64, the even experts local (expert_map[e] = e / 2, else -1). Its golden
  // skips the other experts entirely and names blocks by local id.
  int i = 0;
  for (const std::int64_t T : {16, 32, 2048})
    for (const std::int32_t k : {2, 4})
      for (const std::int32_t E : {8, 64}) {
        INFO("T " << T << " k " << k << " E " << E);
        routing_config cfg;
        cfg.num_experts = E;
        cfg.top_k = k;
        cfg.capacity.mode = capacity_mode::unbounded;
        const std::int64_t block = 64;
        const auto ids = vllm_topk_ids(T, E, k, static_cast<std::uint64_t>(++i));
        std::vector<std::int32_t> map(E, -1);
        for (std::int32_t e = 0; e < E; e += 2) map[e] = e / 2;
        const std::vector<float> gates(ids.size(), 0.5f);
        const auto d = reference::dispatch(cfg, reference::routing_from_ids(cfg, {ids, gates}));
        const dispatch_view dv{d, d.totals()};
        cpu_layout cl(cfg, dv.view(), T, layout_kind::compact, block);
        cl.p.d_expert_map = map.data();
        cl.p.local_experts = E / 2;
        REQUIRE(cpu::layout(cfg, cl.p).ok());
        // vLLM's golden with the map: local experts in order, their flat assignment indices
        // (stable), padded with numel; expert ids are the local ids
        const auto numel = static_cast<std::int32_t>(ids.size());
        std::vector<std::int32_t> sorted, experts;
        for (std::int32_t e = 0; e < E; ++e) {
          if (map[e] < 0) continue;
          std::int64_t n = 0;
          for (std::int32_t a = 0; a < numel; ++a)
            if (ids[a] == e) {
              sorted.push_back(a);
              ++n;
            }
          const std::int64_t padded = (n + block - 1) / block * block;
          sorted.insert(sorted.end(), static_cast<std::size_t>(padded - n), numel);
          experts.insert(experts.end(), static_cast<std::size_t>(padded / block), map[e]);
        }
        REQUIRE(cl.num_rows == static_cast<std::int64_t>(sorted.size()));
        std::vector<std::int32_t> got(sorted.size(), numel);
        for (std::int32_t a = 0; a < numel; ++a)
          if (cl.assignment_row[a] >= 0) got[cl.assignment_row[a]] = a;
        require_same("sorted_token_ids", got, sorted);
        require_same("expert_ids",
                     std::vector<std::int32_t>(
                         cl.block_expert.begin(),
                         cl.block_expert.begin() + static_cast<std::ptrdiff_t>(experts.size())),
                     experts);
      }
}

TEST_CASE("external ids: a bad expert map gets an error naming the entry",
          "[cpu][layout][external]") {
  routing_config cfg = presets::megatron(4, 2);
  cfg.capacity.mode = capacity_mode::factor;  // bounded, so that a padded layout exists
  cfg.capacity.factor = 2.0;
  const std::vector<std::int32_t> ids = {0, 1, 2, 3, 1, 2};
  const std::vector<float> gates(6, 0.5f);
  const auto d = reference::dispatch(cfg, reference::routing_from_ids(cfg, {ids, gates}));
  const dispatch_view dv{d, d.totals()};
  using Catch::Matchers::Contains;
  const auto cpu_error = [&](std::vector<std::int32_t> map, std::int32_t local,
                             layout_kind kind = layout_kind::compact) -> std::string {
    cpu_layout cl(cfg, dv.view(), 3, layout_kind::compact, 1);
    cl.p.kind = kind;
    cl.p.d_expert_map = map.empty() ? nullptr : map.data();
    cl.p.local_experts = local;
    const status s = cpu::layout(cfg, cl.p);
    return s.ok() ? "no error" : s.message;
  };
  CHECK(cpu_error({-1, 0, 1, -1}, 2) == "no error");
  CHECK_THAT(cpu_error({-1, 0, 2, -1}, 2), Contains("d_expert_map[2] = 2 is outside [-1, local"));
  CHECK_THAT(cpu_error({1, 0, 1, -1}, 2),
             Contains("d_expert_map[2] = 1: local index already held by expert 0"));
  CHECK_THAT(cpu_error({-1, 0, -1, -1}, 2), Contains("no expert has local index 1"));
  CHECK_THAT(cpu_error({-1, 0, 1, -1}, 2, layout_kind::padded),
             Contains("a local-expert view is a compact layout"));
  CHECK_THAT(cpu_error({}, 2), Contains("local_experts = 2: only read with d_expert_map"));
  CHECK_THAT(cpu_error({-1, 0, 1, -1}, 5), Contains("local_experts = 5: must be in [1"));
  try {
    (void)reference::local_layout(cfg, d, 1, std::vector<std::int32_t>{0, 0, -1, -1});
    FAIL("no error");
  } catch (const error& e) {
    CHECK_THAT(e.what(), Contains("expert_map[1] = 0: local index already held by expert 0"));
  }
}

}  // namespace moeroute::test
