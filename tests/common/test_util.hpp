// SPDX-License-Identifier: Apache-2.0
// Test helpers shared by every test binary: the error-checking helper of the hostile-input
// tests and deterministic generators of router logits.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <moeroute/reference.hpp>
#include <random>
#include <string>
#include <vector>

namespace moeroute::test {

/// Runs fn, which must throw moeroute::error with `code` and a message containing every word.
inline void expect_error(const std::function<void()>& fn, status_code code,
                         std::initializer_list<const char*> words) {
  bool threw = false;
  try {
    fn();
  } catch (const error& e) {
    threw = true;
    INFO(e.what());
    CHECK(e.get_status().code == code);
    for (const char* w : words) CHECK_THAT(e.get_status().message, Catch::Matchers::Contains(w));
  }
  CHECK(threw);
}

/// Batch shapes the generators produce.
enum class dist { normal, skewed, collapsed, ties, identical_tokens, all_equal, negative };

inline const char* name(dist d) {
  switch (d) {
    case dist::normal:
      return "normal";
    case dist::skewed:
      return "skewed";
    case dist::collapsed:
      return "collapsed";
    case dist::ties:
      return "ties";
    case dist::identical_tokens:
      return "identical_tokens";
    case dist::all_equal:
      return "all_equal";
    case dist::negative:
      return "negative";
  }
  return "?";
}

inline constexpr dist all_dists[] = {dist::normal,  dist::skewed,           dist::collapsed,
                                     dist::ties,    dist::identical_tokens, dist::all_equal,
                                     dist::negative};

/// [T, E] logits from a fixed seed (std::mt19937, so the same on every platform).
inline std::vector<float> make_logits(std::int64_t T, std::int32_t E, dist d, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-2, 2);
  std::vector<float> x(static_cast<std::size_t>(T * E));
  std::vector<float> row(E);
  for (std::int32_t e = 0; e < E; ++e) row[e] = normal(rng);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int32_t e = 0; e < E; ++e) {
      float& v = x[t * E + e];
      switch (d) {
        case dist::normal:
          v = normal(rng);
          break;
        case dist::skewed:
          v = normal(rng) + 2.0f * static_cast<float>(E - e) / static_cast<float>(E);
          break;
        case dist::collapsed:
          v = normal(rng) * 0.1f + (e == 1 ? 4.0f : 0.0f);
          break;
        case dist::ties:
          v = static_cast<float>(small(rng));
          break;
        case dist::identical_tokens:
          v = row[e];
          break;
        case dist::all_equal:
          v = 0.5f;
          break;
        case dist::negative:
          v = -50.0f - std::fabs(normal(rng)) * 10.0f;
          break;
      }
    }
  return x;
}

}  // namespace moeroute::test
