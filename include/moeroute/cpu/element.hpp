// SPDX-License-Identifier: Apache-2.0
// CPU backend: the element types its row and gating kernels read. Its own header so the row
// operations (permute, combine and their backward passes) need not include gating.
#pragma once

#include <type_traits>

#include <moeroute/dtype.hpp>

namespace moeroute::cpu {

/// The element types the CPU backend reads: float, half_bits and bf16_bits.
template <class Element>
inline constexpr bool is_element_v =
    std::is_same_v<Element, float> || std::is_same_v<Element, half_bits> ||
    std::is_same_v<Element, bf16_bits>;

}  // namespace moeroute::cpu
