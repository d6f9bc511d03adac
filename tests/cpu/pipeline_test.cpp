// SPDX-License-Identifier: Apache-2.0
// The CPU backend's stages after dispatch against the reference, on the dispatch case grid:
// layout (padded and compact, every field exactly), permute and combine (fp32 / fp16 / bf16,
// bit for bit), combine and permute backward (d expert_out and d x bit for bit, d weight within
// fp32 rounding), the losses from the same sums and the expert-bias update (bit for bit); run
// serially and on OpenMP with the same bits; plus the errors these stages return.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include <moeroute/cpu/combine.hpp>
#include <moeroute/cpu/combine_backward.hpp>
#include <moeroute/cpu/dispatch.hpp>
#include <moeroute/cpu/expert_bias_update.hpp>
#include <moeroute/cpu/layout.hpp>
#include <moeroute/cpu/losses.hpp>
#include <moeroute/cpu/permute.hpp>
#include <moeroute/reference.hpp>

#include "../common/dispatch_cases.hpp"
#include "layout_harness.hpp"

namespace moeroute::test {
namespace {

template <class H>
std::vector<H> random_values(std::size_t n, std::uint64_t seed) {
  lcg r(seed);
  std::vector<H> v(n);
  for (auto& x : v) x = from_float<H>(r.uniform(-2.0f, 2.0f));
  return v;
}

template <class H>
void require_same_bits(const char* what, const std::vector<H>& got, const std::vector<H>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(H)) != 0)
      FAIL(what << "[" << i << "] differs from the reference (" << to_float(got[i]) << " vs "
                << to_float(want[i]) << ")");
}

/// permute, combine and both backward passes of one layout, element type H.
template <class H>
void check_rows(const routing_config& cfg, const reference::dispatch_output& d,
                const reference::layout_output& L, const cpu_layout& cl, std::int64_t hidden,
                std::uint64_t seed) {
  const std::int64_t T = d.tokens, rows = cl.p.max_rows, k = cfg.top_k;
  INFO("hidden " << hidden << " rows " << rows << " element " << sizeof(H));
  dispatch_view dv{d, d.totals()};
  const auto x = random_values<H>(static_cast<std::size_t>(T * hidden), seed);
  // permute: the reference's rows, and the rows past num_rows untouched
  std::vector<H> buf(static_cast<std::size_t>(rows * hidden), from_float<H>(7.0f));
  std::vector<H> want_buf(static_cast<std::size_t>(L.num_rows * hidden));
  reference::permute<H>(cfg, L, x, T, hidden, want_buf);
  permute_params<H> pp{x.data(), T, hidden, cl.view(), rows, buf.data()};
  REQUIRE(cpu::permute(cfg, pp).ok());
  std::vector<H> got_used(buf.begin(), buf.begin() + L.num_rows * hidden);
  require_same_bits("permute", got_used, want_buf);
  for (std::size_t i = static_cast<std::size_t>(L.num_rows * hidden); i < buf.size(); ++i)
    if (to_float(buf[i]) != 7.0f) FAIL("permute wrote row element " << i << " past num_rows");
  // combine (expert outputs: random rows of the full buffer)
  const auto expert_out = random_values<H>(static_cast<std::size_t>(rows * hidden), seed + 1);
  std::vector<H> want_y(static_cast<std::size_t>(T * hidden));
  const std::vector<H> used_out(expert_out.begin(), expert_out.begin() + L.num_rows * hidden);
  reference::combine<H>(cfg, d, L, used_out, hidden, x, want_y);
  std::vector<H> y(want_y.size(), from_float<H>(9.0f)), y2(want_y.size());
  combine_params<H> cp{expert_out.data(), rows,      T,        hidden,
                       cl.view(),         dv.view(), x.data(), y.data()};
  REQUIRE(cpu::combine(cfg, cp, cpu::executor::serial()).ok());
  require_same_bits("combine", y, want_y);
  cp.d_y = y2.data();
  REQUIRE(cpu::combine(cfg, cp).ok());
  require_same_bits("combine (OpenMP)", y2, y);
  // combine backward
  const auto dy = random_values<H>(static_cast<std::size_t>(T * hidden), seed + 2);
  std::vector<H> want_dbuf(static_cast<std::size_t>(L.num_rows * hidden)),
      want_dx(static_cast<std::size_t>(T * hidden));
  std::vector<float> want_dw(static_cast<std::size_t>(T * k));
  reference::combine_backward<H>(cfg, d, L, used_out, hidden, dy, want_dbuf, want_dw, want_dx);
  std::vector<H> dbuf(static_cast<std::size_t>(rows * hidden), from_float<H>(3.0f)),
      dx(want_dx.size(), from_float<H>(3.0f));
  std::vector<float> dw(want_dw.size(), 3.0f);
  combine_backward_params<H> bp{expert_out.data(), dy.data(), rows,        T,         hidden,
                                cl.view(),         dv.view(), dbuf.data(), dw.data(), dx.data()};
  REQUIRE(cpu::combine_backward(cfg, bp).ok());
  require_same_bits("d expert_out",
                    std::vector<H>(dbuf.begin(), dbuf.begin() + L.num_rows * hidden), want_dbuf);
  for (std::size_t i = static_cast<std::size_t>(L.num_rows * hidden); i < dbuf.size(); ++i)
    if (to_float(dbuf[i]) != 0.0f)  // padding rows past num_rows: no token, gradient 0
      FAIL("d expert_out[" << i << "] past num_rows is not 0");
  require_same_bits("d x (residual)", dx, want_dx);
  for (std::size_t i = 0; i < dw.size(); ++i)
    if (std::fabs(dw[i] - want_dw[i]) >
        1e-5f * (std::fabs(want_dw[i]) + static_cast<float>(hidden)))
      FAIL("d weight[" << i << "] = " << dw[i] << ", reference " << want_dw[i]);
  // permute backward, written and accumulated
  for (const bool accumulate : {false, true}) {
    std::vector<H> want(dx), got(dx);
    reference::permute_backward<H>(cfg, d, L,
                                   std::vector<H>(dbuf.begin(), dbuf.begin() + L.num_rows * hidden),
                                   hidden, want, accumulate);
    permute_backward_params<H> q{dbuf.data(), rows, T, hidden, cl.view(), accumulate, got.data()};
    REQUIRE(cpu::permute_backward(cfg, q).ok());
    require_same_bits(accumulate ? "permute backward (accumulate)" : "permute backward", got, want);
  }
}

