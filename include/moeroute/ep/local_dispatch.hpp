// SPDX-License-Identifier: Apache-2.0
// Expert parallelism, phase 1 of 3: the local dispatch. Local only — no communication. Checks the
// rank's routing, decides what can be decided on this rank alone (every drop of the per_source
// scope; nothing for the dropless, global and budget scopes, whose drops the plan decides),
// and counts rows per destination rank and per global expert, plus the [T, R] membership.
//
// A bad input does not throw here: it is stored in local_dispatch_output::error, and make_plan
// reports it on every rank, so a rank with bad data never leaves its peers waiting.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/ep/options.hpp>
#include <moeroute/ep/placement.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/status.hpp>

namespace moeroute::ep {

/// @brief What the local dispatch found on one rank (was `layout_output`).
struct local_dispatch_output {
  std::int32_t rank = 0;
  std::int32_t ranks = 0;
  status error;  ///< bad local input (make_plan raises it on every rank); success otherwise
  /// The rank's dispatch so far: final for per_source; for dropless, global and
  /// destination_budget every valid assignment kept (the plan drops from it).
  reference::dispatch_output decision;
  std::vector<float> gates;                   ///< [T, k] pre-drop gates (weights after a drop)
  std::vector<std::int64_t> rows_per_expert;  ///< [ET] distinct (token, expert) rows per expert
  std::vector<std::int64_t> rows_per_rank;    ///< [R] rows to each rank (fallback rows to self)
  /// [k, E] valid assignments per (choice, expert): the requests the global scope ranks.
  std::vector<std::int64_t> requests;
  std::vector<std::uint8_t> membership;  ///< [T, R] 1 when token t sends a row to rank r
};

/// Rank that holds rows of global expert g sent by `source`: its owner, or `source` itself for
/// the dedicated fallback (shared) expert E, which every rank runs on its own tokens.
[[nodiscard]] inline std::int32_t destination(const placement& place, std::int32_t source,
                                              global_expert_id g) {
  return g.value == place.experts() ? source : place.owner(g);
}

namespace detail {
/// Config of the local decision: the scopes the plan decides start from "everything kept".
inline routing_config local_config(const routing_config& cfg, const options& opt) {
  if (opt.scope == capacity_scope::per_source) return cfg;
  routing_config c = cfg;
  c.capacity.mode = capacity_mode::unbounded;
  return c;
}

inline status check_inputs(const routing_config& cfg, const placement& place, const options& opt,
                           std::int32_t rank, const reference::gating_output& g) {
  if (auto s = validate(cfg, opt); !s) return s;
  if (place.experts() != cfg.num_experts)
    return status::make(
        status_code::invalid_argument,
        "placement.experts() = " + std::to_string(place.experts()) +
            " does not match config num_experts = " + std::to_string(cfg.num_experts));
  if (rank < 0 || rank >= place.ranks())
    return status::make(status_code::invalid_argument, "rank = " + std::to_string(rank) +
                                                           " is outside [0, placement.ranks() = " +
                                                           std::to_string(place.ranks()) + ")");
  // (ranges, finiteness, and a token naming an expert once)
  if (auto s = reference::validate_gating_output(cfg, g); !s) return s;
  if (opt.scope == capacity_scope::dropless_worst_case && g.tokens > opt.worst_case_tokens)
    return status::make(
        status_code::invalid_argument,
        "gating_output.tokens = " + std::to_string(g.tokens) +
            " exceeds options.worst_case_tokens = " + std::to_string(opt.worst_case_tokens));
  return status::success();
}

/// True when assignment (t, j) holds a row and is the first of its token to name that expert:
/// a reroute onto an expert the token already holds shares the row (as in one device's layout).
inline bool first_of_row(const reference::dispatch_output& d, std::int64_t t, std::int32_t j) {
  const std::int32_t e = d.expert[t * d.k + j];
  if (e < 0) return false;
  for (std::int32_t i = 0; i < j; ++i)
    if (d.expert[t * d.k + i] == e) return false;
  return true;
}

/// Counts of a decided dispatch: rows per expert and rank, and membership. A token holds one
/// row per distinct final expert (a reroute onto an expert it already holds shares the row).
inline void count_rows(const placement& place, local_dispatch_output& L) {
  const auto& d = L.decision;
  const std::int32_t k = d.k, R = L.ranks;
  L.rows_per_expert.assign(d.total_experts, 0);
  L.rows_per_rank.assign(R, 0);
  L.membership.assign(d.tokens * R, 0);
  for (std::int64_t t = 0; t < d.tokens; ++t)
    for (std::int32_t j = 0; j < k; ++j) {
      if (!first_of_row(d, t, j)) continue;
      const std::int32_t e = d.expert[t * k + j];
      const std::int32_t r = destination(place, L.rank, {e});
      ++L.rows_per_expert[e];
      ++L.rows_per_rank[r];
      L.membership[t * R + r] = 1;
    }
}
}  // namespace detail

/// @brief Phase 1: the local dispatch of one rank's routing — the single-device capacity
///        decisions the scope lets this rank make alone, and the rows it will send where.
/// @param cfg   routing config (equal on every rank)
/// @param place expert placement (equal on every rank)
/// @param opt   expert-parallel options (equal on every rank)
/// @param rank  this rank
/// @param g     this rank's gating output (reference::gating, or an engine's own ids and gates
///              in that struct); T may be 0 — such a rank still takes part in every exchange.
/// @return the rank's decisions and counts; never throws on bad data (see
/// local_dispatch_output::error). Pure, no I/O.
[[nodiscard]] inline local_dispatch_output local_dispatch(const routing_config& cfg,
                                                          const placement& place,
                                                          const options& opt, std::int32_t rank,
                                                          const reference::gating_output& g) {
  local_dispatch_output L;
  L.rank = rank;
  L.ranks = place.ranks();
  L.error = detail::check_inputs(cfg, place, opt, rank, g);
  if (!L.error) return L;
  try {
    L.decision = reference::dispatch(detail::local_config(cfg, opt), g);
  } catch (const error& e) {
    L.error = e.get_status();
    return L;
  }
  L.gates = g.gates;
  L.requests.assign(static_cast<std::size_t>(g.k) * g.experts, 0);
  for (std::int64_t t = 0; t < g.tokens; ++t)
    for (std::int32_t j = 0; j < g.k; ++j)
      if (g.valid[t]) ++L.requests[static_cast<std::size_t>(j) * g.experts + g.ids[t * g.k + j]];
  detail::count_rows(place, L);
  return L;
}

/// The names before 0.3: the first phase was called "layout", which is another operation
/// of moeroute (the expert rows of one device).
using layout_output [[deprecated("ep::layout_output is ep::local_dispatch_output")]] =
    local_dispatch_output;
[[deprecated("ep::layout is ep::local_dispatch")]] [[nodiscard]] inline local_dispatch_output
layout(const routing_config& cfg, const placement& place, const options& opt, std::int32_t rank,
       const reference::gating_output& g) {
  return local_dispatch(cfg, place, opt, rank, g);
}

}  // namespace moeroute::ep
