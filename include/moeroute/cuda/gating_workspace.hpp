// SPDX-License-Identifier: Apache-2.0
// Workspace size of the CUDA gating launcher (moeroute/cuda/gating.cuh), as a
// pure C++ query: callable from a .cpp file with no CUDA header, so a framework can size the
// caller-owned workspace before it ever touches the device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/gating_plan.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cuda {

/// @brief Carves (or, with a sizing carver, sizes) the gating workspace. One sequence of
///        calls for both passes, so size and layout can never disagree.
inline gating_partials carve_gating_workspace(workspace_carver& w, const gating_plan& p,
                                              std::int32_t experts) noexcept {
  gating_partials l;
  const auto n = static_cast<std::size_t>(p.chunks);
  const auto ne = n * static_cast<std::size_t>(experts);
  l.d_scores = w.take<double>(ne);
  l.d_counts = w.take<std::int32_t>(ne);
  l.d_z = w.take<double>(n);
  l.d_valid = w.take<std::int64_t>(n);
  l.d_nonfinite = w.take<std::int64_t>(n);
  return l;
}

/// @brief Bytes of caller-owned device workspace `cuda::gating` needs for `tokens` tokens.
///        0 for T = 0. Pure C++: no CUDA call, no device query.
/// @note  Roughly chunks * E * 12 bytes; chunks is about min(T, 1024) without sequences and
///        T / sequence_length * ceil(sequence_length / chunk) with them.
[[nodiscard]] inline std::size_t gating_workspace_bytes(const routing_config& cfg,
                                                        std::int64_t tokens) noexcept {
  const gating_plan p = make_gating_plan(cfg, tokens);
  if (p.chunks == 0) return 0;
  workspace_carver sizing;
  (void)carve_gating_workspace(sizing, p, cfg.num_experts);
  return sizing.bytes();
}

}  // namespace moeroute::cuda
