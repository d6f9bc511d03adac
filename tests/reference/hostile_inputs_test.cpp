// SPDX-License-Identifier: Apache-2.0
// Hostile inputs at every public CPU entry point: wrong-length spans, wrong-length or non-finite
// bias, negative extents, batches past max_tokens, outputs of another config or batch. Each must
// throw moeroute::error with the right status code and a message that names the argument —
// never read or write out of bounds (the sanitizer stage runs this file under ASan + UBSan).
#include <catch2/catch.hpp>

#include <cmath>
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

routing_config small_config() {
  routing_config c;
  c.num_experts = 4;
  c.top_k = 2;
  c.capacity.factor = 1.0;
  return c;
}

std::vector<float> logits_for(std::int64_t T, std::int32_t E) {
  std::vector<float> x(static_cast<std::size_t>(T * E));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) / 4.0f;
  return x;
}

struct routed {
  routing_config cfg;
  ref::gating_output g;
  ref::dispatch_output d;
  ref::layout_output L;
};

routed route_small(std::int64_t T = 6) {
  routed r;
  r.cfg = small_config();
  r.g = ref::gating(r.cfg, logits_for(T, 4), T);
  r.d = ref::dispatch(r.cfg, r.g);
  r.L = ref::layout(r.cfg, r.d, layout_kind::padded);
  return r;
}

}  // namespace

TEST_CASE("hostile: gate rejects wrong-length logits, bias and mask", "[hostile][reliability]") {
  const auto cfg = small_config();
  const auto x = logits_for(6, 4);
  // one element short, one too many, and a T that does not match
  expect_error([&] { (void)ref::gating(cfg, std::vector<float>(x.begin(), x.end() - 1), 6); },
               status_code::invalid_shape, {"logits", "23", "6 * 4"});
  expect_error([&] { (void)ref::gating(cfg, x, 5); }, status_code::invalid_shape,
               {"logits", "24", "5 * 4"});
  // negative T and T past max_tokens
  expect_error([&] { (void)ref::gating(cfg, x, -1); }, status_code::invalid_shape,
               {"tokens", "-1"});
  expect_error([&] { (void)ref::gating(cfg, std::vector<float>{}, max_tokens + 1); },
               status_code::invalid_shape, {"tokens", "max_tokens"});
  // bias: given without expert_bias, wrong length, non-finite
  const std::vector<float> bias4{0.f, 1.f, 2.f, 3.f}, bias3{0.f, 1.f, 2.f};
  expect_error([&] { (void)ref::gating(cfg, x, 6, bias4); }, status_code::invalid_argument,
               {"expert_bias", "gating.expert_bias is false"});
  auto bcfg = cfg;
  bcfg.gating.expert_bias = true;
  expect_error([&] { (void)ref::gating(bcfg, x, 6, bias3); }, status_code::invalid_argument,
               {"expert_bias", "3 elements", "num_experts = 4"});
  expect_error([&] { (void)ref::gating(bcfg, x, 6); }, status_code::invalid_argument,
               {"expert_bias", "0 elements"});
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> b = bias4;
    b[2] = bad;
    expect_error([&] { (void)ref::gating(bcfg, x, 6, b); }, status_code::invalid_argument,
                 {"expert_bias[2]", "not finite"});
  }
  const std::vector<std::uint8_t> mask5(5, 1);
  expect_error([&] { (void)ref::gating(cfg, x, 6, {}, mask5); }, status_code::invalid_shape,
               {"valid mask", "5 elements", "tokens = 6"});
  // an invalid config is reported before any shape
  auto bad_cfg = cfg;
  bad_cfg.top_k = 5;
  expect_error([&] { (void)ref::gating(bad_cfg, x, 6); }, status_code::invalid_config,
               {"top_k", "5"});
  // half and bf16 inputs go through the same checks
  const std::vector<half_bits> h(23);
  expect_error([&] { (void)ref::gating<half_bits>(cfg, std::span<const half_bits>(h), 6); },
               status_code::invalid_shape, {"logits"});
  // sequence length that does not divide T
  auto scfg = cfg;
  scfg.loss.sequence_length = 4;
  expect_error([&] { (void)ref::gating(scfg, x, 6); }, status_code::invalid_shape,
               {"tokens = 6", "loss.sequence_length = 4"});
}

