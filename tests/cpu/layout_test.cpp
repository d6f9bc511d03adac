// SPDX-License-Identifier: Apache-2.0
// cpu::layout against reference::layout on the row case grid (padded, compact, compact in
// 16-row blocks): every field exactly, rows past num_rows left as padding; and the errors the
// layout and the row stages return, each naming the argument.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <moeroute/cpu/combine.hpp>
#include <moeroute/cpu/layout.hpp>
#include <moeroute/reference.hpp>

#include "row_cases.hpp"

namespace moeroute::test {

TEST_CASE("cpu layout equals the reference on every policy", "[cpu][layout]") {
  for_each_row_case([](const row_case& c) {
    const auto& L = c.L;
    const auto& cl = c.cl;
    REQUIRE(cl.num_rows == L.num_rows);
    REQUIRE(cl.offsets == L.offsets);
    REQUIRE(cl.rows_used == L.rows_used);
    REQUIRE(cl.assignment_row == L.assignment_row);
    REQUIRE(std::vector<std::int32_t>(cl.row_token.begin(), cl.row_token.begin() + L.num_rows) ==
            L.row_token);
    REQUIRE(std::count(cl.row_token.begin() + L.num_rows, cl.row_token.end(), -1) ==
            static_cast<std::ptrdiff_t>(cl.row_token.size()) - L.num_rows);
    if (c.cl.p.kind == layout_kind::compact) {
      std::vector<std::int32_t> want_blocks = L.block_expert;
      want_blocks.resize(cl.block_expert.size(), -1);
      REQUIRE(cl.block_expert == want_blocks);
    }
  });
}

TEST_CASE("cpu layout and rows: errors name the argument", "[cpu][layout]") {
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
  REQUIRE(st.message.find("outside that expert's segment") != std::string::npos);
  // the first bad assignment is named, wherever it is (the walk stops there)
  dv.d.slot[0] = d.slot[0];
  dv.d.expert[21] = 8;    // a 9th expert of 8
  std::size_t held = 39;  // the last assignment that holds a slot
  while (d.expert[held] < 0) --held;
  REQUIRE(held > 21);
  dv.d.slot[held] = -2;
  cpu_layout late(cfg, dv.view(), 20, layout_kind::padded, 1);
  const auto sl = cpu::layout(cfg, late.p);
  INFO(sl.message);
  REQUIRE(sl.code == status_code::invalid_argument);
  REQUIRE(sl.message.find("assignment 21 has expert 8, outside [-1, total_experts)") !=
          std::string::npos);
  dv.d.expert[21] = d.expert[21];
  cpu_layout last(cfg, dv.view(), 20, layout_kind::padded, 1);
  const auto sk = cpu::layout(cfg, last.p);
  INFO(sk.message);
  REQUIRE(sk.message.find("assignment " + std::to_string(held) + " has expert") !=
          std::string::npos);
  REQUIRE(sk.message.find("slot -2, outside that expert's segment") != std::string::npos);
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
