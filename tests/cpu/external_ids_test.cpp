// SPDX-License-Identifier: Apache-2.0
// The stages after gating on an engine's own top-k (ids and gates chosen elsewhere, never
// from moeroute's gating): reference::routing_from_ids + reference::dispatch against
// cpu::dispatch on the same arrays over every priority, drop policy, slot order and capacity
// mode, then both layouts; the errors bad ids get in each backend; and vLLM's
// moe_align_block_size reproduced from given ids by the compact layout.
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
    const std::int32_t E = cfg.num_experts, k = cfg.top_k, R = cfg.candidates_per_token() - k;
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
        lcg r(static_cast<std::uint64_t>(i));
        std::vector<std::int32_t> ids;
        for (std::int64_t t = 0; t < T; ++t) {
          std::vector<std::int32_t> perm(static_cast<std::size_t>(E));
          for (std::int32_t e = 0; e < E; ++e) perm[e] = e;
          for (std::int32_t j = 0; j < k; ++j) {
            std::swap(perm[j], perm[j + r.next() % (E - j)]);
            ids.push_back(perm[j]);
          }
        }
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

}  // namespace moeroute::test
