// SPDX-License-Identifier: Apache-2.0
// The comparator networks the column selections share (select_columns.hpp on AVX-512's 64-bit
// keys, token_columns.hpp on 32-bit keys): each lane of the vectors is one row, sorted or
// merged by its own copy of the network, no reduction across lanes. `order(a, b)` is one
// comparator: the better of a and b to a, the other to b.
#pragma once

#include <cstdint>

namespace moeroute::cpu::detail {

/// Sorts 8 vectors lane-wise, best first: Knuth's 19-comparator network of depth 6
/// (tests/cpu/math_test.cpp and gating_columns_test.cpp check the selections it makes).
template <class V, class Order>
[[gnu::always_inline]] inline void sort8_network(V* v, Order order) noexcept {
  order(v[0], v[2]), order(v[1], v[3]), order(v[4], v[6]), order(v[5], v[7]);
  order(v[0], v[4]), order(v[1], v[5]), order(v[2], v[6]), order(v[3], v[7]);
  order(v[0], v[1]), order(v[2], v[3]), order(v[4], v[5]), order(v[6], v[7]);
  order(v[2], v[4]), order(v[3], v[5]);
  order(v[1], v[4]), order(v[3], v[6]);
  order(v[1], v[2]), order(v[3], v[4]), order(v[5], v[6]);
}

/// Sorts a bitonic sequence of 8 vectors lane-wise, best first: the half-cleaner cascade (the
/// second half of a merge of two sorted 8s, whose lane-wise better of acc[i] and g[7 - i] are
/// the 8 best, in a bitonic order).
template <class V, class Order>
[[gnu::always_inline]] inline void bitonic_clean8(V* v, Order order) noexcept {
  for (std::int32_t s = 4; s >= 1; s /= 2)
    for (std::int32_t i = 0; i < 8; ++i)
      if ((i & s) == 0) order(v[i], v[i + s]);
}

}  // namespace moeroute::cpu::detail
