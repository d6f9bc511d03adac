// SPDX-License-Identifier: Apache-2.0
// Hand-worked cases for the routing rules the HuggingFace families need (issue: every peer's
// routing, exactly): the group-score rules, the capacity formulas, batch-prioritised routing
// and capacity groups — each on a batch small enough to check by hand. That a group is
// routed on its own is batch_composition_test.cpp's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <moeroute/names.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>
#include <moeroute/rng.hpp>

#include "../common/invariants.hpp"
#include "../common/test_util.hpp"

using namespace moeroute;
using moeroute::test::dist;

namespace {

std::vector<std::int32_t> sorted_ids(const reference::gating_output& g, std::int64_t t) {
  std::vector<std::int32_t> v(g.ids.begin() + t * g.k, g.ids.begin() + (t + 1) * g.k);
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("group score: sum of the top k/group_topk, of the top n, or the max",
          "[reference][hand][group_score]") {
  // 9 experts in 3 groups of 3, one group kept, top-3 on the logits.
  //   group 0 = [5, 0, 0]      max 5    top-2 5    top-3 5
  //   group 1 = [3, 3, 0]      max 3    top-2 6    top-3 6
  //   group 2 = [2, 2, 2.5]    max 2.5  top-2 4.5  top-3 6.5
  const std::vector<float> x = {5, 0, 0, 3, 3, 0, 2, 2, 2.5f};
  routing_config c;
  c.num_experts = 9;
  c.top_k = 3;
  c.gating.select = select_from::logits;
  c.capacity.mode = capacity_mode::unbounded;
  c.gating.group_limit = {3, 1, group_score::sum_top_k_share, 0};  // top-3 / 1 = top-3
  CHECK(sorted_ids(reference::gating(c, x, 1), 0) == std::vector<std::int32_t>{6, 7, 8});
  c.gating.group_limit = {3, 1, group_score::sum_top_n, 2};  // DeepSeek-V3
  CHECK(sorted_ids(reference::gating(c, x, 1), 0) == std::vector<std::int32_t>{3, 4, 5});
  c.gating.group_limit = {3, 1, group_score::max, 0};  // DeepSeek-V2
  CHECK(sorted_ids(reference::gating(c, x, 1), 0) == std::vector<std::int32_t>{0, 1, 2});

  SECTION("validation names the field") {
    c.gating.group_limit = {3, 1, group_score::sum_top_n, 0};
    test::expect_error([&] { throw_if_error(validate(c)); }, status_code::invalid_config,
                       {"gating.group_limit.top_n", "sum_top_n"});
    c.gating.group_limit = {3, 1, group_score::max, 2};
    test::expect_error([&] { throw_if_error(validate(c)); }, status_code::invalid_config,
                       {"gating.group_limit.top_n", "leave it 0"});
    // the top-n rules need no k % group_topk: k = 3 over 2 groups of 3 experts is fine
    c.gating.group_limit = {3, 2, group_score::sum_top_n, 2};
    CHECK(validate(c).ok());
    c.gating.group_limit = {3, 2, group_score::sum_top_k_share, 0};
    test::expect_error([&] { throw_if_error(validate(c)); }, status_code::invalid_config,
                       {"group_topk", "must divide top_k"});
  }
}

TEST_CASE("capacity formulas of each peer", "[reference][hand][capacity]") {
  // T = 10 tokens over E = 4 experts: T / E = 2.5, ceil 3
  SECTION("NLLB-MoE: 2 * ceil(T / E), not ceil(2T / E)") {
    CHECK(expert_capacity(presets::nllb_moe(4), 10) == 6);
    CHECK(expert_capacity(presets::deepspeed_topk(4, 2, 1.0, 0), 10) == 5);
    presets::nllb_moe_options eval;
    eval.training = false;
    eval.eval_capacity_token_fraction = 0.25;
    CHECK(expert_capacity(presets::nllb_moe(4, eval), 10) == 3);  // ceil(0.25 * 10)
    presets::nllb_moe_options fixed;
    fixed.expert_capacity = 7;
    CHECK(expert_capacity(presets::nllb_moe(4, fixed), 10) == 7);
  }
  SECTION("Tutel: k * floor(f * ceil(T / E))") {
    CHECK(expert_capacity(presets::tutel_topk(4, 2, 1.5), 10) == 8);  // 2 * floor(4.5)
    CHECK(expert_capacity(presets::tutel_topk(4, 2, 1.0), 10) == 6);
  }
  SECTION("flaxformer: max(round(f T / E), 4), ties to even") {
    routing_config c = presets::flaxformer_topk(4, 2, 1.0);
    c.capacity.min_capacity = 0;
    CHECK(expert_capacity(c, 10) == 2);                                    // round(2.5) = 2
    CHECK(expert_capacity(c, 14) == 4);                                    // round(3.5) = 4
    CHECK(expert_capacity(c, 13) == 3);                                    // round(3.25) = 3
    CHECK(expert_capacity(presets::flaxformer_topk(4, 2, 1.0), 10) == 4);  // the minimum
  }
  SECTION("MegaBlocks: floor(f k T / E)") {
    CHECK(expert_capacity(presets::megablocks_topk(4, 2, 1.25), 10) == 6);  // floor(6.25)
  }
  SECTION("a fixed capacity is never raised by a minimum") {
    routing_config c = presets::switch_top1(4);
    c.capacity.mode = capacity_mode::fixed;
    c.capacity.fixed = 2;
    test::expect_error([&] { (void)expert_capacity(c, 10); }, status_code::invalid_config,
                       {"capacity.min_capacity", "fixed"});
    CHECK(expert_capacity(presets::switch_transformers(4, 2), 10) == 2);
  }
  SECTION("k after rounding needs k") {
    routing_config c = presets::tutel_topk(4, 2);
    c.capacity.includes_k = false;
    test::expect_error([&] { throw_if_error(validate(c)); }, status_code::invalid_config,
                       {"capacity.k_after_rounding"});
  }
}

TEST_CASE("batch-prioritised routing: first choices first, by descending top-1 score",
          "[reference][hand][batch_prioritized]") {
  // 3 tokens, 2 experts, top-2, C = 1 per expert.
  //   token 0: logits [1, 0]   top-1 p = 0.731 (expert 0)
  //   token 1: logits [0, 3]   top-1 p = 0.953 (expert 1)
  //   token 2: logits [2, 0]   top-1 p = 0.881 (expert 0)
  const std::vector<float> x = {1, 0, 0, 3, 2, 0};
  routing_config c = presets::nllb_moe(2);
  c.capacity.mode = capacity_mode::fixed;
  c.capacity.fixed = 1;
  c.capacity.share = share_rounding::none;
  c.capacity.k_after_rounding = false;
  c.dispatch.prio = priority::batch_prioritized;
  const auto g = reference::gating(c, x, 3);
  REQUIRE(g.token_priority.size() == 3);
  CHECK(g.token_priority[1] > g.token_priority[2]);
  CHECK(g.token_priority[2] > g.token_priority[0]);
  const auto d = reference::dispatch(c, g);
  // expert 0: first choices of tokens 2 (0.881) and 0 (0.731) -> token 2 wins
  CHECK(d.fates[2 * 2 + 0] == fate::kept);
  CHECK(d.fates[0 * 2 + 0] == fate::dropped);
  // expert 1: token 1's first choice; the second choices all come after every first choice
  CHECK(d.fates[1 * 2 + 0] == fate::kept);
  CHECK(d.total_kept == 2);

  // choice-major (NLLB without batch_prioritized_routing) serves token 0 first
  c.dispatch.prio = priority::choice_major;
  const auto d2 = reference::dispatch(c, reference::gating(c, x, 3));
  CHECK(d2.fates[0 * 2 + 0] == fate::kept);
  CHECK(d2.fates[2 * 2 + 0] == fate::dropped);
}

TEST_CASE("capacity groups: each group of tokens has its own C and order",
          "[reference][hand][capacity_groups]") {
  // 4 tokens all choosing expert 0 of 2, top-1, C = 1 per group of 2 tokens
  const std::vector<float> x = {2, 0, 3, 0, 1, 0, 4, 0};
  routing_config c = presets::switch_transformers(2, 1, 2);
  const auto g = reference::gating(c, x, 4);
  const auto d = reference::dispatch(c, g);
  CHECK(d.capacity == 1);
  CHECK(d.fates == std::vector<fate>{fate::kept, fate::dropped, fate::kept, fate::dropped});
  CHECK(d.slot == std::vector<std::int32_t>{0, -1, 1, -1});  // dense over the batch
  CHECK(d.load[0] == 2);
  const auto L = reference::layout(c, d, layout_kind::padded);
  CHECK(L.offsets[1] == 2);  // C * 2 groups
  CHECK(test::layout_violation(d, L, c.capacity_groups(4)) == "");
  // without groups one token is kept over the batch
  c.capacity.group_tokens = 0;
  c.loss.sequence_length = 0;
  CHECK(reference::dispatch(c, reference::gating(c, x, 4)).total_kept == 1);

  SECTION("T must be a multiple of the group") {
    routing_config c3 = presets::switch_transformers(2, 1, 3);
    test::expect_error([&] { (void)reference::gating(c3, x, 4); }, status_code::invalid_shape,
                       {"capacity.group_tokens"});
  }
}

TEST_CASE("NLLB second-expert policies: sampling and random, from the Philox stream",
          "[reference][hand][second_expert]") {
  const std::int64_t T = 64;
  const std::int32_t E = 8;
  const auto x = test::make_logits(T, E, dist::normal, 21u);
  presets::nllb_moe_options o;
  o.expert_capacity = 64;  // nothing dropped by capacity: what we see is the policy

  SECTION("sampling: the first choice stays, the second is argmax of x + Gumbel") {
    o.second_expert = {second_expert_policy::sampling, 5, 2};
    const routing_config c = presets::nllb_moe(E, o);
    const auto g = reference::gating(c, x, T);
    const auto plain = reference::gating(presets::nllb_moe(E), x, T);
    std::int64_t moved = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      CHECK(g.ids[t * 2] == plain.ids[t * 2]);
      std::int32_t best = -1;
      float best_v = 0.0f;
      for (std::int32_t e = 0; e < E; ++e) {
        if (e == g.ids[t * 2]) continue;
        const auto r =
            rng::draw(5, 2, rng::stream_second_expert, static_cast<std::uint64_t>(t * E + e));
        const float v = x[t * E + e] + rng::gumbel(r.v[0]);
        if (best < 0 || v > best_v) best = e, best_v = v;
      }
      CHECK(g.ids[t * 2 + 1] == best);
      moved += g.ids[t * 2 + 1] != plain.ids[t * 2 + 1];
    }
    CHECK(moved > 0);  // the noise does pick other experts
  }
  SECTION("random: the second choice is kept when 2 * p2 > u") {
    o.second_expert = {second_expert_policy::random, 5, 2};
    const routing_config c = presets::nllb_moe(E, o);
    const auto g = reference::gating(c, x, T);
    const auto d = reference::dispatch(c, g);
    REQUIRE(g.second_skipped.size() == static_cast<std::size_t>(T));
    std::int64_t skipped = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      // p2 as the gates carry it before renormalisation: the softmax over all experts
      std::vector<float> row(x.begin() + t * E, x.begin() + (t + 1) * E);
      float m = *std::max_element(row.begin(), row.end());
      std::vector<float> p(E);
      double sum = 0.0;
      for (std::int32_t e = 0; e < E; ++e) sum += (p[e] = std::exp(row[e] - m));
      const float p2 = static_cast<float>(p[g.ids[t * 2 + 1]] / sum);
      const auto r = rng::draw(5, 2, rng::stream_second_expert, static_cast<std::uint64_t>(t));
      const bool keep = 2.0f * p2 > rng::uniform_open(r.v[0]);
      INFO("token " << t);
      CHECK(g.second_skipped[t] == (keep ? 0 : 1));
      // a skipped second choice is dropped without taking a slot; the first keeps weight 1
      CHECK(d.fates[t * 2 + 1] == (keep ? fate::kept : fate::dropped));
      if (!keep) CHECK(d.weight[t * 2] == 1.0f);
      skipped += keep ? 0 : 1;
    }
    CHECK(skipped > 0);
    CHECK(skipped < T);
    CHECK(d.total_dropped == skipped);
    CHECK(test::dispatch_violation(c, g, d) == "");
  }
  SECTION("validation: top-2 only, no reroute of what the policy decided") {
    routing_config c = presets::nllb_moe(E, o);
    c.gating.second_expert.policy = second_expert_policy::random;
    c.top_k = 3;
    test::expect_error([&] { throw_if_error(validate(c)); }, status_code::invalid_config,
                       {"top_k", "second_expert"});
    c.top_k = 2;
    c.dispatch.dropped = drop_policy::next_choice;
    test::expect_error([&] { throw_if_error(validate(c)); }, status_code::invalid_config,
                       {"gating.second_expert.policy", "next_choice"});
  }
}
