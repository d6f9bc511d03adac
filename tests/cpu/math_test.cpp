// SPDX-License-Identifier: Apache-2.0
// The CPU backend's building blocks against plain definitions: math::exp within its documented
// bound (2 ulp) and monotonic over every 61st float of [-104, 89]; the selection (top_n, with
// and without a mask, every n up to 16 and the index-sort path) equal to a stable sort by
// (value desc, index asc) on rows full of ties, -inf, -FLT_MAX and +-FLT_MAX.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <moeroute/cpu/math.hpp>
#include <moeroute/cpu/select.hpp>

using namespace moeroute::cpu;

TEST_CASE("cpu math::exp is within 2 ulp of exp and monotonic", "[cpu][math]") {
  double worst = 0.0;
  float worst_at = 0.0f, prev = 0.0f;
  std::int64_t checked = 0;
  for (std::uint32_t u = std::bit_cast<std::uint32_t>(-104.0f); u >= 0x80000000u; u -= 61) {
    const float y = std::bit_cast<float>(u);  // -104 .. -0, toward zero
    const float got = math::exp(y);
    const double want = std::exp(static_cast<double>(y));
    const double ulp = std::ldexp(1.0, std::max(std::ilogb(static_cast<float>(want)), -126) - 23);
    const double err = std::fabs(got - want) / ulp;
    if (err > worst) {
      worst = err;
      worst_at = y;
    }
    if (got < prev) FAIL("not monotonic at " << y);
    prev = got;
    ++checked;
  }
  for (std::uint32_t u = 0; std::bit_cast<float>(u) <= 89.0f; u += 61) {
    const float y = std::bit_cast<float>(u);
    const float got = math::exp(y);
    const double want = std::exp(static_cast<double>(y));
    if (want > FLT_MAX) {
      REQUIRE(std::isinf(got));
      continue;
    }
    const double ulp = std::ldexp(1.0, std::max(std::ilogb(static_cast<float>(want)), -126) - 23);
    const double err = std::fabs(got - want) / ulp;
    if (err > worst) {
      worst = err;
      worst_at = y;
    }
    if (got < prev) FAIL("not monotonic at " << y);
    prev = got;
    ++checked;
  }
  INFO("worst " << worst << " ulp at " << worst_at << " over " << checked << " arguments");
  CHECK(checked > 30000000);
  REQUIRE(worst <= 2.0);
  REQUIRE(math::exp(-200.0f) == 0.0f);
  REQUIRE(math::exp(0.0f) == 1.0f);
}

namespace {
/// The n best of v (allowed only), larger value first, ties to the lower index.
std::vector<std::int32_t> plain_top(const std::vector<float>& v, const std::uint8_t* allowed,
                                    std::int32_t n) {
  std::vector<std::int32_t> idx;
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(v.size()); ++i)
    if (allowed == nullptr || allowed[i]) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](std::int32_t a, std::int32_t b) { return v[a] > v[b]; });
  idx.resize(static_cast<std::size_t>(n));
  return idx;
}
}  // namespace

TEST_CASE("cpu selection equals a stable sort, ties and infinities included", "[cpu][math]") {
  std::mt19937 rng(5);
  const float specials[] = {
      -std::numeric_limits<float>::infinity(), -FLT_MAX, FLT_MAX, 0.0f, -0.0f, 1.0f, 1.0f, 0.5f};
  std::int64_t cases = 0;
  std::vector<std::int32_t> sizes(70);
  std::iota(sizes.begin(), sizes.end(), 1);
  sizes.insert(sizes.end(), {127, 256, 300});  // many key vectors, both chains, a tail
  for (const std::int32_t size : sizes)
    for (int rep = 0; rep < 12; ++rep) {
      std::vector<float> v(static_cast<std::size_t>(size));
      for (auto& x : v)
        x = rng() % 3 == 0 ? specials[rng() % 8] : static_cast<float>(rng() % 7) * 0.25f;
      std::vector<std::uint8_t> allowed(v.size());
      for (auto& a : allowed) a = rng() % 4 != 0;
      const std::int32_t allowed_count =
          static_cast<std::int32_t>(std::count(allowed.begin(), allowed.end(), 1));
      std::vector<float> vals(static_cast<std::size_t>(size));
      std::vector<std::int32_t> ids(static_cast<std::size_t>(size));
      std::vector<std::int64_t> keys(static_cast<std::size_t>(detail::key_capacity(size)));
      for (std::int32_t n = 1; n <= std::min(size, 20); ++n) {
        INFO("size " << size << " n " << n << " rep " << rep);
        detail::top_n(v.data(), size, nullptr, n, vals.data(), ids.data(), keys.data());
        REQUIRE(std::vector<std::int32_t>(ids.begin(), ids.begin() + n) ==
                plain_top(v, nullptr, n));
        for (std::int32_t j = 0; j < n; ++j)  // the values themselves, -0 stays -0
          REQUIRE(std::memcmp(&vals[j], &v[ids[j]], sizeof(float)) == 0);
        if (n <= allowed_count) {
          detail::top_n(v.data(), size, allowed.data(), n, nullptr, ids.data(), keys.data());
          REQUIRE(std::vector<std::int32_t>(ids.begin(), ids.begin() + n) ==
                  plain_top(v, allowed.data(), n));
        }
        ++cases;
      }
    }
  CHECK(cases > 10000);
}
