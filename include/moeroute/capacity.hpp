// SPDX-License-Identifier: Apache-2.0
// Expert capacity: how many slots each routed expert has for a batch of T tokens.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/macros.hpp>

namespace moeroute {

/// Capacity value meaning "no bound" (capacity_mode::unbounded).
inline constexpr std::int64_t unbounded_capacity = -1;

/// @brief Capacity from the factor rule, before min/clamp: round(T * k / E * factor) in double.
/// @note Peers evaluate the product in slightly different orders (DeepSpeed (T/E)*(f*k),
///       Megatron (T*k/E)*f, seed_reference f*T/E); all agree whenever the exact value is not
///       within one double ulp of an integer. See docs/numerics.md.
MOEROUTE_HOST_DEVICE inline std::int64_t capacity_from_factor(std::int64_t tokens,
                                                              std::int32_t experts, std::int32_t k,
                                                              bool includes_k, double factor,
                                                              bool round_up) {
  const double per_expert = static_cast<double>(tokens) * static_cast<double>(includes_k ? k : 1) /
                            static_cast<double>(experts);
  double raw = per_expert * factor;
  // Out-of-range values (only reachable with inputs validate() rejects) are clamped, so the
  // conversion below is always defined; NaN becomes 0.
  if (!(raw >= 0.0)) raw = 0.0;
  if (raw > 4.0e18) raw = 4.0e18;
  return static_cast<std::int64_t>(round_up ? std::ceil(raw) : std::floor(raw));
}

/// @brief Capacity of each routed expert for a batch of `tokens` tokens.
/// @param max_load the largest number of assignments any expert received before dropping;
///        used only by capacity_mode::max_load (pass anything otherwise).
/// @return C >= 0, or unbounded_capacity for capacity_mode::unbounded. Throws moeroute::error
///         for a config validate() rejects, tokens outside [0, max_tokens] or max_load < 0.
/// @note `no_drop_when_exceeds_tokens` needs no special case: an expert receives at most T
///       assignments (a token picks an expert once), so C > T never drops a routed assignment.
[[nodiscard]] inline std::int64_t expert_capacity(const routing_config& c, std::int64_t tokens,
                                                  std::int64_t max_load = 0) {
  throw_if_error(validate(c));
  if (tokens < 0 || tokens > max_tokens)
    throw error(
        status::make(status_code::invalid_shape,
                     detail::field_msg("tokens", tokens, "must be in [0, moeroute::max_tokens]")));
  if (max_load < 0 || max_load > max_tokens)
    throw error(status::make(
        status_code::invalid_argument,
        detail::field_msg("max_load", max_load, "must be in [0, moeroute::max_tokens]")));
  const auto& cap = c.capacity;
  std::int64_t C = 0;
  switch (cap.mode) {
    case capacity_mode::unbounded:
      return unbounded_capacity;
    case capacity_mode::max_load:
      C = max_load;
      break;
    case capacity_mode::fixed:
      C = cap.fixed;
      break;
    case capacity_mode::factor:
      C = capacity_from_factor(tokens, c.num_experts, c.top_k, cap.includes_k,
                               c.active_capacity_factor(), cap.rounding == capacity_rounding::ceil);
      break;
  }
  C = std::max(C, cap.min_capacity);
  if (cap.clamp_to_tokens) C = std::min(C, tokens);
  return std::max<std::int64_t>(C, 0);
}

/// @brief True when this config needs the pre-drop loads to know its capacity.
[[nodiscard]] inline bool capacity_needs_loads(const routing_config& c) noexcept {
  return c.capacity.mode == capacity_mode::max_load;
}

}  // namespace moeroute
