// SPDX-License-Identifier: Apache-2.0
// cpu::router, the owning router, against the reference on every preset: the same ids, experts,
// slots, fates, counts and layout rows exactly; the layer output, the losses and every gradient
// (d expert_out, d x, d logits) within float rounding of the reference's; batches smaller than
// the router's maximum, one after another on the same buffers; one allocation through the
// allocator parameter; and the errors of a misuse, each naming what is wrong.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <moeroute/cpu/router.hpp>
#include <moeroute/names.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include "../common/dispatch_cases.hpp"

namespace moeroute::test {
namespace {

/// Counts the allocator's calls and the bytes it holds.
struct allocation_log {
  int allocations = 0, deallocations = 0;
  std::size_t bytes = 0;
};
template <class T>
struct counting_allocator {
  using value_type = T;
  allocation_log* log;
  explicit counting_allocator(allocation_log* l) : log(l) {}
  template <class U>
  counting_allocator(const counting_allocator<U>& o) noexcept : log(o.log) {}
  T* allocate(std::size_t n) {
    ++log->allocations;
    log->bytes += n * sizeof(T);
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    ++log->deallocations;
    log->bytes -= n * sizeof(T);
    std::allocator<T>().deallocate(p, n);
  }
  template <class U>
  bool operator==(const counting_allocator<U>& o) const noexcept {
    return log == o.log;
  }
};

std::vector<float> values(std::size_t n, std::uint64_t seed, float lo, float hi) {
  lcg r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = r.uniform(lo, hi);
  return v;
}

bool close(double got, double want, double rel, double abs) {
  return std::fabs(got - want) <= abs + rel * std::fabs(want);
}

/// One batch of T tokens through `r` and through the reference; every output compared.
void check_batch(cpu::router<float>& r, const routing_config& cfg, std::int64_t T,
                 std::uint64_t seed) {
  const std::int64_t D = r.hidden();
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;
  const auto logits = values(static_cast<std::size_t>(T * E), seed, -3.0f, 3.0f);
  const auto x = values(static_cast<std::size_t>(T * D), seed + 1, -1.0f, 1.0f);
  std::vector<float> bias;
  if (cfg.gating.expert_bias) bias = values(static_cast<std::size_t>(E), seed + 2, -0.5f, 0.5f);

  REQUIRE(r.route(logits, bias).ok());
  const auto want = reference::route<float>(cfg, logits, T, bias);
  const auto& g = want.gating;
  const auto& dsp = want.dispatch;
  const auto L = reference::layout(cfg, dsp, layout_kind::padded);
  REQUIRE(r.tokens() == T);
  REQUIRE(r.rows() == L.num_rows);
  const const_gating_result gated = r.gated();
  const const_dispatch_result got = r.dispatched();
  const const_layout_result lay = r.layout();
  for (std::int64_t a = 0; a < T * k; ++a) {
    INFO("assignment " << a);
    REQUIRE(gated.d_ids[a] == g.ids[static_cast<std::size_t>(a)]);
    REQUIRE(got.d_expert[a] == dsp.expert[static_cast<std::size_t>(a)]);
    REQUIRE(got.d_slot[a] == dsp.slot[static_cast<std::size_t>(a)]);
    REQUIRE(got.d_fate[a] == dsp.fates[static_cast<std::size_t>(a)]);
    REQUIRE(lay.d_assignment_row[a] == L.assignment_row[static_cast<std::size_t>(a)]);
    REQUIRE(close(got.d_weight[a], dsp.weight[static_cast<std::size_t>(a)], 1e-5, 1e-7));
  }
  for (std::int32_t e = 0; e <= cfg.total_experts(); ++e)
    REQUIRE(r.offsets()[static_cast<std::size_t>(e)] == L.offsets[static_cast<std::size_t>(e)]);
  REQUIRE(r.totals().kept == dsp.total_kept);
  REQUIRE(r.totals().dropped == dsp.total_dropped);
  REQUIRE(r.totals().capacity == dsp.capacity);
  REQUIRE(close(r.losses().aux, want.losses.aux.value, 1e-6, 1e-9));
  REQUIRE(close(r.losses().z, want.losses.z.value, 1e-5, 1e-9));

  // forward: permute -> experts (row r scaled by 1 + expert / 8) -> combine
  std::span<float> expert_in, y;
  REQUIRE(r.permute(x, expert_in).ok());
  REQUIRE(static_cast<std::int64_t>(expert_in.size()) == L.num_rows * D);
  const auto scale_rows = [&](std::span<float> rows) {
    for (std::int32_t e = 0; e < cfg.total_experts(); ++e)
      for (std::int64_t i = L.offsets[e] * D; i < L.offsets[e + 1] * D; ++i)
        rows[static_cast<std::size_t>(i)] *= 1.0f + float(e) / 8.0f;
  };
  scale_rows(expert_in);
  const std::vector<float> expert_out(expert_in.begin(), expert_in.end());
  REQUIRE(r.combine(expert_out, x, y).ok());
  std::vector<float> rbuf(static_cast<std::size_t>(L.num_rows * D)),
      ry(static_cast<std::size_t>(T * D));
  reference::permute<float>(cfg, L, x, T, D, rbuf);
  scale_rows(rbuf);
  reference::combine<float>(cfg, L, dsp, rbuf, D, x, ry);
  for (std::size_t i = 0; i < ry.size(); ++i) {
    INFO("y[" << i << "]");
    REQUIRE(close(y[i], ry[i], 1e-5, 1e-6));
  }

  // backward of L = sum(y * w): combine, the experts, permute; then the router's logits
  const auto dy = values(static_cast<std::size_t>(T * D), seed + 3, -1.0f, 1.0f);
  std::span<float> d_expert_out, d_x, d_logits;
  REQUIRE(r.combine_backward(dy, expert_out, d_expert_out).ok());
  std::vector<float> rd_out(rbuf.size()), rd_w(static_cast<std::size_t>(T * k)), rd_x(ry.size());
  reference::combine_backward<float>(cfg, L, dsp, rbuf, D, dy, rd_out, rd_w, rd_x);
  for (std::size_t i = 0; i < rd_out.size(); ++i)
    REQUIRE(close(d_expert_out[i], rd_out[i], 1e-5, 1e-6));
  scale_rows(d_expert_out);
  scale_rows(rd_out);
  REQUIRE(r.permute_backward(d_expert_out, d_x).ok());
  reference::permute_backward<float>(cfg, L, dsp, rd_out, D, rd_x, /*accumulate=*/true);
  for (std::size_t i = 0; i < rd_x.size(); ++i) {
    INFO("d x[" << i << "]");
    REQUIRE(close(d_x[i], rd_x[i], 1e-5, 1e-6));
  }
  REQUIRE(r.gating_backward(logits, d_logits).ok());
  std::vector<float> rd_logits(static_cast<std::size_t>(T * E), 0.0f);
  reference::gating_backward<float>(cfg, logits, g, dsp, rd_w, rd_logits);
  for (std::size_t i = 0; i < rd_logits.size(); ++i) {
    INFO("d logits[" << i << "]");
    REQUIRE(close(d_logits[i], rd_logits[i], 1e-4, 1e-5));
  }
}

TEST_CASE("cpu::router equals the reference on every preset, batch after batch", "[router]") {
  std::size_t presets_checked = 0;
  for (const auto& p : presets::registry) {
    const std::int32_t E = p.default_experts > 64 ? 64 : p.default_experts;
    routing_config cfg = presets::by_name(p.name, E, std::min(p.default_k, E));
    if (cfg.capacity.mode == capacity_mode::unbounded) {  // the padded layout needs a bound
      cfg.capacity.mode = capacity_mode::factor;
      cfg.capacity.factor = 1.0;
    }
    REQUIRE(validate(cfg).ok());
    ++presets_checked;
    for (const drop_policy policy : {cfg.dispatch.dropped, drop_policy::residual}) {
      routing_config c = cfg;
      c.dispatch.dropped = policy;
      if (!validate(c)) continue;
      DYNAMIC_SECTION(p.name << " / " << to_string(policy)) {
        cpu::router<float> r(c, /*max_tokens=*/96, /*hidden=*/24);
        for (const std::int64_t T : {96, 40, 1, 96}) check_batch(r, c, T, 17 + T);
      }
    }
  }
  REQUIRE(presets_checked == std::size(presets::registry));
}

TEST_CASE("cpu::router makes one allocation through its allocator", "[router]") {
  allocation_log log;
  {
    const routing_config cfg = presets::deepspeed_top2(8, 1.0);
    cpu::router<float, counting_allocator<std::byte>> r(cfg, 64, 16, {},
                                                        counting_allocator<std::byte>(&log));
    REQUIRE(log.allocations == 1);
    REQUIRE(log.bytes == r.bytes());
    const auto logits = values(64 * 8, 3, -2.0f, 2.0f);
    REQUIRE(r.route(logits).ok());
    REQUIRE(log.allocations == 1);  // route allocates nothing
  }
  REQUIRE(log.deallocations == 1);
  REQUIRE(log.bytes == 0);
}

TEST_CASE("cpu::router rejects misuse with a message naming it", "[router]") {
  const routing_config cfg = presets::deepspeed_top2(8, 1.0);
  SECTION("a bad config or size at construction throws") {
    routing_config bad = cfg;
    bad.top_k = 0;
    REQUIRE_THROWS_WITH(cpu::router<float>(bad, 16, 8), Catch::Contains("top_k"));
    REQUIRE_THROWS_WITH(cpu::router<float>(cfg, -1, 8), Catch::Contains("tokens"));
    REQUIRE_THROWS_WITH(cpu::router<float>(cfg, 16, -2), Catch::Contains("hidden"));
    cpu::router_options unbounded_padded;
    unbounded_padded.layout = layout_kind::padded;
    routing_config dropless = cfg;
    dropless.capacity.mode = capacity_mode::unbounded;
    REQUIRE_THROWS_WITH(cpu::router<float>(dropless, 16, 8, unbounded_padded),
                        Catch::Contains("compact"));
  }
  cpu::router<float> r(cfg, 16, 8);
  std::span<float> out;
  const std::vector<float> x(16 * 8, 1.0f);
  SECTION("a stage before route") {
    const status s = r.permute(x, out);
    REQUIRE(!s.ok());
    REQUIRE_THAT(s.message, Catch::Contains("route first"));
  }
  SECTION("more tokens than the router holds") {
    const std::vector<float> logits(17 * 8, 0.5f);
    const status s = r.route(logits);
    REQUIRE(s.code == status_code::invalid_shape);
    REQUIRE_THAT(s.message, Catch::Contains("max_tokens"));
  }
  SECTION("logits not a multiple of E, and a mis-sized input") {
    const std::vector<float> ragged(8 * 3 + 1, 0.5f), logits(4 * 8, 0.5f);
    REQUIRE_THAT(r.route(ragged).message, Catch::Contains("multiple of E"));
    REQUIRE(r.route(logits).ok());
    const std::vector<float> short_x(4 * 8 - 1, 1.0f);
    REQUIRE_THAT(r.permute(short_x, out).message, Catch::Contains("x has 31 elements"));
  }
}

TEST_CASE("cpu::router: a dropless config gets the compact layout, with bf16 rows", "[router]") {
  const routing_config cfg = presets::mixtral(8);  // dropless
  cpu::router_options opt;
  opt.block_size = 16;
  cpu::router<bf16_bits> r(cfg, 64, 16, opt);
  const auto logits = values(64 * 8, 9, -2.0f, 2.0f);
  REQUIRE(r.layout_kind_used() == layout_kind::compact);
  REQUIRE(r.route(logits).ok());
  const auto want = reference::route<float>(cfg, logits, 64);
  const auto L = reference::layout(cfg, want.dispatch, layout_kind::compact, 16);
  REQUIRE(r.totals().dropped == 0);
  REQUIRE(r.rows() == layout_max_rows(cfg, 64, layout_kind::compact, 16));
  for (std::int64_t a = 0; a < 64 * 2; ++a)
    REQUIRE(r.layout().d_assignment_row[a] == L.assignment_row[static_cast<std::size_t>(a)]);
  std::vector<bf16_bits> x(64 * 16);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = from_float<bf16_bits>(float(i % 13) / 4.0f);
  std::span<bf16_bits> expert_in, y;
  REQUIRE(r.permute(x, expert_in).ok());
  REQUIRE(r.combine(expert_in, x, y).ok());  // identity experts: y = (sum of weights) x
  for (std::int64_t t = 0; t < 64; ++t) {
    float w = 0.0f;
    for (std::int32_t j = 0; j < 2; ++j)
      w += want.dispatch.weight[static_cast<std::size_t>(t * 2 + j)];
    for (std::int64_t c = 0; c < 16; ++c)
      REQUIRE(close(to_float(y[static_cast<std::size_t>(t * 16 + c)]),
                    w * to_float(x[static_cast<std::size_t>(t * 16 + c)]), 1e-2, 1e-2));
  }
}

TEST_CASE("cpu::router: options.losses = false routes as the loss-keeping router, with no sums",
          "[router]") {
  routing_config cfg = serving_router_config();
  const auto logits = values(96 * 64, 21, -3.0f, 3.0f);
  const std::vector<float> bias(64, 0.0f);
  cpu::router<float> kept(cfg, 128, 8);
  cpu::router_options inference;
  inference.losses = false;
  cpu::router<float> serving(cfg, 128, 8, inference);
  REQUIRE(kept.route(logits, bias).ok());
  REQUIRE(serving.route(logits, bias).ok());
  const auto same = [](const auto* a, const auto* b, std::size_t n) {
    return std::equal(a, a + n, b);
  };
  const std::size_t n = 96 * 4;
  REQUIRE(same(kept.gated().d_ids, serving.gated().d_ids, n));
  REQUIRE(same(kept.gated().d_gates, serving.gated().d_gates, n));
  REQUIRE(same(kept.dispatched().d_weight, serving.dispatched().d_weight, n));
  REQUIRE(same(kept.layout().d_assignment_row, serving.layout().d_assignment_row, n));
  REQUIRE(kept.losses().aux > 0.0);
  REQUIRE(serving.losses().aux == 0.0);
  REQUIRE(serving.losses().z == 0.0);
  REQUIRE(serving.gated().sums.d_aux_count == nullptr);
  std::span<float> grad;
  REQUIRE_THAT(serving.gating_backward(logits, grad).message, Catch::Contains("options.losses"));
  cfg.training = true;
  REQUIRE_THROWS_WITH(cpu::router<float>(cfg, 16, 8, inference),
                      Catch::Contains("options.losses = false"));
}

}  // namespace
}  // namespace moeroute::test