void check_case(std::int64_t T, std::int32_t E, std::int32_t k, const case_spec& s,
                std::uint64_t seed) {
  INFO(describe(s, T, E, k));
  const routing_config cfg = make_config(E, k, s, T);
  const auto gating = make_gating(cfg, T, seed, s.masked);
  const auto d = reference::dispatch(cfg, gating);
  dispatch_view dv{d, d.totals()};
  for (const auto& [kind, block] : {std::pair{layout_kind::padded, std::int64_t{1}},
                                    std::pair{layout_kind::compact, std::int64_t{1}},
                                    std::pair{layout_kind::compact, std::int64_t{16}}}) {
    if (kind == layout_kind::padded && cfg.capacity.mode == capacity_mode::unbounded) continue;
    INFO((kind == layout_kind::padded ? "padded" : "compact") << " block " << block);
    const auto L = reference::layout(cfg, d, kind, block);
    cpu_layout cl(cfg, dv.view(), T, kind, block);
    const auto st = cpu::layout(cfg, cl.p);
    INFO(st.message);
    REQUIRE(st.ok());
    REQUIRE(cl.num_rows == L.num_rows);
    REQUIRE(cl.offsets == L.offsets);
    REQUIRE(cl.rows_used == L.rows_used);
    REQUIRE(cl.assignment_row == L.assignment_row);
    REQUIRE(std::vector<std::int32_t>(cl.row_token.begin(), cl.row_token.begin() + L.num_rows) ==
            L.row_token);
    REQUIRE(std::count(cl.row_token.begin() + L.num_rows, cl.row_token.end(), -1) ==
            static_cast<std::ptrdiff_t>(cl.row_token.size()) - L.num_rows);
    if (kind == layout_kind::compact) {
      std::vector<std::int32_t> want_blocks = L.block_expert;
      want_blocks.resize(cl.block_expert.size(), -1);
      REQUIRE(cl.block_expert == want_blocks);
    }
    // 552 = 8 x 64 + 2 x 16 + 8: the row kernels' 64-, 16-column and scalar steps in one row
    for (const std::int64_t hidden : {std::int64_t{1}, std::int64_t{40}, std::int64_t{552}}) {
      check_rows<float>(cfg, d, L, cl, hidden, seed);
      check_rows<bf16_bits>(cfg, d, L, cl, hidden, seed);
      if (hidden == 40) check_rows<half_bits>(cfg, d, L, cl, hidden, seed);
    }
  }
}

}  // namespace

