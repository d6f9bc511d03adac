// SPDX-License-Identifier: Apache-2.0
// validate(): every rejection in config.hpp (and the shape / input checks of the reference)
// returns the right code with a message that names the field and its value.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <moeroute/reference.hpp>
#include <string>
#include <vector>

using namespace moeroute;
using Catch::Contains;

namespace {

routing_config base() {
  routing_config c;
  c.num_experts = 8;
  c.top_k = 2;
  return c;
}

struct rejection {
  const char* what;
  std::function<void(routing_config&)> mutate;
  std::vector<std::string> message_has;  // the field, and the value where there is one
};

const double nan_d = std::numeric_limits<double>::quiet_NaN();
const float nan_f = std::numeric_limits<float>::quiet_NaN();
const float inf_f = std::numeric_limits<float>::infinity();

}  // namespace

TEST_CASE("validate: the defaults and every preset are valid", "[reference][validate]") {
  CHECK(validate(routing_config{}).ok());
  CHECK(validate(presets::seed_reference(8, 2)).ok());
  CHECK(validate(presets::switch_top1(8)).ok());
  CHECK(validate(presets::gshard_top2(8)).ok());
  CHECK(validate(presets::deepspeed_top2(8)).ok());
  CHECK(validate(presets::deepspeed_topk(8, 3)).ok());
  CHECK(validate(presets::megatron(8, 2)).ok());
  presets::megatron_options o;
  o.score = score_function::sigmoid;
  o.groups = 4;
  o.group_topk = 2;
  o.expert_bias = true;
  o.capacity_factor = 1.25;
  o.scaling_factor = 2.5f;
  CHECK(validate(presets::megatron(8, 4, o)).ok());
  CHECK(validate(presets::mixtral()).ok());
  CHECK(validate(presets::deepseek_v3()).ok());
  CHECK(validate(presets::qwen_moe()).ok());
  CHECK(validate(presets::olmoe()).ok());
}

