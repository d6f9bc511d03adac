// SPDX-License-Identifier: Apache-2.0
// The case grid the CPU backend's stages after dispatch are checked on (layout, permute,
// combine and their backward passes, one test file each): every priority x drop policy on
// three shapes, each routed by the reference, laid out padded, compact and compact in 16-row
// blocks by the reference and by cpu::layout; row widths that take the row kernels' 64-, 16-
// column and scalar steps; float, bf16 and (at one width) fp16 rows.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <moeroute/cpu/layout.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/reference.hpp>

#include "../common/dispatch_cases.hpp"
#include "layout_harness.hpp"

namespace moeroute::test {

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

/// One case of the grid: the reference's dispatch and layout, and cpu::layout's of the same
/// dispatch (checked by layout_test.cpp; the row tests read it as the CPU stages would).
struct row_case {
  const routing_config& cfg;
  const reference::dispatch_output& d;
  const dispatch_view& dv;
  const reference::layout_output& L;
  const cpu_layout& cl;
  std::uint64_t seed;
};

/// Calls check(row_case) for every case of the grid (the layout computed by cpu::layout).
template <class Check>
void for_each_row_case(Check&& check) {
  struct shape {
    std::int64_t T;
    std::int32_t E, k;
  };
  std::uint64_t seed = 7;
  for (const shape sh : {shape{7, 6, 2}, shape{96, 60, 4}, shape{300, 8, 8}})
    for (int prio = 0; prio < 5; ++prio)
      for (int drop = 0; drop < static_cast<int>(drop_case::count); ++drop) {
        case_spec s = rotating_spec(prio, drop);
        s.masked = drop % 2 == 1;
        s.groups = (prio + drop) % 3 == 0 ? 3 : 1;
        s.after_drop = prio % 2 == 0;
        INFO(describe(s, sh.T, sh.E, sh.k));
        const routing_config cfg = make_config(sh.E, sh.k, s, sh.T);
        const auto gating = make_gating(cfg, sh.T, seed, s.masked);
        const auto d = reference::dispatch(cfg, gating);
        const dispatch_view dv{d, d.totals()};
        for (const auto& [kind, block] : {std::pair{layout_kind::padded, std::int64_t{1}},
                                          std::pair{layout_kind::compact, std::int64_t{1}},
                                          std::pair{layout_kind::compact, std::int64_t{16}}}) {
          if (kind == layout_kind::padded && cfg.capacity.mode == capacity_mode::unbounded)
            continue;
          INFO((kind == layout_kind::padded ? "padded" : "compact") << " block " << block);
          const auto L = reference::layout(cfg, d, kind, block);
          cpu_layout cl(cfg, dv.view(), sh.T, kind, block);
          const auto st = cpu::layout(cfg, cl.p);
          INFO(st.message);
          REQUIRE(st.ok());
          check(row_case{cfg, d, dv, L, cl, seed});
        }
        ++seed;
      }
}

/// Calls check.template operator()<H>(hidden) for the grid's widths and element types:
/// 552 = 8 x 64 + 2 x 16 + 8 (the row kernels' 64-, 16-column and scalar steps in one row).
template <class Check>
void for_each_row_width(Check&& check) {
  for (const std::int64_t hidden : {std::int64_t{1}, std::int64_t{40}, std::int64_t{552}}) {
    check.template operator()<float>(hidden);
    check.template operator()<bf16_bits>(hidden);
    if (hidden == 40) check.template operator()<half_bits>(hidden);
  }
}

}  // namespace moeroute::test
