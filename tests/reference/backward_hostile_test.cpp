// SPDX-License-Identifier: Apache-2.0
// Hostile inputs at the backward entry points (routing_backward, the aux / sequence-aux / z-loss
// backwards, gating_backward, combine_backward, permute_backward, the expert-bias
// update): wrong-length spans, forward outputs of another config or batch, d out of range,
// layouts whose rows or tokens point outside the batch. Each must throw moeroute::error with
// the right status code and a message naming the argument — never read or write out of bounds.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include <moeroute/reference.hpp>

#include "../common/invariants.hpp"
#include "../common/test_util.hpp"

using namespace moeroute;
namespace ref = moeroute::reference;
using Catch::Matchers::Contains;
using moeroute::test::expect_error;

namespace {

constexpr std::int64_t T = 8;
constexpr std::int32_t E = 4, K = 2;

struct routed {
  routing_config cfg;
  std::vector<float> logits;
  ref::gating_output g;
  ref::dispatch_output d;
  ref::layout_output L;
};

routed route_small(std::int64_t seq_len = 0) {
  routed r;
  r.cfg.num_experts = E;
  r.cfg.top_k = K;
  r.cfg.capacity.factor = 1.0;
  r.cfg.loss.sequence_length = seq_len;
  r.cfg.loss.aux_coefficient = 0.01f;
  r.cfg.loss.z_coefficient = 0.001f;
  r.logits.resize(static_cast<std::size_t>(T * E));
  for (std::size_t i = 0; i < r.logits.size(); ++i)
    r.logits[i] = static_cast<float>((i * 37) % 11) / 4.0f;
  r.g = ref::gating<float>(r.cfg, std::span<const float>(r.logits), T);
  r.d = ref::dispatch(r.cfg, r.g);
  r.L = ref::layout(r.cfg, r.d, layout_kind::padded);
  return r;
}

}  // namespace

TEST_CASE("backward hostile: routing_backward", "[reference][backward][hostile]") {
  auto r = route_small();
  std::vector<float> dw(T * K, 1.0f), dl(T * E, 0.0f);
  // the good call works
  ref::routing_backward(r.cfg, r.logits, r.g, r.d, dw, dl);
  std::vector<float> shorty(T * E - 1), dw_short(T * K - 1);
  expect_error([&] { ref::routing_backward(r.cfg, shorty, r.g, r.d, dw, dl); },
               status_code::invalid_shape, {"logits"});
  expect_error([&] { ref::routing_backward(r.cfg, r.logits, r.g, r.d, dw, shorty); },
               status_code::invalid_shape, {"d_logits"});
  expect_error([&] { ref::routing_backward(r.cfg, r.logits, r.g, r.d, dw_short, dl); },
               status_code::invalid_shape, {"d_weight"});
  expect_error([&] { ref::routing_backward(r.cfg, r.logits, r.g, r.d, {}, dl); },
               status_code::invalid_shape, {"d_weight"});
  // config of another shape
  auto other = r.cfg;
  other.top_k = 1;
  expect_error([&] { ref::routing_backward(other, r.logits, r.g, r.d, dw, dl); },
               status_code::invalid_argument, {"gating_output"});
  other = r.cfg;
  other.num_experts = 8;
  expect_error([&] { ref::routing_backward(other, r.logits, r.g, r.d, dw, dl); },
               status_code::invalid_argument, {"gating_output"});
  // an invalid config
  other = r.cfg;
  other.top_k = 0;
  CHECK_THROWS_AS(ref::routing_backward(other, r.logits, r.g, r.d, dw, dl), error);
  // dispatch of another batch
  auto r2 = route_small();
  r2.d.tokens = T - 1;
  expect_error([&] { ref::routing_backward(r.cfg, r.logits, r.g, r2.d, dw, dl); },
               status_code::invalid_argument, {"dispatch_output"});
  auto d3 = r.d;
  d3.fates.pop_back();
  expect_error([&] { ref::routing_backward(r.cfg, r.logits, r.g, d3, dw, dl); },
               status_code::invalid_shape, {"dispatch_output fates"});
  // corrupted gating output
  auto g2 = r.g;
  g2.ids.pop_back();
  expect_error([&] { ref::routing_backward(r.cfg, r.logits, g2, r.d, dw, dl); },
               status_code::invalid_shape, {"gating_output ids"});
  g2 = r.g;
  g2.valid.resize(T - 3);
  expect_error([&] { ref::routing_backward(r.cfg, r.logits, g2, r.d, dw, dl); },
               status_code::invalid_shape, {"gating_output valid"});
  g2 = r.g;
  g2.ids[3] = E;
  expect_error([&] { ref::routing_backward(r.cfg, r.logits, g2, r.d, dw, dl); },
               status_code::invalid_argument, {"gating_output ids[3]"});
  g2.ids[3] = -5;
  expect_error([&] { ref::routing_backward(r.cfg, r.logits, g2, r.d, dw, dl); },
               status_code::invalid_argument, {"gating_output ids[3]"});
}