TEST_CASE("cpu layout, permute, combine and backward: every policy", "[cpu][pipeline]") {
  struct shape {
    std::int64_t T;
    std::int32_t E, k;
  };
  std::uint64_t seed = 7;
  for (const shape sh : {shape{7, 6, 2}, shape{96, 60, 4}, shape{300, 8, 8}})
    for (int prio = 0; prio < 5; ++prio)
      for (int drop = 0; drop < static_cast<int>(drop_case::count); ++drop) {
        case_spec s;
        s.prio = static_cast<priority>(prio);
        s.drop = static_cast<drop_case>(drop);
        s.slots = static_cast<slot_order>((prio + drop) % 2);
        s.cap = static_cast<cap_case>((prio + drop) % static_cast<int>(cap_case::count));
        s.masked = drop % 2 == 1;
        s.groups = (prio + drop) % 3 == 0 ? 3 : 1;
        s.after_drop = prio % 2 == 0;
        check_case(sh.T, sh.E, sh.k, s, seed++);
      }
}

namespace {
/// n elements of H at a 64-byte boundary (plus `offset` elements): a tensor as an engine's
/// allocator hands it out, or shifted off the boundary.
template <class H>
struct aligned_buffer {
  std::unique_ptr<H[], void (*)(H*)> p;
  H* data;
  aligned_buffer(std::size_t n, std::size_t offset)
      : p(static_cast<H*>(::operator new[]((n + offset) * sizeof(H), std::align_val_t{64})),
          [](H* q) { ::operator delete[](q, std::align_val_t{64}); }),
        data(p.get() + offset) {
    std::memset(static_cast<void*>(data), 0x5a, n * sizeof(H));
  }
};

template <class H>
void check_streamed_combine(const routing_config& cfg, std::int64_t T, std::int64_t hidden) {
  INFO("element " << sizeof(H) << " T " << T << " hidden " << hidden);
  const auto gating = make_gating(cfg, T, 5, false);
  const auto d = reference::dispatch(cfg, gating);
  dispatch_view dv{d, d.totals()};
  const auto L = reference::layout(cfg, d, layout_kind::compact, 1);
  cpu_layout cl(cfg, dv.view(), T, layout_kind::compact, 1);
  REQUIRE(cpu::layout(cfg, cl.p).ok());
  const std::int64_t rows = cl.p.max_rows;
  const auto x = random_values<H>(static_cast<std::size_t>(T * hidden), 3);
  const auto expert_out = random_values<H>(static_cast<std::size_t>(rows * hidden), 4);
  std::vector<H> want(static_cast<std::size_t>(T * hidden));
  reference::combine<H>(
      cfg, d, L, std::vector<H>(expert_out.begin(), expert_out.begin() + L.num_rows * hidden),
      hidden, x, want);
  // aligned (streamed), then one element off the boundary (stored): serial and OpenMP
  for (const std::size_t offset : {0, 1})
    for (const bool serial : {true, false}) {
      INFO("offset " << offset << (serial ? " serial" : " OpenMP"));
      aligned_buffer<H> y(want.size(), offset);
      combine_params<H> cp{expert_out.data(), rows,      T,        hidden,
                           cl.view(),         dv.view(), x.data(), y.data};
      REQUIRE(cpu::combine(cfg, cp, serial ? cpu::executor::serial() : cpu::executor{}).ok());
      require_same_bits("combine", std::vector<H>(y.data, y.data + want.size()), want);
    }
}
}  // namespace

// An output of cpu::rows::stream_min_bytes or more, aligned, is written past the caches
// (non-temporal stores where the ISA has them): the same bits as the reference's, and as the
// stored path's one element off the boundary.
TEST_CASE("cpu combine of a large output streams it with the reference's bits", "[cpu][pipeline]") {
  case_spec s;
  s.drop = drop_case::residual;  // dropped tokens copied from x between streamed rows
  s.cap = cap_case::factor;
  const routing_config cfg = make_config(16, 2, s, 2048);
  const std::int64_t hidden = 2048;
  REQUIRE(2048 * hidden * static_cast<std::int64_t>(sizeof(bf16_bits)) >=
          cpu::rows::stream_min_bytes);
  check_streamed_combine<bf16_bits>(cfg, 2048, hidden);
  check_streamed_combine<float>(cfg, 2048, hidden);
}