TEST_CASE("validate: every rejection names the field and the value", "[reference][validate]") {
  const std::vector<rejection> cases = {
      {"E = 0", [](auto& c) { c.num_experts = 0; }, {"num_experts", "0"}},
      {"E < 0", [](auto& c) { c.num_experts = -3; }, {"num_experts", "-3"}},
      {"E > max",
       [](auto& c) {
         c.num_experts = max_experts + 1;
         c.top_k = 1;
       },
       {"num_experts", "8193"}},
      {"k = 0", [](auto& c) { c.top_k = 0; }, {"top_k", "0"}},
      {"k > E", [](auto& c) { c.top_k = 9; }, {"top_k", "9", "num_experts"}},
      {"scaling 0",
       [](auto& c) { c.gating.scaling_factor = 0.0f; },
       {"gating.scaling_factor", "0"}},
      {"scaling NaN",
       [](auto& c) { c.gating.scaling_factor = nan_f; },
       {"gating.scaling_factor", "nan"}},
      {"scaling inf",
       [](auto& c) { c.gating.scaling_factor = inf_f; },
       {"gating.scaling_factor", "inf"}},
      {"renorm eps < 0",
       [](auto& c) { c.gating.renorm_epsilon = -1.0f; },
       {"gating.renorm_epsilon", "-1"}},
      {"renorm eps NaN",
       [](auto& c) { c.gating.renorm_epsilon = nan_f; },
       {"gating.renorm_epsilon", "nan"}},
      {"after_topk with sigmoid",
       [](auto& c) {
         c.gating.score = score_function::sigmoid;
         c.gating.stage = softmax_stage::after_topk;
       },
       {"gating.stage", "after_topk"}},
      {"after_topk selecting scores",
       [](auto& c) {
         c.gating.stage = softmax_stage::after_topk;
         c.gating.select = select_from::scores;
       },
       {"gating.select", "scores"}},
      {"groups < 0",
       [](auto& c) { c.gating.group_limit.groups = -1; },
       {"gating.group_limit.groups", "-1"}},
      {"groups do not divide E",
       [](auto& c) {
         c.gating.group_limit = {3, 1};
       },
       {"gating.group_limit.groups", "3", "num_experts = 8"}},
      {"group_topk 0",
       [](auto& c) {
         c.gating.group_limit = {4, 0};
       },
       {"gating.group_limit.group_topk", "0"}},
      {"group_topk > groups",
       [](auto& c) {
         c.gating.group_limit = {4, 5};
       },
       {"gating.group_limit.group_topk", "5", "groups = 4"}},
      {"group_topk does not divide k",
       [](auto& c) {
         c.top_k = 3;
         c.gating.group_limit = {4, 2};
       },
       {"gating.group_limit.group_topk", "2", "top_k = 3"}},
      {"k / group_topk > experts per group",
       [](auto& c) {
         c.top_k = 4;
         c.gating.group_limit = {4, 1};
       },
       {"gating.group_limit", "top_k / group_topk = 4", "experts per group = 2"}},
      {"group_topk without groups",
       [](auto& c) {
         c.gating.group_limit = {0, 2};
       },
       {"gating.group_limit.group_topk", "2", "groups"}},
      {"group_topk with groups = 1",
       [](auto& c) {
         c.gating.group_limit = {1, 1};
       },
       {"gating.group_limit.group_topk", "1"}},
      {"noise scale < 0",
       [](auto& c) {
         c.gating.noise.kind = noise_kind::gaussian;
         c.gating.noise.scale = -0.5f;
       },
       {"gating.noise.scale", "-0.5"}},
      {"noise scale NaN",
       [](auto& c) {
         c.gating.noise.kind = noise_kind::gumbel;
         c.gating.noise.scale = nan_f;
       },
       {"gating.noise.scale", "nan"}},
      {"factor 0", [](auto& c) { c.capacity.factor = 0.0; }, {"capacity.factor", "0"}},
      {"factor < 0", [](auto& c) { c.capacity.factor = -1.0; }, {"capacity.factor", "-1"}},
      {"factor NaN", [](auto& c) { c.capacity.factor = nan_d; }, {"capacity.factor", "nan"}},
      {"factor inf",
       [](auto& c) { c.capacity.factor = std::numeric_limits<double>::infinity(); },
       {"capacity.factor", "inf"}},
      {"factor huge", [](auto& c) { c.capacity.factor = 1e7; }, {"capacity.factor", "10000000"}},
      {"eval factor 0",
       [](auto& c) { c.capacity.eval_factor = 0.0; },
       {"capacity.eval_factor", "0"}},
      {"eval factor inf",
       [](auto& c) { c.capacity.eval_factor = std::numeric_limits<double>::infinity(); },
       {"capacity.eval_factor", "inf"}},
      {"eval factor huge in eval",
       [](auto& c) {
         c.capacity.eval_factor = 2e6;
         c.training = false;
       },
       {"capacity.eval_factor", "2000000"}},
      {"min capacity < 0",
       [](auto& c) { c.capacity.min_capacity = -2; },
       {"capacity.min_capacity", "-2"}},
      {"fixed < 0",
       [](auto& c) {
         c.capacity.mode = capacity_mode::fixed;
         c.capacity.fixed = -1;
       },
       {"capacity.fixed", "-1"}},
      {"fallback expert >= E",
       [](auto& c) {
         c.dispatch.dropped = drop_policy::fallback;
         c.dispatch.fallback.expert = 8;
       },
       {"dispatch.fallback.expert", "8", "num_experts = 8"}},
      {"fallback expert < -1",
       [](auto& c) {
         c.dispatch.dropped = drop_policy::fallback;
         c.dispatch.fallback.expert = -2;
       },
       {"dispatch.fallback.expert", "-2"}},
      {"fallback capacity < -1",
       [](auto& c) {
         c.dispatch.dropped = drop_policy::fallback;
         c.dispatch.fallback.capacity = -5;
       },
       {"dispatch.fallback.capacity", "-5"}},
      {"max_candidates 0",
       [](auto& c) {
         c.dispatch.dropped = drop_policy::next_choice;
         c.dispatch.reroute.max_candidates = 0;
       },
       {"dispatch.reroute.max_candidates", "0"}},
      {"next_choice with groups",
       [](auto& c) {
         c.dispatch.dropped = drop_policy::next_choice;
         c.gating.group_limit = {4, 2};
       },
       {"dispatch.dropped", "next_choice", "group"}},
      {"aux coefficient < 0",
       [](auto& c) { c.loss.aux_coefficient = -0.1f; },
       {"loss.aux_coefficient", "-0.1"}},
      {"aux coefficient NaN",
       [](auto& c) { c.loss.aux_coefficient = nan_f; },
       {"loss.aux_coefficient", "nan"}},
      {"z coefficient inf",
       [](auto& c) { c.loss.z_coefficient = inf_f; },
       {"loss.z_coefficient", "inf"}},
      {"sequence length < 0",
       [](auto& c) { c.loss.sequence_length = -4; },
       {"loss.sequence_length", "-4"}},
  };
  for (const auto& rc : cases) {
    routing_config c = base();
    rc.mutate(c);
    const status s = validate(c);
    INFO(rc.what << ": " << s.message);
    CHECK(s.code == status_code::invalid_config);
    for (const auto& part : rc.message_has) CHECK_THAT(s.message, Contains(part));
    // the reference refuses it too, with the same status in the exception
    const std::vector<float> x(16, 0.0f);
    try {
      (void)reference::gating(c, x, 2);
      FAIL_CHECK("gate accepted an invalid config");
    } catch (const moeroute::error& e) {
      CHECK(e.get_status().code == status_code::invalid_config);
      CHECK(e.get_status().message == s.message);
      CHECK_THAT(std::string(e.what()), Contains("invalid_config"));
    }
  }
  // inactive fields are not checked: a bad fallback with another policy, a bad noise scale
  // without noise, a bad fixed capacity in factor mode
  routing_config c = base();
  c.dispatch.fallback.expert = 100;
  c.dispatch.reroute.max_candidates = 0;
  c.gating.noise.scale = -1.0f;
  c.capacity.fixed = -1;
  CHECK(validate(c).ok());
}