TEST_CASE("backward hostile: loss backwards and gating_backward",
          "[reference][backward][hostile]") {
  auto r = route_small(4);
  std::vector<float> dl(T * E, 0.0f), shorty(T * E + 1), dw(T * K, 0.5f);
  ref::aux_loss_backward(r.cfg, r.logits, r.g, dl);
  ref::sequence_aux_loss_backward(r.cfg, r.logits, r.g, dl);
  ref::z_loss_backward(r.cfg, r.logits, r.g, dl);
  ref::gating_backward(r.cfg, r.logits, r.g, r.d, dw, dl);
  expect_error([&] { ref::aux_loss_backward(r.cfg, shorty, r.g, dl); }, status_code::invalid_shape,
               {"logits"});
  expect_error([&] { ref::z_loss_backward(r.cfg, r.logits, r.g, shorty); },
               status_code::invalid_shape, {"d_logits"});
  expect_error([&] { ref::sequence_aux_loss_backward(r.cfg, shorty, r.g, dl); },
               status_code::invalid_shape, {"logits"});
  expect_error([&] { ref::gating_backward(r.cfg, r.logits, r.g, r.d, {}, shorty); },
               status_code::invalid_shape, {"d_logits"});
  expect_error([&] { ref::gating_backward(r.cfg, r.logits, r.g, r.d, std::vector<float>(3), dl); },
               status_code::invalid_shape, {"d_weight"});
  std::vector<std::int64_t> counts(E - 1, 1);
  expect_error([&] { ref::aux_loss_backward_from_sums(r.cfg, r.logits, r.g, counts, 100, dl); },
               status_code::invalid_shape, {"counts"});
  // sequence statistics that do not match the config or are truncated
  auto g2 = r.g;
  g2.seq_tokens.pop_back();
  expect_error([&] { ref::sequence_aux_loss_backward(r.cfg, r.logits, g2, dl); },
               status_code::invalid_shape, {"seq_tokens"});
  g2 = r.g;
  g2.seq_count.resize(1);
  expect_error([&] { ref::sequence_aux_loss_backward(r.cfg, r.logits, g2, dl); },
               status_code::invalid_shape, {"seq_count"});
  auto other = r.cfg;
  other.loss.sequence_length = 2;  // 4 sequences of 2 against a forward with 2 of 4
  expect_error([&] { ref::sequence_aux_loss_backward(other, r.logits, r.g, dl); },
               status_code::invalid_argument, {"sequence_length"});
  g2 = r.g;
  g2.valid.pop_back();
  expect_error([&] { ref::z_loss_backward(r.cfg, r.logits, g2, dl); }, status_code::invalid_shape,
               {"gating_output valid"});
}

