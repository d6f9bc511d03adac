// SPDX-License-Identifier: Apache-2.0
// The reference expert-bias update of aux-loss-free balancing and its load accumulator.
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
/// A config of E experts whose bias update moves by `rate` (and recentres when asked).
routing_config bias_config(std::size_t experts, float rate, bool recenter) {
  routing_config c;
  c.num_experts = static_cast<std::int32_t>(experts);
  c.top_k = 1;
  c.gating.expert_bias = true;
  c.gating.bias_update = {rate, recenter};
  return c;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Expert-bias update

TEST_CASE("backward: expert-bias update follows sign(mean load - load)", "[backward][bias]") {
  std::vector<float> bias = {0.0f, 0.5f, -0.25f, 0.0f};
  const std::vector<std::int64_t> load = {10, 2, 6, 6};  // mean 6
  ref::expert_bias_update(bias_config(4, 0.125f, false), bias, load);
  CHECK(bias == std::vector<float>{-0.125f, 0.625f, -0.25f, 0.0f});  // sign(0) = 0
  ref::expert_bias_update(bias_config(4, 0.125f, true), bias, load);
  // -0.25, 0.75, -0.25, 0.0 -> mean 0.0625 -> recentred
  CHECK(bias == std::vector<float>{-0.3125f, 0.6875f, -0.3125f, -0.0625f});
  double s = 0;
  for (float b : bias) s += b;
  CHECK(s == 0.0);
  std::vector<float> b2 = {1.0f, 2.0f};
  ref::expert_bias_update(bias_config(2, 0.5f, false), b2, std::vector<std::int64_t>{0, 0});
  CHECK(b2 == std::vector<float>{1.0f, 2.0f});  // balanced (all zero) loads: no change
  CHECK_THROWS_AS(ref::expert_bias_update(bias_config(2, 0.5f, false), b2, load), moeroute::error);
  CHECK_THROWS_AS(
      ref::expert_bias_update(bias_config(2, -1.0f, false), b2, std::vector<std::int64_t>{1, 2}),
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
  const auto d = ref::dispatch(c, ref::gating(c, x, 8));
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
    const auto d = ref::dispatch(c, ref::gating(c, x, 32, bias));
    const std::int64_t mx = *std::max_element(d.requested.begin(), d.requested.end());
    if (step == 0) first_max = mx;
    last_max = mx;
    ref::expert_bias_update(bias_config(bias.size(), 0.01f, true), bias, d.requested);
  }
  CHECK(first_max == 32);
  CHECK(last_max <= 12);  // near 8 = 32 / 4
}