TEST_CASE("hostile: validate enforces the documented limits", "[hostile][reliability]") {
  routing_config c = small_config();
  c.num_experts = max_experts + 1;
  c.top_k = 1;
  CHECK(validate(c).code == status_code::invalid_config);
  CHECK_THAT(validate(c).message, Contains("num_experts") && Contains("max_experts"));
  c.num_experts = max_experts;
  c.top_k = max_top_k;
  CHECK(validate(c).ok());  // k = E = 8192 is the largest valid top-k
  c = small_config();
  c.capacity.min_capacity = max_tokens + 1;
  CHECK_THAT(validate(c).message, Contains("capacity.min_capacity") && Contains("max_tokens"));
  c = small_config();
  c.capacity.mode = capacity_mode::fixed;
  c.capacity.fixed = std::numeric_limits<std::int64_t>::max();
  CHECK(validate(c).code == status_code::invalid_config);
  CHECK_THAT(validate(c).message, Contains("capacity.fixed") && Contains("max_tokens"));
  c = small_config();
  c.dispatch.dropped = drop_policy::fallback;
  c.dispatch.fallback.capacity = max_tokens + 1;
  CHECK_THAT(validate(c).message, Contains("dispatch.fallback.capacity"));
  // tokens: the int32 token index bound
  CHECK(max_tokens == 2147483647);
  CHECK(validate_tokens(small_config(), max_tokens).ok());
  CHECK(validate_tokens(small_config(), max_tokens + 1).code == status_code::invalid_shape);
  CHECK(validate_tokens(small_config(), -5).code == status_code::invalid_shape);
  CHECK_THAT(validate_tokens(small_config(), -5).message, Contains("tokens") && Contains("-5"));
  // hidden size
  CHECK(validate_hidden(0).ok());
  CHECK(validate_hidden(max_hidden).ok());
  CHECK(validate_hidden(max_hidden + 1).code == status_code::invalid_shape);
  CHECK_THAT(validate_hidden(-3).message, Contains("hidden size d") && Contains("-3"));
}

TEST_CASE("hostile: expert_capacity rejects bad configs and extents", "[hostile][reliability]") {
  auto c = small_config();
  CHECK(expert_capacity(c, 8) == 4);  // ceil(8 * 2 / 4 * 1.0)
  expect_error([&] { (void)expert_capacity(c, -1); }, status_code::invalid_shape, {"tokens", "-1"});
  expect_error([&] { (void)expert_capacity(c, max_tokens + 1); }, status_code::invalid_shape,
               {"tokens", "max_tokens"});
  c.capacity.mode = capacity_mode::max_load;
  expect_error([&] { (void)expert_capacity(c, 8, -2); }, status_code::invalid_argument,
               {"max_load", "-2"});
  c = small_config();
  c.capacity.factor = std::numeric_limits<double>::infinity();
  expect_error([&] { (void)expert_capacity(c, 8); }, status_code::invalid_config,
               {"capacity.factor"});
  // the largest batch at the largest factor stays a defined, finite capacity
  c = small_config();
  c.capacity.factor = 1e6;
  CHECK(expert_capacity(c, max_tokens) ==
        static_cast<std::int64_t>(std::ceil(static_cast<double>(max_tokens) * 2.0 / 4.0 * 1e6)));
  // the shared formula never converts an out-of-range double
  CHECK(capacity_from_factor(std::numeric_limits<std::int64_t>::max(), 1, 8192, true, 1e300,
                             true) == static_cast<std::int64_t>(4.0e18));
  CHECK(capacity_from_factor(-100, 4, 2, true, 1.0, true) == 0);
}

