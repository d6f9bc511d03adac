// SPDX-License-Identifier: Apache-2.0
// cpu::combine_backward against reference::combine_backward on the row case grid: d expert_out
// and the residual d x bit for bit (padding rows past num_rows 0), d weight within fp32
// rounding (the backend sums the dot product in 16 fixed lanes, the reference in order).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <moeroute/cpu/combine_backward.hpp>
#include <moeroute/reference.hpp>

#include "row_cases.hpp"

namespace moeroute::test {

TEST_CASE("cpu combine backward equals the reference", "[cpu][backward]") {
  for_each_row_case([](const row_case& c) {
    for_each_row_width([&]<class H>(std::int64_t hidden) {
      const std::int64_t T = c.d.tokens, rows = c.cl.p.max_rows, used = c.L.num_rows;
      const std::int64_t k = c.cfg.top_k;
      INFO("hidden " << hidden << " rows " << rows << " element " << sizeof(H));
      const auto expert_out = random_values<H>(static_cast<std::size_t>(rows * hidden), c.seed + 1);
      const std::vector<H> used_out(expert_out.begin(), expert_out.begin() + used * hidden);
      const auto dy = random_values<H>(static_cast<std::size_t>(T * hidden), c.seed + 2);
      std::vector<H> want_dbuf(static_cast<std::size_t>(used * hidden)),
          want_dx(static_cast<std::size_t>(T * hidden));
      std::vector<float> want_dw(static_cast<std::size_t>(T * k));
      reference::combine_backward<H>(c.cfg, c.L, c.d, used_out, hidden, dy, want_dbuf, want_dw,
                                     want_dx);
      std::vector<H> dbuf(static_cast<std::size_t>(rows * hidden), from_float<H>(3.0f)),
          dx(want_dx.size(), from_float<H>(3.0f));
      std::vector<float> dw(want_dw.size(), 3.0f);
      const combine_backward_params<H> bp{
          expert_out.data(), dy.data(),   rows,        T,         hidden,
          c.cl.view(),       c.dv.view(), dbuf.data(), dw.data(), dx.data()};
      REQUIRE(cpu::combine_backward(c.cfg, bp).ok());
      require_same_bits("d expert_out", std::vector<H>(dbuf.begin(), dbuf.begin() + used * hidden),
                        want_dbuf);
      for (std::size_t i = static_cast<std::size_t>(used * hidden); i < dbuf.size(); ++i)
        if (to_float(dbuf[i]) != 0.0f)  // padding rows past num_rows: no token, gradient 0
          FAIL("d expert_out[" << i << "] past num_rows is not 0");
      require_same_bits("d x (residual)", dx, want_dx);
      for (std::size_t i = 0; i < dw.size(); ++i)
        if (std::fabs(dw[i] - want_dw[i]) >
            1e-5f * (std::fabs(want_dw[i]) + static_cast<float>(hidden)))
          FAIL("d weight[" << i << "] = " << dw[i] << ", reference " << want_dw[i]);
    });
  });
}

}  // namespace moeroute::test
