// SPDX-License-Identifier: Apache-2.0
// Capacity rules, hand-worked from the design notes and the peers' formulas.
#include <catch2/catch.hpp>

#include <moeroute/capacity.hpp>
#include <moeroute/presets.hpp>

using namespace moeroute;

TEST_CASE("capacity: seed formula int(factor * T / E)", "[capacity]") {
  // seed 004: capacity = int(capacity_factor * T / num_experts)
  auto c = presets::seed_reference(8, 2, 1.25);
  CHECK(expert_capacity(c, 64) == 10);   // 1.25 * 64 / 8 = 10
  CHECK(expert_capacity(c, 100) == 15);  // 15.625 -> 15
  c.capacity.factor = 0.5;
  CHECK(expert_capacity(c, 16) == 1);  // 0.5 * 16 / 8 = 1
}

TEST_CASE("capacity: k-aware factor, ceil, min_capacity (DeepSpeed)", "[capacity]") {
  auto c = presets::deepspeed_top2(8, 1.0);  // min 4
  CHECK(expert_capacity(c, 64) == 16);       // ceil(64 * 2 / 8 * 1.0)
  CHECK(expert_capacity(c, 4) == 4);         // ceil(1) = 1 -> min 4
  c.capacity.factor = 1.25;
  CHECK(expert_capacity(c, 100) == 32);  // ceil(31.25)
}

TEST_CASE("capacity: fixed, max_load, unbounded, eval factor, clamp", "[capacity]") {
  routing_config c;
  c.num_experts = 4;
  c.top_k = 2;
  c.capacity.mode = capacity_mode::fixed;
  c.capacity.fixed = 7;
  CHECK(expert_capacity(c, 1000) == 7);
  c.capacity.mode = capacity_mode::max_load;
  CHECK(expert_capacity(c, 1000, 321) == 321);
  c.capacity.mode = capacity_mode::unbounded;
  CHECK(expert_capacity(c, 1000) == unbounded_capacity);
  c.capacity.mode = capacity_mode::factor;
  c.capacity.factor = 2.0;
  c.capacity.eval_factor = 1.0;
  c.training = true;
  CHECK(expert_capacity(c, 8) == 8);
  c.training = false;
  CHECK(expert_capacity(c, 8) == 4);
  c.capacity.factor = 100.0;
  c.training = true;
  c.capacity.clamp_to_tokens = true;
  CHECK(expert_capacity(c, 8) == 8);
}