TEST_CASE("hostile: dispatch rejects a gating_output of another config or corrupted",
          "[hostile][reliability]") {
  const auto r = route_small();
  auto other = r.cfg;
  other.top_k = 1;
  expect_error([&] { (void)ref::dispatch(other, r.g); }, status_code::invalid_argument,
               {"gating_output.k = 2", "top_k = 1"});
  other = r.cfg;
  other.num_experts = 8;
  expect_error([&] { (void)ref::dispatch(other, r.g); }, status_code::invalid_argument,
               {"gating_output.experts = 4", "num_experts = 8"});
  // gated without reroute candidates, dispatched with next_choice: it would reroute nothing
  other = r.cfg;
  other.dispatch.dropped = drop_policy::next_choice;
  expect_error([&] { (void)ref::dispatch(other, r.g); }, status_code::invalid_argument,
               {"reroute_candidates = 0"});
  auto g = r.g;
  g.ids[3] = 4;
  expect_error([&] { (void)ref::dispatch(r.cfg, g); }, status_code::invalid_argument,
               {"gating_output.ids[3] = 4", "num_experts = 4"});
  g = r.g;
  g.ids[0] = -1;
  expect_error([&] { (void)ref::dispatch(r.cfg, g); }, status_code::invalid_argument,
               {"ids[0] = -1"});
  g = r.g;
  g.gates[5] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { (void)ref::dispatch(r.cfg, g); }, status_code::invalid_argument,
               {"gating_output.gates[5]", "not finite"});
  g = r.g;
  g.ids.pop_back();
  expect_error([&] { (void)ref::dispatch(r.cfg, g); }, status_code::invalid_shape,
               {"gating_output.ids", "11 elements", "expected 12"});
  g = r.g;
  g.valid.resize(2);
  expect_error([&] { (void)ref::dispatch(r.cfg, g); }, status_code::invalid_shape,
               {"gating_output.valid"});
  g = r.g;
  g.tokens = -1;
  expect_error([&] { (void)ref::dispatch(r.cfg, g); }, status_code::invalid_shape,
               {"gating_output.tokens"});
  auto bad = r.cfg;
  bad.capacity.factor = -1.0;
  expect_error([&] { (void)ref::dispatch(bad, r.g); }, status_code::invalid_config,
               {"capacity.factor"});
}

TEST_CASE("hostile: layouts reject corrupted dispatch outputs", "[hostile][reliability]") {
  const auto r = route_small();
  expect_error([&] { (void)ref::layout(r.cfg, r.d, layout_kind::compact, 0); },
               status_code::invalid_argument, {"block_size = 0"});
  expect_error([&] { (void)ref::layout(r.cfg, r.d, layout_kind::compact, -4); },
               status_code::invalid_argument, {"block_size = -4"});
  auto d = r.d;
  d.slot.pop_back();
  expect_error([&] { (void)ref::layout(r.cfg, d, layout_kind::padded); },
               status_code::invalid_shape, {"dispatch_output.slot", "expected 12"});
  d = r.d;
  d.load.resize(2);
  expect_error([&] { (void)ref::layout(r.cfg, d, layout_kind::compact); },
               status_code::invalid_shape, {"dispatch_output.load"});
  // a slot past the expert's capacity would write outside the expert's segment
  d = r.d;
  std::size_t a = 0;
  while (d.expert[a] < 0) ++a;
  d.slot[a] = static_cast<std::int32_t>(d.capacity);
  expect_error([&] { (void)ref::layout(r.cfg, d, layout_kind::padded); },
               status_code::invalid_argument, {"assignment", "outside that expert's segment"});
  d = r.d;
  d.expert[a] = 9;
  expect_error([&] { (void)ref::layout(r.cfg, d, layout_kind::padded); },
               status_code::invalid_argument, {"expert 9"});
  d = r.d;
  d.tokens = -3;
  expect_error([&] { (void)ref::layout(r.cfg, d, layout_kind::padded); },
               status_code::invalid_shape, {"tokens = -3"});
  d = r.d;
  d.capacity = unbounded_capacity;
  expect_error([&] { (void)ref::layout(r.cfg, d, layout_kind::padded); }, status_code::unsupported,
               {"bounded capacity"});
}

