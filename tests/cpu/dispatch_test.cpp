// SPDX-License-Identifier: Apache-2.0
// The CPU backend's dispatch (cpu::dispatch) against reference::dispatch on the reference's
// own gating: fates, experts, slots, counts and totals exactly, weights bit for bit. The
// grids of the CUDA dispatch tests: every priority x drop policy x slot order x capacity mode
// (with capacity groups, padding, NLLB random second choices), a T x E x k shape grid and the
// golden peer cases; plus the errors a bad gating output gets.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <moeroute/cpu/dispatch.hpp>
#include <moeroute/cpu/token_mask.hpp>
#include <moeroute/reference.hpp>

#include "../common/dispatch_cases.hpp"
#include "../common/dispatch_compare.hpp"
#include "../common/golden.hpp"
#include "dispatch_harness.hpp"

namespace moeroute::test {
namespace {

void check_case(std::int64_t T, std::int32_t E, std::int32_t k, const case_spec& s,
                std::uint64_t seed) {
  INFO(describe(s, T, E, k));
  const routing_config cfg = make_config(E, k, s, T);
  const auto gating = make_gating(cfg, T, seed, s.masked);
  const auto want = reference::dispatch(cfg, gating);
  cpu_dispatch c(cfg, gating, s.masked);
  const auto st = c.run(cpu::executor::serial());
  INFO(st.message);
  REQUIRE(st.ok());
  if (T == 0) return;
  require_matches(c.h, want);
  // reruns over the dirty workspace, on OpenMP's threads and with the tasks last to first:
  // the same bits
  const host_dispatch first = c.h;
  REQUIRE(c.run().ok());
  require_bitwise(c.h, first);
  REQUIRE(c.run(cpu::executor{&reverse_order_run, nullptr, 0}).ok());
  require_bitwise(c.h, first);
}

}  // namespace

TEST_CASE("cpu dispatch: every priority x drop policy x slot order x capacity mode",
          "[cpu][dispatch]") {
  struct shape {
    std::int64_t T;
    std::int32_t E, k;
  };
  const shape shapes[] = {{7, 6, 2}, {300, 60, 4}, {300, 8, 8}, {1000, 64, 1}, {96, 60, 2}};
  std::uint64_t seed = 1;
  for (const auto& sh : shapes)
    for (int prio = 0; prio < 5; ++prio)
      for (int drop = 0; drop < static_cast<int>(drop_case::count); ++drop)
        for (int slots = 0; slots < 2; ++slots)
          for (int cap = 0; cap < static_cast<int>(cap_case::count); ++cap)
            for (int groups : {1, 3, 4}) {
              case_spec s;
              s.prio = static_cast<priority>(prio);
              s.drop = static_cast<drop_case>(drop);
              s.slots = static_cast<slot_order>(slots);
              s.cap = static_cast<cap_case>(cap);
              s.masked = (prio + cap + groups) % 3 == 0;
              s.after_drop = (drop + slots) % 2 == 0;
              s.groups = groups;
              s.second_random = (prio + drop + groups) % 3 == 0;
              check_case(sh.T, sh.E, sh.k, s, seed++);
            }
}

TEST_CASE("cpu dispatch: a token count is the dispatch of the first n tokens", "[cpu][dispatch]") {
  std::uint64_t seed = 500;
  for (int prio = 0; prio < 5; ++prio)
    for (int drop = 0; drop < static_cast<int>(drop_case::count); ++drop) {
      case_spec s = rotating_spec(prio, drop);
      s.masked = (prio + drop) % 3 == 0;
      const std::int64_t T = 300;
      for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{151}, T}) {
        INFO(describe(s, T, 60, 4) << ", d_token_count = " << n);
        const routing_config cfg = make_config(60, 4, s, T);
        const auto g = make_gating(cfg, T, seed++, s.masked);
        cpu_dispatch c(cfg, g, s.masked);
        c.params.d_token_count = &n;
        const auto st = c.run();
        INFO(st.message);
        REQUIRE(st.ok());
        require_matches(c.h, padded_to_rows(reference::dispatch(cfg, first_tokens(g, n)), T));
      }
      // outside [0, T]: an error naming it
      const routing_config cfg = make_config(60, 4, s, T);
      const auto g = make_gating(cfg, T, seed++, s.masked);
      cpu_dispatch c(cfg, g, s.masked);
      for (std::int64_t n : {std::int64_t{-1}, T + 1}) {
        c.params.d_token_count = &n;
        const auto st = c.run();
        REQUIRE(st.code == status_code::invalid_argument);
        REQUIRE(st.message.find("d_token_count") != std::string::npos);
      }
    }
}

