// SPDX-License-Identifier: Apache-2.0
// Pure C++ queries of the CUDA dispatch and layout launchers: the workspace size of
// cuda::dispatch, and (from layout_rows.hpp) the row bounds of both layouts. Includes no CUDA
// header, so a .cpp file can size buffers before it ever touches the GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/dispatch_plan.hpp>
#include <moeroute/layout_rows.hpp>
#include <moeroute/types.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cuda {

/// @brief The counting grant's tiles for (cfg, T): token- and choice-major priorities (the
///        order inside an expert is the assignment order, so ranks come from counts) with at
///        most count_grant_max_experts experts; tiles = 0 for the others (the key sort).
[[nodiscard]] inline dispatch_tiling dispatch_tiles(const routing_config& cfg,
                                                    std::int64_t tokens) noexcept {
  const priority p = cfg.dispatch.prio;
  return moeroute::dispatch_tiles(p == priority::token_major || p == priority::choice_major,
                                  p == priority::choice_major, tokens, cfg.top_k, cfg.num_experts,
                                  cfg.capacity_groups(tokens));
}

/// @brief Workspace bytes cuda::dispatch needs for `tokens` tokens under `cfg`. Pure C++.
/// @return 0 for tokens <= 0 (a T = 0 call touches nothing).
[[nodiscard]] inline std::size_t dispatch_workspace_bytes(const routing_config& cfg,
                                                          std::int64_t tokens) {
  if (tokens <= 0) return 0;
  workspace_carver w;
  (void)carve_dispatch_scratch(w, tokens, cfg.top_k, cfg.num_experts, cfg.total_experts(),
                               cfg.capacity_groups(tokens), dispatch_tiles(cfg, tokens));
  return w.bytes();
}

// The row bounds of the layouts are shared by every backend (layout_rows.hpp).
using moeroute::compact_max_rows;
using moeroute::layout_max_rows;
using moeroute::padded_max_rows;

}  // namespace moeroute::cuda
