// SPDX-License-Identifier: Apache-2.0
// Capacity rules, hand-worked from the design notes and the peers' formulas.
#include <catch2/catch.hpp>

#include <string>

#include <moeroute/capacity.hpp>
#include <moeroute/config_fields.hpp>
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

TEST_CASE("capacity: fixed, max_load, unbounded, min_capacity, clamp, eval factor", "[capacity]") {
  struct row {
    const char* fields;  // on top of E = 8, k = 2
    std::int64_t tokens, max_load, want;
  };
  const row rows[] = {
      {"capacity.mode=fixed capacity.fixed=7", 1000, 0, 7},
      {"capacity.mode=max_load", 1000, 321, 321},
      {"capacity.mode=unbounded", 1000, 0, unbounded_capacity},
      {"capacity.factor=1 capacity.min_capacity=5", 8, 0, 5},  // ceil(2) -> min 5
      {"capacity.factor=1 capacity.min_capacity=5 capacity.clamp_to_tokens=true", 3, 0, 3},
      {"capacity.factor=100 capacity.clamp_to_tokens=true", 8, 0, 8},  // 200 -> T
      {"capacity.factor=1 capacity.eval_factor=2", 64, 0, 16},         // training: factor
      {"capacity.factor=1 capacity.eval_factor=2 training=false", 64, 0, 32},
      {"capacity.factor=1", 0, 0, 0},  // an empty batch: 0 (or the minimum)
      {"capacity.factor=1 capacity.min_capacity=5", 0, 0, 5},
  };
  for (const row& r : rows) {
    INFO(r.fields << ", T = " << r.tokens);
    const auto c = parse_config(std::string("num_experts=8 top_k=2 ") + r.fields);
    CHECK(expert_capacity(c, r.tokens, r.max_load) == r.want);
  }
}
