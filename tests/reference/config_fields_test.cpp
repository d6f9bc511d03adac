// SPDX-License-Identifier: Apache-2.0
// config_fields.hpp: every field of routing_config is in the list (counted against the structs
// themselves), printing and parsing give back the same config, and a bad name or value is an
// error naming it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include <moeroute/config_fields.hpp>
#include <moeroute/presets.hpp>

using namespace moeroute;

namespace {

/// Converts to anything: brace-initialising an aggregate with n of these works iff it has at
/// least n members, which counts them.
struct any_value {
  template <class T>
  operator T() const;  // NOLINT(google-explicit-constructor): declared only, never called
};

template <class T, class... Values>
constexpr std::size_t member_count() {
  if constexpr (requires { T{Values{}..., any_value{}}; }) {
    return member_count<T, Values..., any_value>();
  } else {
    return sizeof...(Values);
  }
}

/// Every field of `a` equals the same field of `b` (NaN equals NaN); the first that does not.
std::string first_difference(const routing_config& a, const routing_config& b) {
  std::string first;
  for_each_field(
      [&](const char* name, const auto& x, const auto& y) {
        if (first.empty() && !detail::same_field(x, y)) first = name;
      },
      a, b);
  return first;
}

}  // namespace

TEST_CASE("config fields: the list names every field of routing_config", "[reference][config]") {
  std::size_t listed = 0;
  const routing_config c;
  for_each_field([&](const char*, const auto&) { ++listed; }, c);
  // routing_config: 3 scalars and 4 sub-structs; their nested structs replace one member each
  static_assert(member_count<routing_config>() == 7);
  const std::size_t gating = member_count<gating_config>() - 4 +
                             member_count<bias_update_config>() +
                             member_count<group_limit_config>() + member_count<noise_config>() +
                             member_count<second_expert_config>();
  const std::size_t dispatch = member_count<dispatch_config>() - 2 +
                               member_count<fallback_config>() + member_count<reroute_config>();
  CHECK(listed ==
        3 + gating + member_count<capacity_config>() + dispatch + member_count<loss_config>());
}

TEST_CASE("config fields: to_string and parse_config round-trip every preset",
          "[reference][config]") {
  for (const auto& info : presets::registry) {
    INFO(info.name);
    const routing_config p = presets::by_name(info.name, info.default_experts, info.default_k);
    CHECK(first_difference(parse_config(to_string(p)), p).empty());
    CHECK(first_difference(parse_config(to_string(p, true)), p).empty());
  }
  CHECK(to_string(routing_config{}).empty());  // only what differs from the defaults
  routing_config c;
  c.gating.noise.scale = 0.1f;  // shortest text that reads back to the same float
  c.capacity.eval_factor = 0.3;
  c.dispatch.random_seed = std::numeric_limits<std::uint64_t>::max();
  CHECK(
      to_string(c) ==
      "gating.noise.scale=0.1 capacity.eval_factor=0.3 dispatch.random_seed=18446744073709551615");
  CHECK(first_difference(parse_config(to_string(c)), c).empty());
}

TEST_CASE("config fields: parse_config reads names, numbers and booleans", "[reference][config]") {
  const auto c = parse_config(
      "num_experts=7  top_k=3 gating.score=sigmoid gating.renorm=after_drop "
      "gating.scaling_factor=1.5 capacity.mode=fixed capacity.fixed=1 training=0 "
      "dispatch.dropped=fallback dispatch.fallback.capacity=2 loss.sequence_length=64");
  CHECK(c.num_experts == 7);
  CHECK(c.top_k == 3);
  CHECK(!c.training);
  CHECK(c.gating.score == score_function::sigmoid);
  CHECK(c.gating.renorm == renormalize::after_drop);
  CHECK(c.gating.scaling_factor == 1.5f);
  CHECK(c.capacity.mode == capacity_mode::fixed);
  CHECK(c.capacity.fixed == 1);
  CHECK(c.dispatch.dropped == drop_policy::fallback);
  CHECK(c.dispatch.fallback.capacity == 2);
  CHECK(c.loss.sequence_length == 64);
  CHECK(std::isnan(parse_config("capacity.eval_factor=nan").capacity.eval_factor));
}

TEST_CASE("config fields: a bad name or value is an error naming it", "[reference][config]") {
  routing_config c;
  const auto expect = [&](const char* text, const char* message) {
    INFO(text);
    const status s = set_fields(c, text);
    CHECK(s.code == status_code::invalid_argument);
    CHECK_THAT(s.message, Catch::Contains(message));
  };
  expect("gating.scor=sigmoid", "'gating.scor': not a routing_config field");
  expect("gating.score=sigmoids",
         "gating.score = 'sigmoids': must be one of softmax, sigmoid, sqrt_softplus");
  expect("top_k=2.5", "top_k = '2.5': must be an integer in range");
  expect("top_k=99999999999", "top_k = '99999999999': must be an integer in range");
  expect("training=yes", "training = 'yes': must be true or false");
  expect("capacity.factor=1.x", "capacity.factor = '1.x': must be a number");
  expect("top_k", "'top_k': not a name=value assignment");
  CHECK_THROWS_AS(parse_config("top_k=-"), error);
  // set_fields only sets: the range checks are validate()'s
  CHECK(set_fields(c, "top_k=0 num_experts=3").ok());
  CHECK(c.top_k == 0);
  CHECK(!validate(c).ok());
}
