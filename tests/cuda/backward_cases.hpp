// SPDX-License-Identifier: Apache-2.0
// Inputs shared by the backward GPU tests (backward_test.cu, backward_grid_test.cu): random
// logits and upstream gradients.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace moeroute::test {

inline std::vector<float> random_logits(std::int64_t T, std::int32_t E, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.5f);
  std::vector<float> x(T * E);
  for (auto& v : x) v = n(rng);
  return x;
}

inline std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace moeroute::test
