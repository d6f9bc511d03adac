// SPDX-License-Identifier: Apache-2.0
// How many rows an expert buffer needs: the bounds of the padded and compact layouts, which
// every backend's layout stage checks its max_rows against and callers size buffers with.
// Pure C++, so a .cpp file can size buffers before it touches any backend.
#pragma once

#include <cstdint>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// @brief Rows a padded layout can need for `tokens` tokens: E * C * Q for Q capacity groups
///        (+ the dedicated fallback segment). With capacity_mode::max_load, C is bounded by
///        expert_capacity(cfg, T, G) (an expert receives at most the G tokens of a group); an
///        unbounded dedicated fallback holds at most T rows. Returns -1 for
///        capacity_mode::unbounded (padded needs a bound).
[[nodiscard]] inline std::int64_t padded_max_rows(const routing_config& cfg, std::int64_t tokens) {
  if (cfg.capacity.mode == capacity_mode::unbounded) return -1;
  const std::int64_t C = expert_capacity(cfg, tokens, cfg.capacity_group_tokens(tokens));
  std::int64_t rows = std::int64_t{cfg.num_experts} * expert_slots(cfg, tokens, C);
  if (cfg.has_dedicated_fallback()) {
    const std::int64_t fb = cfg.dispatch.fallback.capacity;
    rows += fb < 0 ? tokens : expert_slots(cfg, tokens, fb);
  }
  return rows;
}

/// @brief Rows a compact layout with segments aligned to `block_size` can need:
///        T * k + total_experts * (block_size - 1) (every slot is held by one assignment).
[[nodiscard]] inline std::int64_t compact_max_rows(const routing_config& cfg, std::int64_t tokens,
                                                   std::int64_t block_size) {
  return tokens * cfg.top_k + std::int64_t{cfg.total_experts()} * (block_size - 1);
}

/// @brief The rows a layout of `kind` needs for this config and batch: the size of the
///        caller's row_token and expert buffers (-1: padded with an unbounded capacity).
[[nodiscard]] inline std::int64_t layout_max_rows(const routing_config& cfg, std::int64_t tokens,
                                                  layout_kind kind, std::int64_t block_size = 1) {
  return kind == layout_kind::padded ? padded_max_rows(cfg, tokens)
                                     : compact_max_rows(cfg, tokens, block_size);
}

}  // namespace moeroute