TEST_CASE("validate: batch shapes and gating inputs", "[reference][validate]") {
  routing_config c = base();
  auto s = validate_tokens(c, -1);
  CHECK(s.code == status_code::invalid_shape);
  CHECK_THAT(s.message, Contains("tokens") && Contains("-1"));
  s = validate_tokens(c, max_tokens + 1);
  CHECK(s.code == status_code::invalid_shape);
  CHECK_THAT(s.message, Contains("tokens") && Contains("max_tokens"));
  CHECK(validate_tokens(c, 0).ok());
  c.loss.sequence_length = 4;
  s = validate_tokens(c, 10);
  CHECK(s.code == status_code::invalid_shape);
  CHECK_THAT(s.message, Contains("tokens = 10") && Contains("loss.sequence_length = 4"));
  CHECK(validate_tokens(c, 12).ok());

  c = base();
  const std::vector<float> bias(8, 0.0f), short_bias(7, 0.0f);
  std::vector<float> nan_bias(8, 0.0f);
  nan_bias[5] = nan_f;
  s = reference::validate_gating_inputs(c, 3, 23, {}, {});
  CHECK(s.code == status_code::invalid_shape);
  CHECK_THAT(s.message, Contains("logits has 23") && Contains("3 * 8"));
  s = reference::validate_gating_inputs(c, 3, 24, bias, {});
  CHECK(s.code == status_code::invalid_argument);
  CHECK_THAT(s.message, Contains("expert_bias"));
  c.gating.expert_bias = true;
  s = reference::validate_gating_inputs(c, 3, 24, short_bias, {});
  CHECK(s.code == status_code::invalid_argument);
  CHECK_THAT(s.message, Contains("expert_bias has 7") && Contains("num_experts = 8"));
  s = reference::validate_gating_inputs(c, 3, 24, {}, {});
  CHECK(s.code == status_code::invalid_argument);
  s = reference::validate_gating_inputs(c, 3, 24, nan_bias, {});
  CHECK(s.code == status_code::invalid_argument);
  CHECK_THAT(s.message, Contains("expert_bias[5]"));
  CHECK(reference::validate_gating_inputs(c, 3, 24, bias, {}).ok());
  const std::vector<std::uint8_t> valid(2, 1);
  s = reference::validate_gating_inputs(c, 3, 24, bias, valid);
  CHECK(s.code == status_code::invalid_shape);
  CHECK_THAT(s.message, Contains("valid mask has 2") && Contains("tokens = 3"));

  // the reference throws them
  const std::vector<float> x(23, 0.0f);
  CHECK_THROWS_AS(reference::gating(base(), x, 3), moeroute::error);
  // padded layout of a dropless routing, compact layout with block size 0
  const auto r = reference::route<float>(presets::mixtral(8, 2), std::vector<float>(24, 0.0f), 3);
  CHECK_THROWS_WITH(reference::layout(presets::mixtral(8, 2), r.dispatch, layout_kind::padded),
                    Contains("padded layout needs a bounded capacity"));
  CHECK_THROWS_WITH(reference::layout(presets::mixtral(8, 2), r.dispatch, layout_kind::compact, 0),
                    Contains("block_size = 0"));
  // dispatch of a gating_output that belongs to another config
  CHECK_THROWS_AS(reference::dispatch(presets::mixtral(8, 3), r.gating), moeroute::error);
  // permute / combine with wrongly sized buffers
  const auto L = reference::layout(presets::mixtral(8, 2), r.dispatch, layout_kind::compact);
  std::vector<float> xx(3 * 4), out(L.num_rows * 4), y(3 * 4);
  CHECK_THROWS_WITH(
      reference::permute<float>(presets::mixtral(8, 2), L, std::vector<float>(11), 3, 4, out),
      Contains("x has 11"));
  CHECK_THROWS_WITH(reference::permute<float>(presets::mixtral(8, 2), L, xx, 3, 4,
                                              std::span<float>(out.data(), 1)),
                    Contains("out has 1"));
  CHECK_THROWS_WITH(reference::combine<float>(presets::mixtral(8, 2), L, r.dispatch, out, 4, xx,
                                              std::span<float>(y.data(), 5)),
                    Contains("y has 5"));
}
