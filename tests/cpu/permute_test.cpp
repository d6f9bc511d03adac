// SPDX-License-Identifier: Apache-2.0
// cpu::permute against reference::permute on the row case grid: fp32 / fp16 / bf16 rows bit for
// bit, rows past num_rows untouched.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <moeroute/cpu/permute.hpp>
#include <moeroute/reference.hpp>

#include "row_cases.hpp"

namespace moeroute::test {

TEST_CASE("cpu permute equals the reference bit for bit", "[cpu][permute]") {
  for_each_row_case([](const row_case& c) {
    for_each_row_width([&]<class H>(std::int64_t hidden) {
      const std::int64_t T = c.d.tokens, rows = c.cl.p.max_rows, used = c.L.num_rows;
      INFO("hidden " << hidden << " rows " << rows << " element " << sizeof(H));
      const auto x = random_values<H>(static_cast<std::size_t>(T * hidden), c.seed);
      std::vector<H> buf(static_cast<std::size_t>(rows * hidden), from_float<H>(7.0f));
      std::vector<H> want(static_cast<std::size_t>(used * hidden));
      reference::permute<H>(c.cfg, c.L, x, T, hidden, want);
      const permute_params<H> pp{x.data(), T, hidden, c.cl.view(), rows, buf.data()};
      REQUIRE(cpu::permute(c.cfg, pp).ok());
      require_same_bits("permute", std::vector<H>(buf.begin(), buf.begin() + used * hidden), want);
      for (std::size_t i = static_cast<std::size_t>(used * hidden); i < buf.size(); ++i)
        if (to_float(buf[i]) != 7.0f) FAIL("permute wrote row element " << i << " past num_rows");
    });
  });
}

}  // namespace moeroute::test