TEST_CASE("hostile: permute rejects wrong extents and a layout of another batch",
          "[hostile][reliability]") {
  const auto r = route_small(6);
  const std::int64_t d = 3;
  std::vector<float> x(6 * d, 1.0f), out(static_cast<std::size_t>(r.L.num_rows * d));
  ref::permute<float>(r.cfg, r.L, x, 6, d, out);  // the good call works
  expect_error(
      [&] { ref::permute<float>(r.cfg, r.L, std::span<const float>(x).first(17), 6, d, out); },
      status_code::invalid_shape, {"x", "17 elements", "expected 18"});
  expect_error(
      [&] {
        ref::permute<float>(r.cfg, r.L, x, 6, d, std::span<float>(out).first(out.size() - 1));
      },
      status_code::invalid_shape, {"out"});
  expect_error([&] { ref::permute<float>(r.cfg, r.L, x, 6, -3, out); }, status_code::invalid_shape,
               {"hidden size d", "-3"});
  expect_error([&] { ref::permute<float>(r.cfg, r.L, x, 6, max_hidden + 1, out); },
               status_code::invalid_shape, {"hidden size d", "max_hidden"});
  expect_error([&] { ref::permute<float>(r.cfg, r.L, x, -6, -3, out); }, status_code::invalid_shape,
               {"tokens", "-6"});
  // the layout refers to tokens 0..5; a 3-token x is another batch (would read past x)
  std::vector<float> x3(3 * d, 1.0f);
  expect_error([&] { ref::permute<float>(r.cfg, r.L, x3, 3, d, out); },
               status_code::invalid_argument, {"layout_output.row_token", "tokens = 3"});
  // rows * d overflowing int64 is a size mismatch, not UB
  auto L = r.L;
  L.num_rows = std::numeric_limits<std::int64_t>::max() / 2;
  expect_error([&] { ref::permute<float>(r.cfg, L, x, 6, d, out); }, status_code::invalid_argument,
               {"layout_output.row_token"});
}

TEST_CASE("hostile: combine rejects mismatched config, layout and buffers",
          "[hostile][reliability]") {
  const auto r = route_small(6);
  const std::int64_t d = 2;
  const std::vector<float> eo(static_cast<std::size_t>(r.L.num_rows * d), 1.0f), x(6 * d, 1.0f);
  std::vector<float> y(6 * d);
  ref::combine<float>(r.cfg, r.L, r.d, eo, d, x, y);  // the good call works
  auto other = r.cfg;
  other.top_k = 1;
  expect_error([&] { ref::combine<float>(other, r.L, r.d, eo, d, x, y); },
               status_code::invalid_argument, {"does not match config", "top_k = 1"});
  other = r.cfg;
  other.dispatch.dropped = drop_policy::fallback;  // adds a dedicated expert the dispatch lacks
  expect_error([&] { ref::combine<float>(other, r.L, r.d, eo, d, x, y); },
               status_code::invalid_argument, {"does not match config"});
  expect_error(
      [&] { ref::combine<float>(r.cfg, r.L, r.d, std::span<const float>(eo).first(3), d, x, y); },
      status_code::invalid_shape, {"expert_out", "3 elements"});
  expect_error(
      [&] { ref::combine<float>(r.cfg, r.L, r.d, eo, d, x, std::span<float>(y).first(11)); },
      status_code::invalid_shape, {"y", "11 elements", "expected 12"});
  expect_error([&] { ref::combine<float>(r.cfg, r.L, r.d, eo, -2, x, y); },
               status_code::invalid_shape, {"hidden size d", "-2"});
  auto res = r.cfg;
  res.dispatch.dropped = drop_policy::residual;
  expect_error(
      [&] { ref::combine<float>(res, r.L, r.d, eo, d, std::span<const float>(x).first(4), y); },
      status_code::invalid_shape, {"x (residual policy)", "4 elements"});
  // a layout of a different (smaller) batch
  const auto small = route_small(3);
  expect_error([&] { ref::combine<float>(r.cfg, small.L, r.d, eo, d, x, y); },
               status_code::invalid_shape, {"layout_output.assignment_row"});
  auto L = r.L;
  L.assignment_row[1] = L.num_rows + 5;
  expect_error([&] { ref::combine<float>(r.cfg, L, r.d, eo, d, x, y); },
               status_code::invalid_argument, {"layout_output.assignment_row[1]"});
  auto dsp = r.d;
  dsp.weight.resize(3);
  expect_error([&] { ref::combine<float>(r.cfg, r.L, dsp, eo, d, x, y); },
               status_code::invalid_shape, {"dispatch_output.weight"});
}

