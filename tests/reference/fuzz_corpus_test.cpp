// SPDX-License-Identifier: Apache-2.0
// The routing fuzz harness in the normal test run: every seed and regression input kept in
// tests/fuzz/corpus/fuzz_route/ (and any crash in tests/fuzz/crashes/), plus a fixed-seed sweep
// of random inputs, through the same invariant checks libFuzzer uses (route_check.hpp). Built
// with the default compiler, so the sanitizer stage replays the corpus under g++'s ASan too.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#define MOEROUTE_FUZZ_FAIL(what)                                                    \
  throw std::logic_error(std::string("invariant violated: ") + (what) + " (line " + \
                         std::to_string(__LINE__) + ")")
#include "../fuzz/route_check.hpp"

namespace fs = std::filesystem;

namespace {
std::vector<fs::path> inputs_in(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string().rfind(prefix, 0) == 0 &&
        e.path().filename() != "README.md")
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}
std::vector<std::uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST_CASE("fuzz corpus: every kept route input passes every invariant", "[fuzz][reliability]") {
  const fs::path fuzz_dir = fs::path(MOEROUTE_TEST_DATA_DIR) / ".." / "fuzz";
  auto files = inputs_in(fuzz_dir / "corpus" / "fuzz_route", "");
  const auto crashes = inputs_in(fuzz_dir / "crashes", "fuzz_route");
  files.insert(files.end(), crashes.begin(), crashes.end());
  REQUIRE(files.size() >= 4);  // the committed seeds
  const auto before = moeroute::fuzz::reach();
  for (const auto& p : files) {
    INFO(p.string());
    const auto bytes = read_bytes(p);
    CHECK_NOTHROW(moeroute::fuzz::route_one(bytes.data(), bytes.size()));
  }
  // the seeds are chosen to reach routing, drops and reroutes, not only validate()
  const auto& after = moeroute::fuzz::reach();
  CHECK(after.routed > before.routed);
  CHECK(after.with_drops > before.with_drops);
  CHECK(after.with_reroutes > before.with_reroutes);
}

TEST_CASE("fuzz sweep: fixed-seed random inputs pass every invariant", "[fuzz][reliability]") {
  std::mt19937_64 rng(20261202);
  const auto before = moeroute::fuzz::reach();
  for (int i = 0; i < 1500; ++i) {
    std::vector<std::uint8_t> bytes(rng() % 1536);
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    INFO("input " << i);
    REQUIRE_NOTHROW(moeroute::fuzz::route_one(bytes.data(), bytes.size()));
  }
  const auto& after = moeroute::fuzz::reach();
  CHECK(after.inputs - before.inputs == 1500);
  CHECK(after.routed - before.routed > 1000);        // most inputs reach routing
  CHECK(after.bad_config - before.bad_config > 50);  // and validate() sees wild configs
  CHECK(after.with_drops - before.with_drops > 100);
  CHECK(after.with_reroutes - before.with_reroutes > 30);
}
