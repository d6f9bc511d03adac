// SPDX-License-Identifier: Apache-2.0
// How the gating stage cuts a batch into chunks: a pure function of (num_experts, T,
// loss.sequence_length), shared by the CUDA launcher (grid and workspace size), the gating
// kernel (which tokens a block routes) and the tests. Plain C++ (host and device), so the
// kernels include it without including a launcher.
#pragma once

#include <algorithm>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/macros.hpp>

namespace moeroute {

/// Largest E served by the register-resident warp kernels; above it a generic kernel runs
/// (one warp per token, values in thread-local memory), up to moeroute::max_experts.
inline constexpr std::int32_t gating_warp_max_experts = 512;
/// The token axis is cut into at most about this many chunks (one block each) when
/// loss.sequence_length is 0; with sequences every chunk lies inside one sequence.
inline constexpr std::int64_t gating_target_chunks = 1024;

/// @brief How the gating kernel covers a batch. A pure function of (num_experts, T,
///        loss.sequence_length), so the workspace size never depends on the device.
struct gating_plan {
  std::int32_t lanes = 32;           ///< threads per token (8, 16 or 32)
  std::int32_t values_per_lane = 1;  ///< register slots per lane: lanes * slots >= E
  std::int32_t warps_per_block = 8;
  bool generic = false;             ///< E > gating_warp_max_experts
  std::int64_t segment_tokens = 0;  ///< loss.sequence_length, or T when it is 0
  std::int64_t segments = 0;        ///< T / segment_tokens
  std::int64_t pieces = 0;          ///< chunks per segment
  std::int64_t piece_tokens = 0;    ///< tokens per chunk (the last chunk of a segment may be short)
  std::int64_t chunks = 0;          ///< segments * pieces = blocks of the gating kernel
  /// Chunks cut sequence-major positions v = s * L + pos; with loss.sequence_order =
  /// position_major token v is pos * S + s (a chunk's tokens are S rows apart).
  bool position_major = false;

  /// The token at sequence-major position v (see position_major).
  [[nodiscard]] MOEROUTE_HOST_DEVICE std::int64_t token(std::int64_t v) const noexcept {
    return position_major ? (v % segment_tokens) * segments + v / segment_tokens : v;
  }

  /// Tokens a block works on at once.
  [[nodiscard]] std::int64_t tokens_per_round() const noexcept {
    return std::int64_t{warps_per_block} * (32 / lanes);
  }
};

/// @brief Positions [begin, end) of chunk c: piece c % pieces of segment c / pieces (tokens
///        plan.token(v) of them). Shared by the kernel and the host tests, so both cut the batch
///        the same way. May be empty.
MOEROUTE_HOST_DEVICE inline void gating_chunk_range(std::int64_t segment_tokens,
                                                    std::int64_t pieces, std::int64_t piece_tokens,
                                                    std::int64_t c, std::int64_t& begin,
                                                    std::int64_t& end) noexcept {
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
  p.position_major =
      cfg.loss.sequence_length > 0 && cfg.loss.sequence_order == token_order::position_major;
  return p;
}

/// @brief Per-chunk partial sums the gating kernel writes (chunk c owns row c) and its reduce
///        kernel adds in chunk order, so the totals do not depend on which block ran first.
struct gating_partials {
  double* d_scores = nullptr;           ///< [chunks, E] f64 sum of P over the chunk's valid tokens
  std::int32_t* d_counts = nullptr;     ///< [chunks, E] int32 aux counts in the chunk
  double* d_z = nullptr;                ///< [chunks] f64 sum of logsumexp^2 over valid tokens
  std::int64_t* d_valid = nullptr;      ///< [chunks] int64 valid tokens
  std::int64_t* d_nonfinite = nullptr;  ///< [chunks] int64 NaN/Inf logits seen
};

}  // namespace moeroute
