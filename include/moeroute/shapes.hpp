// SPDX-License-Identifier: Apache-2.0
// The one place that says which buffers each stage writes for a config and a batch: every
// output of gating, dispatch and layout with its name, element type, extents and whether the
// config needs it. The owning routers allocate from these lists, the Python package allocates
// and checks the caller's arrays against them, and tests and tools size their buffers with
// them — so a shape is written once. Names are the view fields without `d_` (`ids`,
// `aux_score_sum`, `row_token`); extents follow the params structs' comments. Plain C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/layout_rows.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// The element type of a stage buffer.
enum class buffer_type : std::uint8_t { f32, f64, i32, i64, u8 };

/// @brief Bytes of one element of `t`.
[[nodiscard]] constexpr std::size_t size_of(buffer_type t) noexcept {
  switch (t) {
    case buffer_type::f64:
    case buffer_type::i64:
      return 8;
    case buffer_type::u8:
      return 1;
    default:
      return 4;
  }
}

/// Whether a stage call needs a buffer for the config it runs (nullptr otherwise).
enum class buffer_need : std::uint8_t {
  required,  ///< the call fails naming the field when it is null
  optional,  ///< written when given (e.g. the logsumexp, the non-finite count)
};

/// One buffer of a stage: name, element type, extents (row-major) and need.
struct buffer_shape {
  std::string_view name;
  buffer_type type = buffer_type::f32;
  std::vector<std::int64_t> extents;
  buffer_need need = buffer_need::required;

  /// Elements: the product of the extents.
  [[nodiscard]] std::int64_t count() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t e : extents) n *= e;
    return n;
  }
  [[nodiscard]] std::size_t bytes() const noexcept {
    return static_cast<std::size_t>(count()) * size_of(type);
  }
};

/// What a gating call is asked to write beyond what its config needs.
struct gating_buffer_options {
  bool logsumexp = true;       ///< [T] the logsumexp (optional for the call)
  bool per_token_aux = false;  ///< aux_scores [T, E] and aux_count_ids [T, c] (optional)
  bool replay = false;         ///< replay_replaced, replay_invalid [1] (gating_replay; optional)
};

/// @brief The buffers of gating_result for `tokens` tokens: ids, gates [T, k]; reroute_ids
///        [T, R] (R > 0); logsumexp [T] (options.logsumexp); the sums aux_score_sum, aux_count
///        [E], valid_tokens [1], z_sum_squares [1] (required iff loss.z_coefficient != 0),
///        nonfinite [1]; seq_score_sum, seq_count [S, E], seq_tokens [S] (S = T /
///        loss.sequence_length, sequences only); token_priority [T] (batch_prioritized);
///        second_skipped [T] (a random second expert); aux_scores [T, E] and aux_count_ids
///        [T, c] (options.per_token_aux; c = 1 for aux_counts::top1, else k); the replay
///        counts replay_replaced and replay_invalid [1] (options.replay, gating_replay).
[[nodiscard]] inline std::vector<buffer_shape> gating_buffers(
    const routing_config& cfg, std::int64_t tokens, const gating_buffer_options& options = {}) {
  using bt = buffer_type;
  const std::int64_t T = tokens, E = cfg.num_experts, k = cfg.top_k;
  const std::int64_t R = cfg.reroute_candidates();
  const buffer_need z =
      cfg.loss.z_coefficient != 0.0f ? buffer_need::required : buffer_need::optional;
  std::vector<buffer_shape> s = {{"ids", bt::i32, {T, k}},
                                 {"gates", bt::f32, {T, k}},
                                 {"aux_score_sum", bt::f64, {E}},
                                 {"aux_count", bt::i64, {E}},
                                 {"valid_tokens", bt::i64, {1}},
                                 {"z_sum_squares", bt::f64, {1}, z},
                                 {"nonfinite", bt::i64, {1}, buffer_need::optional}};
  if (options.logsumexp) s.push_back({"logsumexp", bt::f32, {T}, buffer_need::optional});
  if (R > 0) s.push_back({"reroute_ids", bt::i32, {T, R}});
  if (cfg.loss.sequence_length > 0) {
    const std::int64_t S = T / cfg.loss.sequence_length;
    s.push_back({"seq_score_sum", bt::f64, {S, E}});
    s.push_back({"seq_count", bt::i64, {S, E}});
    s.push_back({"seq_tokens", bt::i64, {S}});
  }
  if (cfg.dispatch.prio == priority::batch_prioritized)
    s.push_back({"token_priority", bt::f32, {T}});
  if (cfg.gating.second_expert.policy == second_expert_policy::random)
    s.push_back({"second_skipped", bt::u8, {T}});
  if (options.per_token_aux) {
    const std::int64_t c = cfg.aux_counts_per_token();
    s.push_back({"aux_scores", bt::f32, {T, E}, buffer_need::optional});
    s.push_back({"aux_count_ids", bt::i32, {T, c}, buffer_need::optional});
  }
  if (options.replay) {
    s.push_back({"replay_replaced", bt::i64, {1}, buffer_need::optional});
    s.push_back({"replay_invalid", bt::i64, {1}, buffer_need::optional});
  }
  return s;
}

