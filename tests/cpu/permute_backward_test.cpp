// SPDX-License-Identifier: Apache-2.0
// cpu::permute_backward against reference::permute_backward on the row case grid: d x bit for
// bit, written and accumulated (on top of the residual pass-through, as an engine calls it).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <moeroute/cpu/permute_backward.hpp>
#include <moeroute/reference.hpp>

#include "row_cases.hpp"

namespace moeroute::test {

TEST_CASE("cpu permute backward equals the reference bit for bit", "[cpu][backward]") {
  for_each_row_case([](const row_case& c) {
    for_each_row_width([&]<class H>(std::int64_t hidden) {
      const std::int64_t T = c.d.tokens, rows = c.cl.p.max_rows, used = c.L.num_rows;
      INFO("hidden " << hidden << " rows " << rows << " element " << sizeof(H));
      const auto dbuf = random_values<H>(static_cast<std::size_t>(rows * hidden), c.seed + 3);
      const auto start = random_values<H>(static_cast<std::size_t>(T * hidden), c.seed + 4);
      for (const bool accumulate : {false, true}) {
        std::vector<H> want(start), got(start);
        reference::permute_backward<H>(c.cfg, c.L, c.d,
                                       std::vector<H>(dbuf.begin(), dbuf.begin() + used * hidden),
                                       hidden, want, accumulate);
        const permute_backward_params<H> q{dbuf.data(), rows,       T,         hidden,
                                           c.cl.view(), accumulate, got.data()};
        REQUIRE(cpu::permute_backward(c.cfg, q).ok());
        require_same_bits(accumulate ? "permute backward (accumulate)" : "permute backward", got,
                          want);
      }
    });
  });
}

}  // namespace moeroute::test