TEST_CASE("cpu losses and expert-bias update equal the reference bit for bit", "[cpu][losses]") {
  for (const std::int64_t L : {std::int64_t{0}, std::int64_t{7}, std::int64_t{50}}) {
    case_spec s;
    routing_config cfg = make_config(60, 4, s, 350);
    cfg.loss.sequence_length = L;
    cfg.loss.aux_coefficient = 0.01f;
    cfg.loss.z_coefficient = 0.001f;
    const auto g = make_gating(cfg, 350, 11, true);
    const auto want = reference::losses(cfg, g);
    double aux = -1, seq = -1, z = -1;
    loss_params p;
    p.tokens = g.tokens;
    p.sums = {g.aux_score_sum.data(),
              g.aux_count.data(),
              &g.valid_tokens,
              &want.z.sum_squares,
              nullptr,
              g.seq_score_sum.data(),
              g.seq_count.data(),
              g.seq_tokens.data()};
    p.d_aux_loss = &aux;
    p.d_sequence_aux_loss = &seq;
    p.d_z_loss = &z;
    REQUIRE(cpu::losses(cfg, p).ok());
    REQUIRE(std::memcmp(&aux, &want.aux.value, sizeof aux) == 0);
    REQUIRE(std::memcmp(&seq, &want.sequence_aux, sizeof seq) == 0);
    REQUIRE(std::memcmp(&z, &want.z.value, sizeof z) == 0);
    p.d_aux_loss = nullptr;
    p.sums.d_aux_count = nullptr;  // not needed without an aux output
    p.d_sequence_aux_loss = nullptr;
    REQUIRE(cpu::losses(cfg, p).ok());
    // the z sum is needed only with a z-loss: without one it is not read, and z is 0
    p.sums.d_z_sum_squares = nullptr;
    const auto st = cpu::losses(cfg, p);
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find("sums.d_z_sum_squares") != std::string::npos);
    routing_config no_z = cfg;
    no_z.loss.z_coefficient = 0.0f;
    z = -1;
    REQUIRE(cpu::losses(no_z, p).ok());
    REQUIRE(z == 0.0);
    REQUIRE(reference::losses(no_z, g).z.value == 0.0);
  }
  routing_config cfg;
  cfg.num_experts = 6;
  cfg.gating.bias_update.rate = 0.01f;
  for (const bool recenter : {false, true}) {
    cfg.gating.bias_update.recenter = recenter;
    std::vector<float> want = {0.1f, -0.2f, 0.0f, 0.05f, 0.3f, -0.1f}, got = want;
    const std::vector<std::int64_t> load = {10, 3, 7, 7, 0, 15};
    reference::expert_bias_update(cfg, want, load);
    REQUIRE(cpu::expert_bias_update(cfg, {got.data(), load.data()}).ok());
    REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  }
  REQUIRE(cpu::expert_bias_update(cfg, {nullptr, nullptr}).code == status_code::invalid_argument);
}

TEST_CASE("cpu layout and rows: errors name the argument", "[cpu][pipeline]") {
  case_spec s;
  const routing_config cfg = make_config(8, 2, s, 20);
  const auto g = make_gating(cfg, 20, 3, false);
  auto d = reference::dispatch(cfg, g);
  dispatch_view dv{d, d.totals()};
  cpu_layout cl(cfg, dv.view(), 20, layout_kind::padded, 1);
  REQUIRE(cpu::layout(cfg, cl.p).ok());
  auto p = cl.p;
  p.max_rows -= 1;
  REQUIRE(cpu::layout(cfg, p).code == status_code::invalid_shape);
  dv.d.slot[0] = 1000;  // outside its segment
  cpu_layout bad(cfg, dv.view(), 20, layout_kind::padded, 1);
  const auto st = cpu::layout(cfg, bad.p);
  REQUIRE(st.code == status_code::invalid_argument);
  REQUIRE(st.message.find("assignment 0") != std::string::npos);
  const std::vector<float> x(20 * 4);
  std::vector<float> y(20 * 4);
  cl.assignment_row[3] = 1 << 20;
  combine_params<float> cp{x.data(), cl.p.max_rows, 20, 4, cl.view(), dv.view(), nullptr, y.data()};
  const auto cs = cpu::combine(cfg, cp);
  INFO(cs.message);
  REQUIRE(cs.code == status_code::invalid_argument);
  REQUIRE(cs.message.find("layout.d_assignment_row[3]") != std::string::npos);
}

}  // namespace moeroute::test
