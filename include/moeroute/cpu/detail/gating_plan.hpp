// SPDX-License-Identifier: Apache-2.0
// How cpu::gating cuts a batch into tasks: a pure function of (E, T, loss.sequence_length), so
// the workspace size and every sum's rounding are the same for any thread count.
//   - sequence_length = 0, or sequences at least a task long: every task lies inside one
//     sequence (a piece of it); the per-task partials give both the batch sums (all tasks in
//     order) and the sequence sums (the sequence's pieces in order).
//   - shorter sequences: a task holds whole sequences and writes their sums itself.
// Tasks cut sequence-major positions (sequence s, position p) = s * L + p; with
// loss.sequence_order = position_major cpu::gating routes token p * S + s for each of them.
#pragma once

#include <algorithm>
#include <cstdint>

#include <moeroute/config.hpp>

namespace moeroute::cpu {

/// @brief The task cut of one gating call (see the file comment).
struct gating_plan {
  std::int64_t tokens = 0;
  std::int64_t segment_tokens = 0;  ///< a sequence (or T when there are none)
  std::int64_t segments = 0;        ///< sequences (1 without sequences)
  bool whole_segments = false;      ///< a task holds whole sequences (short sequences)
  std::int64_t pieces = 1;          ///< tasks per segment (whole_segments: 1)
  std::int64_t piece_tokens = 0;    ///< tokens per piece (the last piece of a segment may be
                                    ///< short); whole_segments: segments per task * L
  std::int64_t tasks = 0;

  /// Tokens [begin, end) of task i (may be empty).
  void range(std::int64_t i, std::int64_t& begin, std::int64_t& end) const noexcept {
    if (whole_segments) {
      begin = std::min(tokens, i * piece_tokens);
      end = std::min(tokens, begin + piece_tokens);
      return;
    }
    const std::int64_t seg = i / pieces, piece = i % pieces;
    const std::int64_t seg_begin = seg * segment_tokens, seg_end = seg_begin + segment_tokens;
    begin = std::min(seg_end, seg_begin + piece * piece_tokens);
    end = std::min(seg_end, begin + piece_tokens);
  }
};

/// Bytes of per-task scratch a task may own, summed over tasks: bounds the task count for
/// large E (each task holds a few rows of E floats).
inline constexpr std::int64_t gating_scratch_budget = std::int64_t{32} << 20;

/// @brief The plan for `tokens` tokens under `cfg` (cfg valid, T >= 0, whole sequences).
[[nodiscard]] inline gating_plan make_gating_plan(const routing_config& cfg,
                                                  std::int64_t tokens) noexcept {
  gating_plan p;
  p.tokens = tokens;
  if (tokens <= 0) return p;
  const std::int64_t E = cfg.num_experts;
  // about 16k logits a task, at most 256 tasks and what the scratch budget allows
  const std::int64_t by_budget = std::max<std::int64_t>(1, gating_scratch_budget / (64 * E));
  const std::int64_t max_tasks = std::min<std::int64_t>(256, by_budget);
  std::int64_t per_task = std::max<std::int64_t>(16, (16384 + E - 1) / E);
  per_task = std::max(per_task, (tokens + max_tasks - 1) / max_tasks);
  const std::int64_t L = cfg.loss.sequence_length;
  if (L > 0 && L < per_task) {
    p.segment_tokens = L;
    p.segments = tokens / L;
    p.whole_segments = true;
    const std::int64_t per = per_task / L;  // >= 1 whole sequences a task
    p.piece_tokens = per * L;
    p.tasks = (p.segments + per - 1) / per;
    return p;
  }
  p.segment_tokens = L > 0 ? L : tokens;
  p.segments = tokens / p.segment_tokens;
  p.pieces = (p.segment_tokens + per_task - 1) / per_task;
  p.piece_tokens = (p.segment_tokens + p.pieces - 1) / p.pieces;
  p.tasks = p.segments * p.pieces;
  return p;
}

}  // namespace moeroute::cpu
