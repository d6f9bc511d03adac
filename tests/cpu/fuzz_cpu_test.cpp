// SPDX-License-Identifier: Apache-2.0
// The differential fuzz harness in the normal test run: every kept fuzz_route input (same
// decoder) and a fixed-seed sweep of random inputs, through cpu_check.hpp — the CPU backend
// against the reference on each.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#define MOEROUTE_FUZZ_FAIL(what) throw std::logic_error(std::string("cpu vs reference: ") + (what))
#include "../fuzz/cpu_check.hpp"

namespace fs = std::filesystem;

TEST_CASE("cpu fuzz corpus: every kept input, cpu backend == reference", "[cpu][fuzz]") {
  const fs::path dir = fs::path(MOEROUTE_TEST_DATA_DIR) / ".." / "fuzz" / "corpus" / "fuzz_route";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "README.md") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 4);
  const auto before = moeroute::fuzz::cpu_reached();
  for (const auto& p : files) {
    INFO(p.string());
    std::ifstream f(p, std::ios::binary);
    const std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(f),
                                          std::istreambuf_iterator<char>()};
    REQUIRE_NOTHROW(moeroute::fuzz::cpu_one(bytes.data(), bytes.size()));
  }
  CHECK(moeroute::fuzz::cpu_reached().compared > before.compared);
  // noisy_near_tie (found by fuzz_cpu): off-grid noisy softmax scores, two ids one ulp apart
  CHECK(moeroute::fuzz::cpu_reached().near_ties > before.near_ties);
}

TEST_CASE("cpu fuzz sweep: fixed-seed random inputs, cpu backend == reference", "[cpu][fuzz]") {
  std::mt19937_64 rng(20261203);
  const auto before = moeroute::fuzz::cpu_reached();
  for (int i = 0; i < 1500; ++i) {
    std::vector<std::uint8_t> bytes(rng() % 1536);
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    INFO("input " << i);
    REQUIRE_NOTHROW(moeroute::fuzz::cpu_one(bytes.data(), bytes.size()));
  }
  const auto& after = moeroute::fuzz::cpu_reached();
  CHECK(after.compared - before.compared > 1000);
  CHECK(after.with_drops - before.with_drops > 100);
  CHECK(after.with_reroutes - before.with_reroutes > 30);
}