TEST_CASE("backward hostile: combine_backward and permute_backward",
          "[reference][backward][hostile]") {
  auto r = route_small();
  const std::int64_t d = 3, R = r.L.num_rows;
  std::vector<float> eo(R * d, 1.0f), dy(T * d, 1.0f), deo(R * d), dw(T * K), dx(T * d),
      dbuf(R * d, 1.0f);
  ref::combine_backward(r.cfg, r.L, r.d, eo, d, dy, deo, dw, dx);
  ref::permute_backward(r.cfg, r.L, r.d, dbuf, d, dx);
  std::vector<float> s1(R * d - 1), s2(T * d + 1), s3(T * K - 1);
  expect_error([&] { ref::combine_backward(r.cfg, r.L, r.d, s1, d, dy, deo, dw); },
               status_code::invalid_shape, {"expert_out"});
  expect_error([&] { ref::combine_backward(r.cfg, r.L, r.d, eo, d, dy, s1, dw); },
               status_code::invalid_shape, {"d_expert_out"});
  expect_error([&] { ref::combine_backward(r.cfg, r.L, r.d, eo, d, s2, deo, dw); },
               status_code::invalid_shape, {"dy"});
  expect_error([&] { ref::combine_backward(r.cfg, r.L, r.d, eo, d, dy, deo, s3); },
               status_code::invalid_shape, {"d_weight"});
  expect_error([&] { ref::combine_backward(r.cfg, r.L, r.d, eo, d, dy, deo, dw, s2); },
               status_code::invalid_shape, {"d_x"});
  // d out of range
  for (std::int64_t bad_d :
       {std::int64_t{-1}, max_hidden + 1, std::numeric_limits<std::int64_t>::max()}) {
    expect_error([&] { ref::combine_backward(r.cfg, r.L, r.d, eo, bad_d, dy, deo, dw); },
                 status_code::invalid_shape, {"hidden size d"});
    expect_error([&] { ref::permute_backward(r.cfg, r.L, r.d, dbuf, bad_d, dx); },
                 status_code::invalid_shape, {"hidden size d"});
  }
  // config / dispatch / layout of another batch
  auto other = r.cfg;
  other.top_k = 1;
  expect_error([&] { ref::combine_backward(other, r.L, r.d, eo, d, dy, deo, dw); },
               status_code::invalid_argument, {"top_k"});
  auto d2 = r.d;
  d2.weight.pop_back();
  expect_error([&] { ref::combine_backward(r.cfg, r.L, d2, eo, d, dy, deo, dw); },
               status_code::invalid_shape, {"dispatch_output weight"});
  d2 = r.d;
  d2.fates.resize(1);
  expect_error([&] { ref::combine_backward(r.cfg, r.L, d2, eo, d, dy, deo, dw); },
               status_code::invalid_shape, {"dispatch_output fates"});
  auto L2 = r.L;
  L2.row_token.pop_back();
  expect_error([&] { ref::combine_backward(r.cfg, L2, r.d, eo, d, dy, deo, dw); },
               status_code::invalid_shape, {"layout row_token"});
  expect_error([&] { ref::permute_backward(r.cfg, L2, r.d, dbuf, d, dx); },
               status_code::invalid_shape, {"layout row_token"});
  L2 = r.L;
  L2.row_token[0] = static_cast<std::int32_t>(T);
  expect_error([&] { ref::combine_backward(r.cfg, L2, r.d, eo, d, dy, deo, dw); },
               status_code::invalid_argument, {"layout row_token[0]"});
  L2 = r.L;
  L2.assignment_row[1] = R;
  expect_error([&] { ref::combine_backward(r.cfg, L2, r.d, eo, d, dy, deo, dw); },
               status_code::invalid_argument, {"layout assignment_row[1]"});
  expect_error([&] { ref::permute_backward(r.cfg, L2, r.d, dbuf, d, dx); },
               status_code::invalid_argument, {"layout assignment_row[1]"});
  L2 = r.L;
  L2.assignment_row.pop_back();
  expect_error([&] { ref::permute_backward(r.cfg, L2, r.d, dbuf, d, dx); },
               status_code::invalid_shape, {"layout assignment_row"});
  L2 = r.L;
  L2.num_rows = -1;
  CHECK_THROWS_AS(ref::permute_backward(r.cfg, L2, r.d, dbuf, d, dx), error);
  expect_error([&] { ref::permute_backward(r.cfg, r.L, r.d, s1, d, dx); },
               status_code::invalid_shape, {"d_buf"});
  expect_error([&] { ref::permute_backward(r.cfg, r.L, r.d, dbuf, d, s2); },
               status_code::invalid_shape, {"d_x"});
  expect_error([&] { ref::permute_backward(r.cfg, r.L, r.d, dbuf, d, {}); },
               status_code::invalid_shape, {"d_x"});
}

TEST_CASE("backward hostile: expert-bias update and load accumulator",
          "[reference][backward][hostile]") {
  expect_error([] { ref::expert_load_accumulator a(0); }, status_code::invalid_argument,
               {"experts"});
  expect_error([] { ref::expert_load_accumulator a(-3); }, status_code::invalid_argument,
               {"experts"});
  ref::expert_load_accumulator acc(E);
  std::vector<std::int64_t> ok(E, 2), bad(E + 1, 2);
  CHECK(acc.add(ok, 0));
  expect_error([&] { acc.add(bad, 1); }, status_code::invalid_shape, {"counts"});
  expect_error([&] { acc.add(std::span<const std::int64_t>{}, 2); }, status_code::invalid_shape,
               {"counts"});
  CHECK(acc.counts() == ok);  // a rejected add changes nothing
  CHECK(acc.micro_batches() == 1);
  auto r = route_small();
  auto d2 = r.d;
  d2.requested.pop_back();
  expect_error([&] { acc.add(d2, 3); }, status_code::invalid_shape, {"counts"});

  std::vector<float> bias(E, 0.0f);
  std::vector<std::int64_t> load_short(E - 1, 1);
  auto c = r.cfg;
  expect_error([&] { ref::expert_bias_update(c, bias, load_short); }, status_code::invalid_shape,
               {"bias", "load"});
  expect_error([&] { ref::expert_bias_update(c, std::span<float>{}, ok); },
               status_code::invalid_shape, {"bias"});
  c.gating.bias_update.rate = -1.0f;
  expect_error([&] { ref::expert_bias_update(c, bias, ok); }, status_code::invalid_config,
               {"gating.bias_update.rate"});
  c.gating.bias_update.rate = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { ref::expert_bias_update(c, bias, ok); }, status_code::invalid_config,
               {"gating.bias_update.rate"});
  c.gating.bias_update.rate = std::numeric_limits<float>::infinity();
  expect_error([&] { ref::expert_bias_update(c, bias, ok); }, status_code::invalid_config,
               {"gating.bias_update.rate"});
  for (float b : bias) CHECK(b == 0.0f);  // rejected updates change nothing
}