/// The int64 fields of dispatch_totals, in order: the "totals" buffer is [8] int64.
inline constexpr std::string_view dispatch_totals_fields[] = {
    "capacity", "fallback_capacity", "kept",          "rerouted", "dropped",
    "masked",   "reroute_rounds",    "invalid_tokens"};
static_assert(sizeof(dispatch_totals) == sizeof(std::int64_t) * std::size(dispatch_totals_fields));

/// @brief The buffers of dispatch_result: expert, slot, weight, fate [T, k]; requested, kept,
///        rerouted, dropped [E]; received, load [ET]; totals [8] (dispatch_totals).
[[nodiscard]] inline std::vector<buffer_shape> dispatch_buffers(const routing_config& cfg,
                                                                std::int64_t tokens) {
  using bt = buffer_type;
  const std::int64_t T = tokens, E = cfg.num_experts, k = cfg.top_k, ET = cfg.total_experts();
  static_assert(sizeof(fate) == 1);
  return {{"expert", bt::i32, {T, k}}, {"slot", bt::i32, {T, k}},   {"weight", bt::f32, {T, k}},
          {"fate", bt::u8, {T, k}},    {"requested", bt::i64, {E}}, {"kept", bt::i64, {E}},
          {"rerouted", bt::i64, {E}},  {"dropped", bt::i64, {E}},   {"received", bt::i64, {ET}},
          {"load", bt::i64, {ET}},     {"totals", bt::i64, {8}}};
}

/// @brief The rows of a layout of `kind` for `tokens` tokens (its max_rows), with a local-expert
///        view of `local_experts` > 0 experts the compact bound over those; an error status
///        naming the combination that has no bound (padded with an unbounded capacity) or a
///        block_size < 1.
[[nodiscard]] inline status layout_rows(const routing_config& cfg, std::int64_t tokens,
                                        layout_kind kind, std::int64_t block_size,
                                        std::int32_t local_experts, std::int64_t& rows) {
  rows = 0;
  if (block_size < 1)
    return status::make(status_code::invalid_argument,
                        "layout: block_size = " + std::to_string(block_size) + ": must be >= 1");
  rows = local_experts > 0 ? local_compact_max_rows(cfg, tokens, block_size, local_experts)
                           : layout_max_rows(cfg, tokens, kind, block_size);
  if (rows < 0) {
    rows = 0;
    return status::make(status_code::invalid_argument,
                        "layout: the padded layout needs a bounded capacity; capacity.mode = "
                        "unbounded works with the compact layout");
  }
  return status::success();
}

/// @brief The buffers of layout_result for `rows` = layout_rows(...): offsets [S + 1],
///        rows_used [S] (optional), row_token [rows], assignment_row [T, k], num_rows [1];
///        block_expert [rows / block_size] (compact); nonlocal [1] (a local-expert view). S =
///        total_experts, or local_experts for a local-expert view.
[[nodiscard]] inline std::vector<buffer_shape> layout_buffers(const routing_config& cfg,
                                                              std::int64_t tokens, layout_kind kind,
                                                              std::int64_t block_size,
                                                              std::int64_t rows,
                                                              std::int32_t local_experts = 0) {
  using bt = buffer_type;
  const std::int64_t S = local_experts > 0 ? local_experts : cfg.total_experts();
  std::vector<buffer_shape> s = {{"offsets", bt::i64, {S + 1}},
                                 {"rows_used", bt::i64, {S}, buffer_need::optional},
                                 {"row_token", bt::i32, {rows}},
                                 {"assignment_row", bt::i64, {tokens, cfg.top_k}},
                                 {"num_rows", bt::i64, {1}}};
  if (kind == layout_kind::compact)
    s.push_back({"block_expert", bt::i32, {block_size > 0 ? rows / block_size : 0}});
  if (local_experts > 0) s.push_back({"nonlocal", bt::i64, {1}});
  return s;
}

/// @brief The buffer named `name` of `shapes`, or null.
[[nodiscard]] inline const buffer_shape* find_buffer(std::span<const buffer_shape> shapes,
                                                     std::string_view name) noexcept {
  for (const auto& s : shapes)
    if (s.name == name) return &s;
  return nullptr;
}

/// Buffers carved from one block start at multiples of this (as workspaces are carved).
inline constexpr std::size_t buffer_alignment = 256;

/// @brief Bytes of one block holding every buffer of `shapes`, each at a buffer_alignment
///        boundary (the block itself aligned so).
[[nodiscard]] inline std::size_t buffer_block_bytes(std::span<const buffer_shape> shapes) noexcept {
  std::size_t n = 0;
  for (const auto& s : shapes)
    n += (s.bytes() + buffer_alignment - 1) / buffer_alignment * buffer_alignment;
  return n;
}

/// @brief Where each buffer of `shapes` starts in a block at `base` (buffer_block_bytes long):
///        out[i] for shapes[i], in order.
inline void carve_buffers(std::span<const buffer_shape> shapes, std::byte* base,
                          std::span<std::byte*> out) noexcept {
  std::size_t at = 0;
  for (std::size_t i = 0; i < shapes.size() && i < out.size(); ++i) {
    out[i] = base + at;
    at += (shapes[i].bytes() + buffer_alignment - 1) / buffer_alignment * buffer_alignment;
  }
}

}  // namespace moeroute