TEST_CASE("cpu token_mask: the first n rows that valid marks, n outside [0, T] refused",
          "[cpu][dispatch]") {
  const std::int64_t T = 37;
  std::vector<std::uint8_t> valid(T), mask(T, 7);
  for (std::int64_t t = 0; t < T; ++t) valid[t] = t % 3 == 1 ? 0 : 1;
  for (const bool with_valid : {false, true})
    for (const std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{20}, T}) {
      INFO("n = " << n << (with_valid ? ", with valid" : ""));
      const cpu::token_mask_params p{T, &n, with_valid ? valid.data() : nullptr, mask.data()};
      REQUIRE(cpu::token_mask(p).ok());
      for (std::int64_t t = 0; t < T; ++t)
        REQUIRE(mask[t] == (t < n && (!with_valid || valid[t] != 0) ? 1 : 0));
    }
  for (const std::int64_t n : {std::int64_t{-1}, T + 1}) {
    const status st = cpu::token_mask({T, &n, nullptr, mask.data()});
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find("d_count") != std::string::npos);
  }
  const std::int64_t n = 1;
  REQUIRE(cpu::token_mask({T, nullptr, nullptr, mask.data()}).message.find("d_count") !=
          std::string::npos);
  REQUIRE(cpu::token_mask({T, &n, nullptr, nullptr}).message.find("d_mask") != std::string::npos);
  REQUIRE(cpu::token_mask({-1, &n, nullptr, mask.data()}).code == status_code::invalid_shape);
  REQUIRE(cpu::token_mask({0, nullptr, nullptr, nullptr}).ok());  // nothing to mask
}

TEST_CASE("cpu dispatch: shape grid T x E x k", "[cpu][dispatch]") {
  CHECK(for_each_dispatch_shape(check_case) > 100);
}

TEST_CASE(
    "cpu dispatch: the parallel path (token-major, or value priority with token-index "
    "slots) over many tasks",
    "[cpu][dispatch]") {
  // keeps_by_selection's configs at a T that spans several tasks of uneven length, so the
  // per-task counts, the ranks, the pair buckets and the per-expert selections all meet more
  // than one task
  std::uint64_t seed = 500;
  int cases = 0;
  for (const auto& [E, k] : {std::pair{64, 2}, std::pair{8, 4}, std::pair{1, 1}})
    for (priority prio : {priority::token_major, priority::choice_major, priority::score_per_expert,
                          priority::random})
      for (slot_order slots : {slot_order::token_index, slot_order::priority}) {
        // token-major: both slot orders; choice-major: slots in grant order; value keys: by
        // token index
        if (prio == priority::choice_major && slots == slot_order::token_index) continue;
        if (prio != priority::token_major && prio != priority::choice_major &&
            slots == slot_order::priority)
          continue;
        for (drop_case drop : {drop_case::zero_weight, drop_case::residual})
          for (int cap = 0; cap < static_cast<int>(cap_case::count); ++cap)
            for (bool masked : {false, true}) {
              case_spec s;
              s.prio = prio;
              s.drop = drop;
              s.slots = slots;
              s.cap = static_cast<cap_case>(cap);
              s.masked = masked;
              s.after_drop = (cap + (masked ? 1 : 0)) % 2 == 0;
              REQUIRE(cpu::detail::keeps_by_selection(make_config(E, k, s, 5000), 5000));
              check_case(5000, E, k, s, seed++);
              ++cases;
            }
      }
  CHECK(cases == 300);
}

TEST_CASE("cpu dispatch: golden peer cases", "[cpu][dispatch][golden]") {
  const auto cases = load_golden_cases(golden_directory("MOEROUTE_GOLDEN_DIR", "golden"));
  REQUIRE(cases.size() > 100);
  for (const auto& g : cases) {
    INFO(g.file << " " << g.name);
    const auto gat = reference::gating<float>(g.cfg, std::span<const float>(g.logits), g.tokens,
                                              std::span<const float>(g.bias));
    cpu_dispatch c(g.cfg, gat, false);
    const auto st = c.run();
    INFO(st.message);
    REQUIRE(st.ok());
    require_matches(c.h, reference::dispatch(g.cfg, gat));
  }
}

