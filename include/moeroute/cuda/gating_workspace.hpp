// SPDX-License-Identifier: Apache-2.0
// Launch plan and workspace size of the CUDA gating launcher (moeroute/cuda/gating.cuh), as a
// pure C++ query: callable from a .cpp file with no CUDA header, so a framework can size the
// caller-owned workspace before it ever touches the device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/macros.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cuda {

/// Largest E served by the register-resident warp kernels; above it a generic kernel runs
/// (one warp per token, values in thread-local memory), up to moeroute::max_experts.
inline constexpr std::int32_t gating_warp_max_experts = 512;
/// The token axis is cut into at most about this many chunks (one block each) when
/// loss.sequence_length is 0; with sequences every chunk lies inside one sequence.
inline constexpr std::int64_t gating_target_chunks = 1024;

/// @brief How the gating kernel covers a batch. A pure function of (num_experts, T,
///        loss.sequence_length), so the workspace size never depends on the device.
struct gating_plan {
  std::int32_t lanes = 32;            ///< threads per token (8, 16 or 32)
  std::int32_t values_per_lane = 1;   ///< register slots per lane: lanes * slots >= E
  std::int32_t warps_per_block = 8;
  bool generic = false;               ///< E > gating_warp_max_experts
  std::int64_t segment_tokens = 0;    ///< loss.sequence_length, or T when it is 0
  std::int64_t segments = 0;          ///< T / segment_tokens
  std::int64_t pieces = 0;            ///< chunks per segment
  std::int64_t piece_tokens = 0;      ///< tokens per chunk (the last chunk of a segment may be short)
  std::int64_t chunks = 0;            ///< segments * pieces = blocks of the gating kernel

  /// Tokens a block works on at once.
  [[nodiscard]] std::int64_t tokens_per_round() const noexcept {
    return std::int64_t{warps_per_block} * (32 / lanes);
  }
};

/// @brief Tokens [begin, end) of chunk c: piece c % pieces of segment c / pieces. Shared by the
///        kernel and the host tests, so both cut the batch the same way. May be empty.
MOEROUTE_HOST_DEVICE inline void gating_chunk_range(std::int64_t segment_tokens, std::int64_t pieces,
                                                    std::int64_t piece_tokens, std::int64_t c,
                                                    std::int64_t& begin, std::int64_t& end) noexcept {
  const std::int64_t seg = c / pieces, piece = c % pieces;
  const std::int64_t seg_begin = seg * segment_tokens, seg_end = seg_begin + segment_tokens;
  const std::int64_t b = seg_begin + piece * piece_tokens;
  begin = b < seg_end ? b : seg_end;
  end = begin + piece_tokens < seg_end ? begin + piece_tokens : seg_end;
}

/// @brief The plan for `tokens` tokens under `cfg` (cfg must pass validate(); T >= 0).
[[nodiscard]] inline gating_plan make_gating_plan(const routing_config& cfg,
                                                  std::int64_t tokens) noexcept {
  gating_plan p;
  const std::int32_t E = cfg.num_experts;
  if (E <= 8) {
    p.lanes = 8;
  } else if (E <= 16) {
    p.lanes = 16;
  } else {
    p.lanes = 32;
  }
  if (E <= gating_warp_max_experts) {
    std::int32_t v = 1;
    while (p.lanes * v < E) v *= 2;
    p.values_per_lane = v;
  } else {
    p.generic = true;
    p.values_per_lane = max_experts / 32;  // 256 slots; loops stop at ceil(E / 32)
    p.warps_per_block = 1;
  }
  if (tokens <= 0) return p;
  const std::int64_t L = cfg.loss.sequence_length > 0 ? cfg.loss.sequence_length : tokens;
  p.segment_tokens = L;
  p.segments = tokens / L;
  const std::int64_t target =
      std::max(p.tokens_per_round(), (tokens + gating_target_chunks - 1) / gating_target_chunks);
  p.pieces = (L + target - 1) / target;
  p.piece_tokens = (L + p.pieces - 1) / p.pieces;
  p.chunks = p.segments * p.pieces;
  return p;
}

/// Per-chunk partial sums the gating kernel writes and its reduction kernel reads.
struct gating_workspace_layout {
  double* d_partial_scores = nullptr;          ///< [chunks, E] sum of P over the chunk's valid tokens
  std::int32_t* d_partial_counts = nullptr;    ///< [chunks, E] aux counts in the chunk
  double* d_partial_z = nullptr;               ///< [chunks] sum of lse^2 over valid tokens
  std::int64_t* d_partial_valid = nullptr;     ///< [chunks] valid tokens
  std::int64_t* d_partial_nonfinite = nullptr; ///< [chunks] NaN/Inf logits seen
};

/// @brief Carves (or, with a sizing carver, sizes) the gating workspace. One sequence of
///        calls for both passes, so size and layout can never disagree.
inline gating_workspace_layout carve_gating_workspace(workspace_carver& w, const gating_plan& p,
                                                      std::int32_t experts) noexcept {
  gating_workspace_layout l;
  const auto n = static_cast<std::size_t>(p.chunks);
  const auto ne = n * static_cast<std::size_t>(experts);
  l.d_partial_scores = w.take<double>(ne);
  l.d_partial_counts = w.take<std::int32_t>(ne);
  l.d_partial_z = w.take<double>(n);
  l.d_partial_valid = w.take<std::int64_t>(n);
  l.d_partial_nonfinite = w.take<std::int64_t>(n);
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