TEST_CASE("hostile: losses reject a gating_output of another config", "[hostile][reliability]") {
  const auto r = route_small(8);
  CHECK(std::isfinite(ref::aux_loss(r.cfg, r.g).value));
  auto other = r.cfg;
  other.num_experts = 8;
  expect_error([&] { (void)ref::aux_loss(other, r.g); }, status_code::invalid_argument,
               {"does not match config", "num_experts = 8"});
  expect_error([&] { (void)ref::z_loss(other, r.g); }, status_code::invalid_argument,
               {"num_experts = 8"});
  expect_error([&] { (void)ref::sequence_aux_loss(other, r.g); }, status_code::invalid_argument,
               {"num_experts = 8"});
  auto g = r.g;
  g.aux_count.pop_back();
  expect_error([&] { (void)ref::aux_loss(r.cfg, g); }, status_code::invalid_shape,
               {"gating_output.aux_count"});
  g = r.g;
  g.logsumexp.resize(2);
  expect_error([&] { (void)ref::z_loss(r.cfg, g); }, status_code::invalid_shape,
               {"gating_output.logsumexp"});
  g = r.g;
  g.sequences = 3;  // no per-sequence arrays behind it
  expect_error([&] { (void)ref::sequence_aux_loss(r.cfg, g); }, status_code::invalid_shape,
               {"gating_output.seq_score_sum"});
  auto bad = r.cfg;
  bad.loss.aux_coefficient = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { (void)ref::aux_loss(bad, r.g); }, status_code::invalid_config,
               {"loss.aux_coefficient"});
  // sums from shards: lengths must be E each, tokens >= 0
  const std::vector<double> ss(4, 1.0), ss3(3, 1.0);
  const std::vector<std::int64_t> cc(4, 2);
  CHECK(ref::aux_loss_from_sums(r.cfg, ss, cc, 8) > 0.0);
  expect_error([&] { (void)ref::aux_loss_from_sums(r.cfg, ss3, cc, 8); },
               status_code::invalid_shape, {"score_sum has 3", "num_experts = 4"});
  expect_error([&] { (void)ref::aux_loss_from_sums(r.cfg, ss, std::vector<std::int64_t>(5), 8); },
               status_code::invalid_shape, {"counts 5"});
  expect_error([&] { (void)ref::aux_loss_from_sums(r.cfg, ss, cc, -1); },
               status_code::invalid_shape, {"tokens", "-1"});
}

TEST_CASE("hostile: route() on NaN/Inf/denormal/huge logits stays finite and valid",
          "[hostile][reliability]") {
  // every row a different hostile pattern; the routing must still be defined and finite
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  const float den = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {nan,  nan,  nan,  nan,  inf,    inf,    -inf,  0.f,
                                den,  -den, den,  0.f,  3e38f,  -3e38f, 3e38f, 1.f,
                                -inf, -inf, -inf, -inf, 1e-30f, 1e30f,  -0.f,  0.f};
  for (auto score :
       {score_function::softmax, score_function::sigmoid, score_function::sqrt_softplus}) {
    auto cfg = small_config();
    cfg.gating.score = score;
    cfg.gating.renorm = renormalize::before_drop;
    const auto r = ref::route<float>(cfg, x, 6);
    CHECK(r.gating.nonfinite_logits == 11);  // 4 NaN, 3 +-Inf, 4 -Inf
    for (std::int64_t t = 0; t < 6; ++t) {
      CHECK(r.gating.ids[t * 2] != r.gating.ids[t * 2 + 1]);
      CHECK(std::isfinite(r.gating.logsumexp[t]));
    }
    for (float gt : r.gating.gates) CHECK((std::isfinite(gt) && gt >= 0.0f && gt <= 1.0f));
    CHECK(std::isfinite(r.losses.aux.value));
    CHECK(std::isfinite(r.losses.z.value));
    // the all-NaN row ranks as all -FLT_MAX: ties to the lower index
    CHECK(r.gating.ids[0] == 0);
    CHECK(r.gating.ids[1] == 1);
  }
}