TEST_CASE("cpu dispatch: a bad gating output gets an error naming the element", "[cpu][dispatch]") {
  case_spec s;
  const routing_config cfg = make_config(8, 2, s, 16);
  auto gating = make_gating(cfg, 16, 5, false);
  {
    cpu_dispatch c(cfg, gating, false);
    REQUIRE(c.run().ok());
    REQUIRE(cpu::dispatch(cfg, c.params, c.ws.data(), c.ws.size() - 1).code ==
            status_code::workspace_too_small);
    auto p = c.params;
    p.out.d_load = nullptr;
    const auto st = cpu::dispatch(cfg, p, c.ws.data(), c.ws.size());
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find("out.d_load") != std::string::npos);
  }
  gating.ids[5] = 8;
  {
    cpu_dispatch c(cfg, gating, false);
    const auto st = c.run();
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find("gated.d_ids[5]") != std::string::npos);
  }
  gating.ids[5] = 1;
  gating.gates[3] = std::numeric_limits<float>::infinity();
  cpu_dispatch c(cfg, gating, false);
  const auto st = c.run();
  REQUIRE(st.code == status_code::invalid_argument);
  REQUIRE(st.message.find("gated.d_gates[3]") != std::string::npos);
}

TEST_CASE("cpu dispatch: only the keyed priorities carve the sort's keys", "[cpu][dispatch]") {
  // the counting path (reroutes: no selection) under each priority; token- and choice-major
  // order by counting passes alone, so their workspace lacks the two key arrays of n uint32
  // and the radix histograms (the grids above run each priority on exactly the queried bytes)
  const std::int64_t T = 1000;
  const std::int32_t E = 16, k = 2;
  const std::size_t n = static_cast<std::size_t>(T * k);
  const auto bytes = [&](priority prio) {
    case_spec s;
    s.prio = prio;
    s.drop = drop_case::next_choice;
    const routing_config cfg = make_config(E, k, s, T);
    REQUIRE_FALSE(cpu::detail::keeps_by_selection(cfg, T));
    return cpu::dispatch_workspace_bytes(cfg, T);
  };
  const std::size_t unkeyed = bytes(priority::token_major);
  CHECK(bytes(priority::choice_major) == unkeyed);
  // the keys, and the radix histograms beyond the E int64 counts every priority takes
  const auto radix_cells =
      static_cast<std::size_t>(cpu::detail::radix_passes * (cpu::detail::radix_digits + 1) - E);
  for (const priority keyed :
       {priority::score_per_expert, priority::random, priority::batch_prioritized})
    CHECK(bytes(keyed) >=
          unkeyed + 2 * n * sizeof(std::uint32_t) + radix_cells * sizeof(std::int64_t));
}

TEST_CASE("cpu dispatch: bad input on the selection path is named, and nothing is written",
          "[cpu][dispatch]") {
  case_spec s;
  s.prio = priority::score_per_expert;
  s.slots = slot_order::token_index;
  const std::int64_t T = 3000;  // three tasks: the bad values sit in the last one
  const routing_config cfg = make_config(16, 2, s, T);
  REQUIRE(cpu::detail::keeps_by_selection(cfg, T));
  const auto good = make_gating(cfg, T, 9, false);
  const auto expect_error = [&](const reference::gating_output& g, const std::string& field) {
    cpu_dispatch c(cfg, g, false);
    const auto st = c.run();
    INFO(st.message);
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find(field) != std::string::npos);
    CHECK(c.h.expert == std::vector<std::int32_t>(g.ids.size(), 99));  // untouched
    CHECK(c.h.requested == std::vector<std::int64_t>(16, -1));
  };
  auto g = good;
  g.ids[2 * 2900 + 1] = 16;
  expect_error(g, "gated.d_ids[5801]");
  g = good;
  g.ids[2 * 2900 + 1] = g.ids[2 * 2900];
  expect_error(g, "gated.d_ids[5801]");  // the token names that expert twice
  g = good;
  g.gates[2 * 2950] = std::numeric_limits<float>::quiet_NaN();
  expect_error(g, "gated.d_gates[5900]");
  cpu_dispatch c(cfg, good, false);
  REQUIRE(c.run().ok());
}

}  // namespace moeroute::test
