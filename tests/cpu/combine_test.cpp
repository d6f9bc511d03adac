// SPDX-License-Identifier: Apache-2.0
// cpu::combine against reference::combine on the row case grid (fp32 / fp16 / bf16 rows, bit for
// bit, serially and on OpenMP with the same bits), and a large aligned output written past the
// caches with the same bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <moeroute/cpu/combine.hpp>
#include <moeroute/cpu/detail/rows.hpp>
#include <moeroute/reference.hpp>

#include "row_cases.hpp"

namespace moeroute::test {

TEST_CASE("cpu combine equals the reference bit for bit, serial and OpenMP", "[cpu][combine]") {
  for_each_row_case([](const row_case& c) {
    for_each_row_width([&]<class H>(std::int64_t hidden) {
      const std::int64_t T = c.d.tokens, rows = c.cl.p.max_rows, used = c.L.num_rows;
      INFO("hidden " << hidden << " rows " << rows << " element " << sizeof(H));
      const auto x = random_values<H>(static_cast<std::size_t>(T * hidden), c.seed);
      // expert outputs: random rows of the full buffer
      const auto expert_out = random_values<H>(static_cast<std::size_t>(rows * hidden), c.seed + 1);
      std::vector<H> want(static_cast<std::size_t>(T * hidden));
      reference::combine<H>(c.cfg, c.L, c.d,
                            std::vector<H>(expert_out.begin(), expert_out.begin() + used * hidden),
                            hidden, x, want);
      std::vector<H> y(want.size(), from_float<H>(9.0f)), y2(want.size());
      combine_params<H> cp{expert_out.data(), rows,        T,        hidden,
                           c.cl.view(),       c.dv.view(), x.data(), y.data()};
      REQUIRE(cpu::combine(c.cfg, cp, cpu::executor::serial()).ok());
      require_same_bits("combine", y, want);
      cp.d_y = y2.data();
      REQUIRE(cpu::combine(c.cfg, cp).ok());
      require_same_bits("combine (OpenMP)", y2, y);
    });
  });
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
      cfg, L, d, std::vector<H>(expert_out.begin(), expert_out.begin() + L.num_rows * hidden),
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
TEST_CASE("cpu combine of a large output streams it with the reference's bits", "[cpu][combine]") {
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

}  // namespace moeroute::test
