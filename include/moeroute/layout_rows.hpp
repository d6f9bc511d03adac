// SPDX-License-Identifier: Apache-2.0
// How many rows an expert buffer needs: the bounds of the padded and compact layouts, which
// every backend's layout stage checks its max_rows against and callers size buffers with.
// Pure C++, so a .cpp file can size buffers before it touches any backend.
#pragma once

#include <algorithm>
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

/// @brief The most rows `segments` segments can take when each is rounded up to a multiple of
///        `block_size`, they hold at most `assignments` rows in all and each at most
///        `per_segment` (>= 1). Exact: a segment's first block costs one row, every further
///        block `block_size`, so the worst case opens min(segments, assignments) segments and
///        spends the rest on whole blocks, at most ceil(per_segment / block_size) per segment.
///        (vLLM's sizing, assignments + segments * (block_size - 1), or assignments *
///        block_size when assignments < segments, is never smaller.)
[[nodiscard]] inline std::int64_t aligned_rows_bound(std::int64_t assignments,
                                                     std::int64_t segments,
                                                     std::int64_t per_segment,
                                                     std::int64_t block_size) {
  if (assignments <= 0 || segments <= 0 || per_segment <= 0 || block_size <= 0) return 0;
  const std::int64_t open = std::min(segments, assignments);
  const std::int64_t further_per_segment = (per_segment + block_size - 1) / block_size - 1;
  const std::int64_t further =
      std::min((assignments - open) / block_size, open * further_per_segment);
  return block_size * (open + further);
}

/// @brief Rows a compact layout with segments aligned to `block_size` can need for `tokens`
///        tokens: aligned_rows_bound over the total_experts segments, with T * k assignments
///        holding a slot at most (a shared reroute slot holds one) and at most T rows per expert
///        (a token holds one row of an expert). Exact for dropless routing: tests/reference/
///        layout_bound_test.cpp builds a routing that needs every row.
[[nodiscard]] inline std::int64_t compact_max_rows(const routing_config& cfg, std::int64_t tokens,
                                                   std::int64_t block_size) {
  return aligned_rows_bound(tokens * cfg.top_k, cfg.total_experts(), tokens, block_size);
}

/// @brief Rows the compact layout of `local_experts` of the experts (a local-expert view,
///        layout_params::d_expert_map) can need: aligned_rows_bound over those segments.
[[nodiscard]] inline std::int64_t local_compact_max_rows(const routing_config& cfg,
                                                         std::int64_t tokens,
                                                         std::int64_t block_size,
                                                         std::int32_t local_experts) {
  return aligned_rows_bound(tokens * cfg.top_k, local_experts, tokens, block_size);
}

/// @brief The rows a layout of `kind` needs for this config and batch: the size of the
///        caller's row_token and expert buffers (-1: padded with an unbounded capacity).
[[nodiscard]] inline std::int64_t layout_max_rows(const routing_config& cfg, std::int64_t tokens,
                                                  layout_kind kind, std::int64_t block_size = 1) {
  return kind == layout_kind::padded ? padded_max_rows(cfg, tokens)
                                     : compact_max_rows(cfg, tokens, block_size);
}

}  // namespace moeroute
