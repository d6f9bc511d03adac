// SPDX-License-Identifier: Apache-2.0
// What an expert-parallel layer is asked to do beyond one device's routing: the capacity scope
// (who decides drops, over which batch), the receive layout, the overflow policy of a receive
// budget, and whether ranks check each other before data moves. docs/expert-parallel.md has
// the table of scopes and what each is invariant to.
#pragma once

#include <cstdint>
#include <string>

#include <moeroute/config.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::ep {

/// @brief Where capacity is applied. Each is a named option because peers silently differ.
enum class capacity_scope : std::uint8_t {
  /// Nothing is dropped; receive sizes come from the plan's counts exchange.
  dropless,
  /// Nothing is dropped; buffers are sized from options::worst_case_tokens, so a caller can
  /// allocate before the plan (DeepEP low-latency). A rank over the bound is an error.
  dropless_worst_case,
  /// The routing config's capacity applied on each rank to its own batch, before sending
  /// (Megatron, Tutel, DeepSpeed, GShard). Drops depend on how tokens are split over ranks.
  per_source,
  /// The config's capacity over the concatenated global batch, decided before sending from
  /// the all-gathered counts with the priority (source rank, token, choice). Drops equal one
  /// device routing the concatenated batch, for every R.
  global,
  /// Dropless up to a receive budget per destination rank (options::receive_budget rows).
  destination_budget,
};

/// @brief What a destination over its receive budget does.
enum class overflow_policy : std::uint8_t {
  error,      ///< every rank gets an error naming the rank and its true row count
  drop_tail,  ///< keep the first budget rows in (source rank, token, choice) order; report the
              ///< true pre-drop count in plan::required_rows
};

/// @brief Options of an expert-parallel layer. Every rank must pass equal options (checked).
struct options {
  capacity_scope scope = capacity_scope::per_source;
  /// dropless_worst_case: the most tokens any rank routes in one call (> 0).
  std::int64_t worst_case_tokens = 0;
  /// destination_budget: rows one rank may receive (>= 0).
  std::int64_t receive_budget = 0;
  overflow_policy overflow = overflow_policy::error;
  /// Receive side: compact (segments packed, each rounded up to block_size) or padded (each
  /// local expert a segment of plan::segment_rows rows).
  layout_kind receive_layout = layout_kind::compact;
  std::int64_t block_size = 1;  ///< compact: segment alignment (>= 1); padded: 1
  /// Validation mode: before any data moves, ranks exchange fingerprints of config, options
  /// and placement and every rank's local status, and each data call first agrees that every
  /// rank's arguments are good. Any disagreement is the same error on every rank, never a
  /// hang. Off saves one small collective per call and makes bad input undefined.
  bool check_ranks = true;
};

[[nodiscard]] inline const char* to_string(capacity_scope s) noexcept {
  switch (s) {
    case capacity_scope::dropless:
      return "dropless";
    case capacity_scope::dropless_worst_case:
      return "dropless_worst_case";
    case capacity_scope::per_source:
      return "per_source";
    case capacity_scope::global:
      return "global";
    case capacity_scope::destination_budget:
      return "destination_budget";
  }
  return "?";
}

/// @brief Checks options against the routing config: the field and value that are wrong.
[[nodiscard]] inline status validate(const routing_config& cfg, const options& o) {
  if (auto s = moeroute::validate(cfg); !s) return s;
  const auto bad = [](status_code c, std::string m) { return status::make(c, std::move(m)); };
  using moeroute::detail::field_msg;
  // Not yet across ranks: each needs per-token data (group index, top-1 score) in the
  // count exchange and the plan (docs/expert-parallel.md, "Limits").
  if (cfg.capacity.group_tokens > 0)
    return bad(status_code::unsupported,
               "capacity.group_tokens: the expert-parallel layer counts capacity over a rank's "
               "batch (or the global one), not per group of tokens; set 0");
  if (cfg.dispatch.prio == priority::batch_prioritized)
    return bad(status_code::unsupported,
               "dispatch.prio = batch_prioritized is not supported by the expert-parallel layer "
               "yet; use choice_major (its order without the score sort)");
  if (cfg.gating.second_expert.policy != second_expert_policy::all)
    return bad(status_code::unsupported,
               "gating.second_expert.policy: the expert-parallel layer routes every choice the "
               "gating made; NLLB's random / sampling policies are single-device for now");
  switch (o.scope) {
    case capacity_scope::dropless:
    case capacity_scope::per_source:
      break;
    case capacity_scope::dropless_worst_case:
      if (o.worst_case_tokens < 1 || o.worst_case_tokens > max_tokens)
        return bad(status_code::invalid_argument,
                   field_msg("options.worst_case_tokens", o.worst_case_tokens,
                             "must be in [1, max_tokens] for capacity_scope::dropless_worst_case"));
      break;
    case capacity_scope::destination_budget:
      if (o.receive_budget < 0 || o.receive_budget > max_tokens)
        return bad(status_code::invalid_argument,
                   field_msg("options.receive_budget", o.receive_budget,
                             "must be in [0, max_tokens] for capacity_scope::destination_budget"));
      [[fallthrough]];
    case capacity_scope::global:
      if (cfg.dispatch.dropped != drop_policy::zero_weight &&
          cfg.dispatch.dropped != drop_policy::residual)
        return bad(status_code::unsupported,
                   std::string("dispatch.dropped: capacity_scope::") + to_string(o.scope) +
                       " decides drops from counts, so it supports zero_weight and residual only "
                       "(fallback and next_choice reroute: use per_source)");
      if (o.scope == capacity_scope::global && cfg.dispatch.prio != priority::token_major &&
          cfg.dispatch.prio != priority::choice_major)
        return bad(status_code::unsupported,
                   "dispatch.prio: capacity_scope::global needs a positional priority "
                   "(token_major or choice_major); score and random priorities need every "
                   "rank's gates");
      break;
    default:
      return bad(status_code::invalid_argument, "options.scope: not a capacity_scope");
  }
  if (o.receive_layout != layout_kind::padded && o.receive_layout != layout_kind::compact)
    return bad(status_code::invalid_argument, "options.receive_layout: not a layout_kind");
  if (o.block_size < 1 || o.block_size > max_tokens)
    return bad(status_code::invalid_argument,
               field_msg("options.block_size", o.block_size, "must be in [1, max_tokens]"));
  if (o.receive_layout == layout_kind::padded && o.block_size != 1)
    return bad(status_code::invalid_argument,
               field_msg("options.block_size", o.block_size, "the padded layout takes 1"));
  if (o.overflow != overflow_policy::error && o.overflow != overflow_policy::drop_tail)
    return bad(status_code::invalid_argument, "options.overflow: not an overflow_policy");
  return status::success();
}

}  // namespace moeroute::ep
