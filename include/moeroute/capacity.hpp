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

/// @brief x rounded to an integer by `r` (nearest_even: ties to the even integer, as Python's
///        round()), clamped to [0, 4e18] so the conversion is always defined (NaN becomes 0;
///        only inputs validate() rejects reach the clamp).
MOEROUTE_HOST_DEVICE inline std::int64_t round_capacity(double x, capacity_rounding r) {
  if (!(x >= 0.0)) x = 0.0;
  if (x > 4.0e18) x = 4.0e18;
  const double fl = std::floor(x);
  switch (r) {
    case capacity_rounding::floor:
      return static_cast<std::int64_t>(fl);
    case capacity_rounding::nearest_even: {
      const double frac = x - fl;  // exact: x and fl are within one binade
      const auto i = static_cast<std::int64_t>(fl);
      if (frac > 0.5) return i + 1;
      if (frac < 0.5) return i;
      return i % 2 == 0 ? i : i + 1;
    }
    case capacity_rounding::ceil:
      break;
  }
  return static_cast<std::int64_t>(std::ceil(x));
}

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
  return round_capacity(per_expert * factor,
                        round_up ? capacity_rounding::ceil : capacity_rounding::floor);
}

/// @brief The factor rule of capacity_config (its comment has the formula) for `tokens` tokens
///        in one capacity group, before the minimum and the clamp to T.
MOEROUTE_HOST_DEVICE inline std::int64_t capacity_from_rule(const capacity_config& cap,
                                                            std::int64_t tokens,
                                                            std::int32_t experts, std::int32_t k,
                                                            double factor) {
  if (cap.mode == capacity_mode::batch_fraction)
    return round_capacity(factor * static_cast<double>(tokens), cap.rounding);
  const bool k_inside = cap.includes_k && !cap.k_after_rounding;
  const double k_in = k_inside ? static_cast<double>(k) : 1.0;
  std::int64_t C = 0;
  if (cap.share == share_rounding::none) {
    // T * k / E first, then the factor: the order of DeepSpeed and Megatron
    C = round_capacity(static_cast<double>(tokens) * k_in / static_cast<double>(experts) * factor,
                       cap.rounding);
  } else {
    // an integer share, ceil or floor of T / E, computed exactly
    const std::int64_t share =
        cap.share == share_rounding::ceil ? (tokens + experts - 1) / experts : tokens / experts;
    C = round_capacity(factor * static_cast<double>(share) * k_in, cap.rounding);
  }
  if (cap.includes_k && cap.k_after_rounding) {
    const std::int64_t limit = std::int64_t{4000000000000000000} / k;
    C = C > limit ? limit * k : C * k;
  }
  return C;
}

/// @brief expert_capacity's rule without its checks, on the host or a device: C of a capacity
///        group of `group` tokens (0: an empty batch) of E experts, top-k, at capacity factor
///        `factor`, given the largest request of any (group, expert) for capacity_mode::max_load.
MOEROUTE_HOST_DEVICE inline std::int64_t group_capacity(const capacity_config& cap,
                                                        std::int64_t group, std::int32_t experts,
                                                        std::int32_t k, double factor,
                                                        std::int64_t max_load) {
  std::int64_t C = 0;
  switch (cap.mode) {
    case capacity_mode::unbounded:
      return unbounded_capacity;
    case capacity_mode::max_load:
      C = max_load > cap.min_capacity ? max_load : cap.min_capacity;
      break;
    case capacity_mode::fixed:
      C = cap.fixed;
      break;
    case capacity_mode::factor:
    case capacity_mode::batch_fraction:
      C = capacity_from_rule(cap, group, experts, k, factor);
      if (C < cap.min_capacity) C = cap.min_capacity;
      break;
  }
  if (cap.clamp_to_tokens && C > group) C = group;
  return C > 0 ? C : 0;
}

/// @brief Capacity of each routed expert in each capacity group (capacity.group_tokens) for a
///        batch of `tokens` tokens: the whole batch is one group unless group_tokens is set.
/// @param max_load the largest number of assignments any expert received before dropping in
///        any one group; used only by capacity_mode::max_load (pass anything otherwise).
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
  const std::int64_t group = tokens == 0 ? 0 : c.capacity_group_tokens(tokens);
  return group_capacity(c.capacity, group, c.num_experts, c.top_k, c.active_capacity_factor(),
                        max_load);
}

/// @brief Most slots a routed expert can fill over the whole batch: C times the capacity
///        groups (the padded layout's segment); unbounded_capacity when C is.
[[nodiscard]] inline std::int64_t expert_slots(const routing_config& c, std::int64_t tokens,
                                               std::int64_t capacity) noexcept {
  if (capacity < 0) return unbounded_capacity;
  return capacity * c.capacity_groups(tokens);
}

/// @brief True when this config needs the pre-drop loads to know its capacity.
[[nodiscard]] inline bool capacity_needs_loads(const routing_config& c) noexcept {
  return c.capacity.mode == capacity_mode::max_load;
}

}  // namespace moeroute
