// SPDX-License-Identifier: Apache-2.0
// Expert parallelism, phase 2 of 3: the plan. The one counts exchange (and so, on a GPU, the
// one host sync) of a layer: ranks all-gather a fingerprint header (validation mode) and their
// counts, then every rank derives the same numbers from the same data — the global and budget
// drops, the [R, R] send matrix, the receive layout — with no further communication. A plan
// is plain data: reuse it for dispatch, combine and both backward passes, and for any batch
// with the same routing; a reused plan gives bitwise what a fresh one gives.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/config_fields.hpp>
#include <moeroute/ep/agree.hpp>
#include <moeroute/ep/local_dispatch.hpp>
#include <moeroute/ep/options.hpp>
#include <moeroute/ep/placement.hpp>
#include <moeroute/ep/transport.hpp>
#include <moeroute/layout_rows.hpp>
#include <moeroute/reference/dispatch.hpp>

namespace moeroute::ep {

/// @brief Where a received row came from (what dispatch_sources writes).
struct row_source {
  std::int32_t rank = -1;    ///< source rank; -1 for a padding row
  std::int32_t token = -1;   ///< token index on the source rank
  std::int32_t choice = -1;  ///< the first choice j of that token naming this row
  float weight = 0.0f;       ///< combine weight: sum over the token's assignments holding the row
};

/// @brief Everything dispatch, combine and the backward passes need, and the counts every rank
///        can read. Shapes: T this rank's tokens, k choices, R ranks, S local segments (this
///        rank's experts, plus one for a dedicated fallback expert, which every rank runs on
///        its own tokens), ET = E (+1 with a dedicated fallback).
struct plan {
  std::int32_t rank = 0, ranks = 0;
  routing_config cfg;
  options opt;
  std::int64_t hidden = 0;         ///< d of every row
  std::size_t element_bytes = 0;   ///< sizeof the row element type dispatch is called with
  std::int64_t tokens = 0;         ///< T on this rank
  std::int64_t global_tokens = 0;  ///< sum of T over ranks
  std::int64_t capacity = 0;       ///< C applied: this rank's (per_source), the global one
                                   ///< (global), unbounded_capacity (-1) for the others

  /// This rank's final routing: fate, final expert, slot and combine weight of every (t, j).
  /// For the global scope, fates and slots equal one device routing the concatenated batch.
  reference::dispatch_output decision;

  // Source side: send rows grouped by destination rank, then by segment there, then token.
  std::vector<std::int64_t> send_rows;       ///< [R]
  std::vector<std::int64_t> send_offsets;    ///< [R + 1]
  std::vector<std::int32_t> send_token;      ///< [send_total] token of each send row
  std::vector<std::int64_t> assignment_row;  ///< [T, k] send row of each assignment, -1 none

  // Receive side: the expert-major receive layout, and where each exchanged row lands in it.
  std::vector<std::int32_t> segment_expert;   ///< [S] global expert of each segment
  std::vector<std::int64_t> segment_offsets;  ///< [S + 1] first receive row of each segment
  std::vector<std::int64_t> segment_used;     ///< [S] rows holding a token
  std::vector<std::int64_t> segment_from;     ///< [R, S] rows each source sends each segment
  std::int64_t segment_rows = 0;              ///< padded: rows of every segment; compact: 0
  std::int64_t receive_rows = 0;              ///< rows of the receive layout, padding included
  std::vector<std::int64_t> recv_rows;        ///< [R] rows from each source
  std::vector<std::int64_t> recv_offsets;     ///< [R + 1]
  /// The exchange as blocks: send order, one block per (destination rank, its segment); the
  /// receive layout, one block per (source rank, segment) — so rows move with no staging copy.
  /// Non-empty blocks only, and the lists pair up: the n-th block this rank lists for rank q
  /// holds as many rows as the n-th block q lists for this rank (alltoallv_paired_blocks).
  std::vector<row_block> send_blocks, receive_blocks;
  /// The same lists without this rank's blocks to itself: dispatch gathers those rows straight
  /// into the receive layout, and exchanges only these.
  std::vector<row_block> peer_send_blocks, peer_receive_blocks;

  // Counts of the whole group, identical on every rank.
  std::vector<std::int64_t> send_matrix;  ///< [R, R] rows source -> destination (after drops)
  /// [R, ET] rows each source sends each global expert, after drops (column E: a dedicated
  /// fallback, whose rows stay on their source)
  std::vector<std::int64_t> source_expert_rows;
  std::vector<std::int64_t> expert_rows;      ///< [E] rows each routed expert receives
  std::vector<std::int64_t> required_rows;    ///< [R] rows each rank would receive before any
                                              ///< budget drop (the true count)
  std::vector<std::int64_t> dropped_by_rank;  ///< [R] assignments each source dropped

  [[nodiscard]] std::int64_t send_total() const noexcept { return send_offsets.back(); }
  [[nodiscard]] std::int64_t recv_total() const noexcept { return recv_offsets.back(); }
  [[nodiscard]] std::int32_t segments() const noexcept {
    return static_cast<std::int32_t>(segment_expert.size());
  }
  /// Rows rank r receives (a column sum of send_matrix).
  [[nodiscard]] std::int64_t received_by(std::int32_t r) const {
    std::int64_t n = 0;
    for (std::int32_t s = 0; s < ranks; ++s) n += send_matrix[s * ranks + r];
    return n;
  }
  /// Rows that cross ranks (the off-diagonal of send_matrix), over all ranks.
  [[nodiscard]] std::int64_t crossing_rows() const {
    std::int64_t n = 0;
    for (std::int32_t s = 0; s < ranks; ++s)
      for (std::int32_t r = 0; r < ranks; ++r) n += s == r ? 0 : send_matrix[s * ranks + r];
    return n;
  }
  /// max over ranks of rows received / their mean; 1 at perfect balance, 0 with no rows.
  [[nodiscard]] double hotspot() const {
    std::int64_t mx = 0, sum = 0;
    for (std::int32_t r = 0; r < ranks; ++r) {
      const std::int64_t n = received_by(r);
      mx = std::max(mx, n);
      sum += n;
    }
    return sum == 0 ? 0.0 : static_cast<double>(mx) * ranks / static_cast<double>(sum);
  }
  /// Assignments dropped over all ranks.
  [[nodiscard]] std::int64_t dropped() const {
    std::int64_t n = 0;
    for (auto v : dropped_by_rank) n += v;
    return n;
  }
};

/// @brief Rows a rank can receive under capacity_scope::dropless_worst_case, from the options
///        alone: allocate receive buffers with it before any exchange (no host sync needed).
[[nodiscard]] inline std::int64_t receive_rows_bound(const routing_config& cfg,
                                                     const placement& place, const options& opt,
                                                     std::int32_t rank) {
  throw_if_error(validate(cfg, opt));
  const std::int64_t S = place.local_experts(rank) + (cfg.has_dedicated_fallback() ? 1 : 0);
  const std::int64_t per_source = opt.worst_case_tokens * std::min<std::int64_t>(cfg.top_k, S);
  if (opt.receive_layout == layout_kind::padded) return S * place.ranks() * opt.worst_case_tokens;
  // every source sends an expert at most worst_case_tokens rows
  return aligned_rows_bound(place.ranks() * per_source, S, place.ranks() * opt.worst_case_tokens,
                            opt.block_size);
}

namespace detail {

/// Fingerprints and sizes every rank must agree on; one fixed-size record per rank.
struct plan_header {
  std::uint64_t magic = 0x4d4f45524f555445ull;  // "MOEROUTE"
  std::uint64_t config = 0, options = 0, placement = 0;
  std::int64_t ranks = 0, hidden = 0, element_bytes = 0;
  status_record local;
};

inline std::uint64_t fingerprint(const routing_config& cfg) {
  const std::string s = to_string(cfg, true);
  return fnv1a(s.data(), s.size());
}
inline std::uint64_t fingerprint(const options& o) {
  const std::int64_t v[] = {static_cast<std::int64_t>(o.scope),
                            o.worst_case_tokens,
                            o.receive_budget,
                            static_cast<std::int64_t>(o.overflow),
                            static_cast<std::int64_t>(o.receive_layout),
                            o.block_size,
                            o.check_ranks ? 1 : 0};
  return fnv1a(v, sizeof v);
}

[[noreturn]] inline void disagree(const char* what, std::size_t r0, std::uint64_t v0, std::size_t r,
                                  std::uint64_t v) {
  throw error(status::make(status_code::communication_error,
                           std::string("moeroute::ep::make_plan: ranks disagree on ") + what +
                               ": rank " + std::to_string(r0) + " has " + std::to_string(v0) +
                               ", rank " + std::to_string(r) + " has " + std::to_string(v)));
}

/// The validation mode's header exchange: same decision on every rank.
inline void check_header(transport& t, const plan_header& mine) {
  std::vector<plan_header> all(static_cast<std::size_t>(t.ranks()));
  t.allgather(&mine, all.data(), sizeof(plan_header));
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto& h = all[r];
    if (h.magic != all[0].magic) disagree("the moeroute version", 0, all[0].magic, r, h.magic);
    if (h.ranks != static_cast<std::int64_t>(all.size()))
      throw error(status::make(status_code::communication_error,
                               "moeroute::ep::make_plan: rank " + std::to_string(r) +
                                   " has a placement for " + std::to_string(h.ranks) +
                                   " ranks; the transport has " + std::to_string(all.size())));
    if (h.config != all[0].config)
      disagree("the routing config (fingerprint)", 0, all[0].config, r, h.config);
    if (h.options != all[0].options)
      disagree("the ep::options (fingerprint)", 0, all[0].options, r, h.options);
    if (h.placement != all[0].placement)
      disagree("the placement (fingerprint)", 0, all[0].placement, r, h.placement);
    if (h.hidden != all[0].hidden)
      disagree("the hidden size", 0, static_cast<std::uint64_t>(all[0].hidden), r,
               static_cast<std::uint64_t>(h.hidden));
    if (h.element_bytes != all[0].element_bytes)
      disagree("the element size", 0, static_cast<std::uint64_t>(all[0].element_bytes), r,
               static_cast<std::uint64_t>(h.element_bytes));
  }
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r].local.code != 0)
      throw error(status::make(
          static_cast<status_code>(all[r].local.code),
          "moeroute::ep::make_plan: rank " + std::to_string(r) + ": " + all[r].local.message));
}

/// Per-rank counts record: a fixed prefix, then [ET] rows per expert, then [k, E] requests.
enum : std::int64_t { rec_tokens, rec_capacity, rec_fallback_capacity, rec_dropped, rec_prefix };

/// Recounts a decision's per-expert and total counters after the plan dropped assignments.
inline void recount(reference::dispatch_output& d, const std::vector<std::int32_t>& ids) {
  std::fill(d.kept.begin(), d.kept.end(), 0);
  std::fill(d.dropped.begin(), d.dropped.end(), 0);
  std::fill(d.load.begin(), d.load.end(), 0);
  d.total_kept = d.total_dropped = 0;
  for (std::int64_t a = 0; a < d.tokens * d.k; ++a) {
    if (d.fates[a] == fate::kept) {
      ++d.kept[ids[a]];
      ++d.load[ids[a]];
      ++d.total_kept;
    } else if (d.fates[a] == fate::dropped) {
      ++d.dropped[ids[a]];
      ++d.total_dropped;
    }
  }
}

/// Global scope: the config's capacity over the concatenated batch, in the priority order
/// (choice,) source rank, token — decided from the all-gathered [R, k, E] requests. Fills
/// rows[s][e] for every rank and applies this rank's drops and global slots to `d`.
inline std::int64_t decide_global(const routing_config& cfg, std::int32_t me,
                                  const std::vector<std::int64_t>& rec, std::int64_t stride,
                                  std::int64_t ET, reference::dispatch_output& d,
                                  std::vector<std::int64_t>& rows) {
  const std::int32_t R = static_cast<std::int32_t>(rows.size() / ET);
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;
  const auto req = [&](std::int32_t s, std::int32_t j, std::int32_t e) {
    return rec[s * stride + rec_prefix + ET + static_cast<std::int64_t>(j) * E + e];
  };
  std::int64_t T = 0, max_load = 0;
  for (std::int32_t s = 0; s < R; ++s) T += rec[s * stride + rec_tokens];
  std::vector<std::int64_t> load(E, 0);
  for (std::int32_t s = 0; s < R; ++s)
    for (std::int32_t j = 0; j < k; ++j)
      for (std::int32_t e = 0; e < E; ++e) load[e] += req(s, j, e);
  for (auto v : load) max_load = std::max(max_load, v);
  const std::int64_t C = expert_capacity(cfg, T, max_load);
  const std::int64_t cap = C < 0 ? std::numeric_limits<std::int64_t>::max() : C;

  // quota[s][j][e]: how many of rank s's choice-j requests to e expert e keeps, and before[...]
  // how many kept assignments precede that group in the priority order.
  const bool choice_major = cfg.dispatch.prio == priority::choice_major;
  std::vector<std::int64_t> quota(static_cast<std::size_t>(R) * k * E, 0), before(quota.size(), 0);
  const auto at = [&](std::int32_t s, std::int32_t j, std::int32_t e) {
    return (static_cast<std::size_t>(s) * k + j) * E + e;
  };
  for (std::int32_t e = 0; e < E; ++e) {
    std::int64_t used = 0;
    const auto grant = [&](std::int32_t s, std::int32_t j) {
      const std::int64_t q = std::min(req(s, j, e), cap - used);
      before[at(s, j, e)] = used;
      quota[at(s, j, e)] = q;
      used += q;
    };
    if (choice_major) {
      for (std::int32_t j = 0; j < k; ++j)
        for (std::int32_t s = 0; s < R; ++s) grant(s, j);
    } else {
      // token_major: a rank's requests to e form one group in token order, whatever j.
      for (std::int32_t s = 0; s < R; ++s) {
        std::int64_t n = 0;
        for (std::int32_t j = 0; j < k; ++j) n += req(s, j, e);
        const std::int64_t q = std::min(n, cap - used);
        before[at(s, 0, e)] = used;
        quota[at(s, 0, e)] = q;
        used += q;
      }
    }
  }
  for (std::int32_t s = 0; s < R; ++s)
    for (std::int32_t e = 0; e < E; ++e) {
      std::int64_t n = 0;
      for (std::int32_t j = 0; j < k; ++j) n += quota[at(s, j, e)];
      rows[s * ET + e] = n;
    }

  // This rank's assignments, visited in the priority order.
  std::vector<std::int64_t> taken(static_cast<std::size_t>(k) * E, 0);
  const auto visit = [&](std::int64_t t, std::int32_t j) {
    const std::int64_t a = t * k + j;
    if (d.fates[a] == fate::masked) return;
    const std::int32_t e = d.expert[a];
    const std::int32_t g = choice_major ? j : 0;
    std::int64_t& n = taken[static_cast<std::size_t>(g) * E + e];
    if (n < quota[at(me, g, e)]) {
      d.fates[a] = fate::kept;
      d.slot[a] = static_cast<std::int32_t>(before[at(me, g, e)] + n);
      ++n;
    } else {
      d.fates[a] = fate::dropped;
      d.expert[a] = -1;
      d.slot[a] = -1;
    }
  };
  std::vector<std::int32_t> ids(d.expert);
  if (choice_major) {
    for (std::int32_t j = 0; j < k; ++j)
      for (std::int64_t t = 0; t < d.tokens; ++t) visit(t, j);
  } else {
    for (std::int64_t t = 0; t < d.tokens; ++t)
      for (std::int32_t j = 0; j < k; ++j) visit(t, j);
  }
  // Slots numbered by token: the kept rows of lower ranks, then this rank's by token.
  if (cfg.dispatch.slots == slot_order::token_index) {
    std::vector<std::int64_t> next(E, 0);
    for (std::int32_t s = 0; s < me; ++s)
      for (std::int32_t e = 0; e < E; ++e) next[e] += rows[s * ET + e];
    for (std::int64_t a = 0; a < d.tokens * k; ++a)
      if (d.fates[a] == fate::kept) d.slot[a] = static_cast<std::int32_t>(next[d.expert[a]]++);
  }
  d.capacity = C;
  recount(d, ids);
  return C;
}

/// Destination budget: rank r keeps its first receive_budget rows in (source rank, segment,
/// token) order. Rows per (source, expert) are all-gathered, so every rank computes every
/// quota; this rank drops the tail of its own rows. Returns the true pre-drop counts.
inline std::vector<std::int64_t> decide_budget(const placement& place, const options& opt,
                                               std::int32_t me, std::int64_t ET,
                                               reference::dispatch_output& d,
                                               std::vector<std::int64_t>& rows) {
  const std::int32_t R = place.ranks();
  std::vector<std::int64_t> required(R, 0);
  for (std::int32_t s = 0; s < R; ++s)
    for (std::int64_t e = 0; e < ET; ++e)
      required[destination(place, s, {static_cast<std::int32_t>(e)})] += rows[s * ET + e];
  for (std::int32_t r = 0; r < R; ++r)
    if (required[r] > opt.receive_budget && opt.overflow == overflow_policy::error)
      throw error(status::make(
          status_code::invalid_argument,
          "moeroute::ep::make_plan: rank " + std::to_string(r) + " would receive " +
              std::to_string(required[r]) +
              " rows, over options.receive_budget = " + std::to_string(opt.receive_budget) +
              " (overflow_policy::drop_tail keeps the first rows)"));
  std::vector<std::int64_t> quota(rows.size(), 0);
  for (std::int32_t r = 0; r < R; ++r) {
    std::int64_t left = opt.receive_budget;
    for (std::int32_t s = 0; s < R; ++s) {
      const auto own = place.experts_of(r);
      for (std::int32_t e : own) {
        const std::int64_t q = std::min(rows[s * ET + e], left);
        quota[s * ET + e] = q;
        left -= q;
      }
    }
  }
  std::vector<std::int32_t> ids(d.expert);
  std::vector<std::int64_t> taken(ET, 0);
  const std::int32_t k = d.k;
  for (std::int64_t t = 0; t < d.tokens; ++t)
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      if (d.fates[a] != fate::kept) continue;
      const std::int32_t e = d.expert[a];
      if (taken[e] < quota[me * ET + e]) {
        ++taken[e];
      } else {
        d.fates[a] = fate::dropped;
        d.expert[a] = -1;
        d.slot[a] = -1;
      }
    }
  rows = quota;
  recount(d, ids);
  return required;
}

}  // namespace detail

namespace detail {
/// One rank's counts record (what make_plan all-gathers): a fixed prefix, the rows per
/// expert [ET] and, for the global scope, the requests [k, E].
inline std::vector<std::int64_t> count_record(const routing_config& cfg, const options& opt,
                                              const local_dispatch_output& L) {
  const bool global = opt.scope == capacity_scope::global;
  const std::int64_t ET = cfg.total_experts();
  const std::int64_t stride =
      rec_prefix + ET + (global ? std::int64_t{cfg.top_k} * cfg.num_experts : 0);
  std::vector<std::int64_t> mine(stride, 0);
  mine[rec_tokens] = L.decision.tokens;
  mine[rec_capacity] = L.decision.capacity;
  mine[rec_fallback_capacity] = L.decision.fallback_capacity;
  mine[rec_dropped] = L.decision.total_dropped;
  std::copy(L.rows_per_expert.begin(), L.rows_per_expert.end(), mine.begin() + rec_prefix);
  if (global) std::copy(L.requests.begin(), L.requests.end(), mine.begin() + rec_prefix + ET);
  return mine;
}

/// The plan of rank `me` from every rank's record, [R, stride]: pure arithmetic, the same on
/// every rank for the group counts.
inline plan plan_from_records(const routing_config& cfg, const placement& place, const options& opt,
                              const local_dispatch_output& L, const std::vector<std::int64_t>& rec,
                              std::int32_t me, std::int64_t hidden, std::size_t element_bytes) {
  const std::int32_t R = place.ranks();
  plan p;
  p.rank = me;
  p.ranks = R;
  p.cfg = cfg;
  p.opt = opt;
  p.hidden = hidden;
  p.element_bytes = element_bytes;
  p.decision = L.decision;
  p.tokens = L.decision.tokens;
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;
  const std::int64_t ET = cfg.total_experts();

  const bool global = opt.scope == capacity_scope::global;
  const std::int64_t stride = static_cast<std::int64_t>(rec.size()) / R;
  std::vector<std::int64_t> rows(static_cast<std::size_t>(R) * ET);  // [R, ET] after drops
  for (std::int32_t s = 0; s < R; ++s)
    std::copy_n(rec.begin() + s * stride + detail::rec_prefix, ET, rows.begin() + s * ET);
  p.global_tokens = 0;
  for (std::int32_t s = 0; s < R; ++s) p.global_tokens += rec[s * stride + detail::rec_tokens];
  p.capacity = opt.scope == capacity_scope::per_source ? L.decision.capacity : unbounded_capacity;
  p.required_rows.assign(R, 0);
  if (global) {
    p.capacity = detail::decide_global(cfg, me, rec, stride, ET, p.decision, rows);
  } else if (opt.scope == capacity_scope::destination_budget) {
    p.required_rows = detail::decide_budget(place, opt, me, ET, p.decision, rows);
  }
  if (global || opt.scope == capacity_scope::destination_budget)
    reference::detail::apply_combine_weights(cfg, L.gates, p.decision);
  if (opt.scope != capacity_scope::destination_budget)
    for (std::int32_t s = 0; s < R; ++s)
      for (std::int64_t e = 0; e < ET; ++e)
        p.required_rows[destination(place, s, {static_cast<std::int32_t>(e)})] += rows[s * ET + e];
  p.dropped_by_rank.assign(R, 0);
  for (std::int32_t s = 0; s < R; ++s) {
    if (global || opt.scope == capacity_scope::destination_budget) {
      // every rank derives every source's drops from the quotas: requests minus rows kept (the
      // requests are the [k, E] record for global, the dropless rows for the budget)
      const auto first = rec.begin() + s * stride + detail::rec_prefix + (global ? ET : 0);
      const std::int64_t req =
          std::accumulate(first, first + (global ? std::int64_t{k} * E : ET), std::int64_t{0});
      const std::int64_t kept =
          std::accumulate(rows.begin() + s * ET, rows.begin() + (s + 1) * ET, std::int64_t{0});
      p.dropped_by_rank[s] = req - kept;
    } else {
      p.dropped_by_rank[s] = rec[s * stride + detail::rec_dropped];
    }
  }

  // Group counts.
  p.source_expert_rows = rows;
  p.send_matrix.assign(static_cast<std::size_t>(R) * R, 0);
  p.expert_rows.assign(E, 0);
  for (std::int32_t s = 0; s < R; ++s)
    for (std::int64_t e = 0; e < ET; ++e) {
      const std::int32_t dst = destination(place, s, {static_cast<std::int32_t>(e)});
      p.send_matrix[s * R + dst] += rows[s * ET + e];
      if (e < E) p.expert_rows[e] += rows[s * ET + e];
    }

  // Segments of every rank r: its experts in local order, then the dedicated fallback.
  const bool shared = cfg.has_dedicated_fallback();
  const auto segments_of = [&](std::int32_t r) {
    std::vector<std::int32_t> g(place.experts_of(r).begin(), place.experts_of(r).end());
    if (shared) g.push_back(E);
    return g;
  };

  // Source side: rows by (destination, segment, token); a token's reroute onto an expert it
  // already holds shares the row (as in one device's layout).
  const auto& d = p.decision;
  std::vector<std::vector<std::int32_t>> tokens_of(ET);  // [ET] tokens holding a row, in order
  for (std::int64_t tk = 0; tk < d.tokens; ++tk)
    for (std::int32_t j = 0; j < k; ++j) {
      if (detail::first_of_row(d, tk, j))
        tokens_of[d.expert[tk * k + j]].push_back(static_cast<std::int32_t>(tk));
    }
  p.send_rows.assign(R, 0);
  p.send_offsets.assign(R + 1, 0);
  std::vector<std::int64_t> first_row(ET, 0);
  for (std::int32_t r = 0; r < R; ++r) {
    // rank r's segments; the fallback segment only on this rank (shared rows stay home)
    std::vector<std::int32_t> segs = segments_of(r);
    if (shared && r != me) segs.pop_back();
    for (std::int32_t e : segs) {
      first_row[e] = static_cast<std::int64_t>(p.send_token.size());
      p.send_token.insert(p.send_token.end(), tokens_of[e].begin(), tokens_of[e].end());
      if (!tokens_of[e].empty())  // the block r lists for this rank and segment: paired
        p.send_blocks.push_back({r, first_row[e], static_cast<std::int64_t>(tokens_of[e].size())});
    }
    p.send_offsets[r + 1] = static_cast<std::int64_t>(p.send_token.size());
    p.send_rows[r] = p.send_offsets[r + 1] - p.send_offsets[r];
  }
  p.assignment_row.assign(d.tokens * k, -1);
  {
    std::vector<std::int64_t> next(first_row);
    for (std::int32_t e = 0; e < ET; ++e) {
      for (std::int32_t tk : tokens_of[e]) {
        const std::int64_t row = next[e]++;
        for (std::int32_t j = 0; j < k; ++j)
          if (d.expert[std::int64_t{tk} * k + j] == e)
            p.assignment_row[std::int64_t{tk} * k + j] = row;
      }
    }
  }

  // Receive side.
  p.segment_expert = segments_of(me);
  const std::int32_t S = p.segments();
  p.segment_from.assign(static_cast<std::size_t>(R) * S, 0);
  for (std::int32_t s = 0; s < R; ++s)
    for (std::int32_t l = 0; l < S; ++l) {
      const std::int32_t e = p.segment_expert[l];
      p.segment_from[s * S + l] = e == E ? (s == me ? rows[s * ET + e] : 0) : rows[s * ET + e];
    }
  p.segment_used.assign(S, 0);
  for (std::int32_t l = 0; l < S; ++l)
    for (std::int32_t s = 0; s < R; ++s) p.segment_used[l] += p.segment_from[s * S + l];
  if (opt.receive_layout == layout_kind::padded) {
    std::int64_t bound = 0;
    switch (opt.scope) {
      case capacity_scope::global:
        bound = p.capacity;
        break;
      case capacity_scope::per_source:
        for (std::int32_t s = 0; s < R; ++s) bound += rec[s * stride + detail::rec_capacity];
        if (L.decision.capacity < 0) bound = -1;
        break;
      case capacity_scope::dropless_worst_case:
        bound = std::int64_t{R} * opt.worst_case_tokens;
        break;
      case capacity_scope::destination_budget:
        bound = opt.receive_budget;
        break;
      case capacity_scope::dropless:
        bound = -1;
        break;
    }
    if (bound < 0) {  // no declared bound: the busiest segment anywhere (equal on every rank)
      bound = 0;
      for (std::int32_t e = 0; e < E; ++e) bound = std::max(bound, p.expert_rows[e]);
      if (shared)
        for (std::int32_t s = 0; s < R; ++s) bound = std::max(bound, rows[s * ET + E]);
    }
    for (std::int32_t l = 0; l < S; ++l) bound = std::max(bound, p.segment_used[l]);
    p.segment_rows = bound;
  }
  p.segment_offsets.assign(S + 1, 0);
  for (std::int32_t l = 0; l < S; ++l) {
    const std::int64_t b = opt.block_size;
    const std::int64_t seg = opt.receive_layout == layout_kind::padded
                                 ? p.segment_rows
                                 : (p.segment_used[l] + b - 1) / b * b;
    p.segment_offsets[l + 1] = p.segment_offsets[l] + seg;
  }
  p.receive_rows = p.segment_offsets.back();
  p.recv_rows.assign(R, 0);
  p.recv_offsets.assign(R + 1, 0);
  for (std::int32_t s = 0; s < R; ++s) {
    for (std::int32_t l = 0; l < S; ++l) p.recv_rows[s] += p.segment_from[s * S + l];
    p.recv_offsets[s + 1] = p.recv_offsets[s] + p.recv_rows[s];
  }
  {
    std::vector<std::int64_t> next(p.segment_offsets.begin(), p.segment_offsets.end() - 1);
    for (std::int32_t s = 0; s < R; ++s)
      for (std::int32_t l = 0; l < S; ++l) {
        const std::int64_t n_rows = p.segment_from[s * S + l];
        if (n_rows > 0) p.receive_blocks.push_back({s, next[l], n_rows});
        next[l] += n_rows;
      }
  }
  for (const auto& b : p.send_blocks)
    if (b.peer != me) p.peer_send_blocks.push_back(b);
  for (const auto& b : p.receive_blocks)
    if (b.peer != me) p.peer_receive_blocks.push_back(b);
  return p;
}
}  // namespace detail

/// @brief Phase 2: the plan. Collective — every rank calls it, also ranks with T = 0.
/// @param t             the group (its ranks() must equal place.ranks())
/// @param cfg, place, opt  equal on every rank (validation mode checks fingerprints)
/// @param L             this rank's ep::local_dispatch
/// @param hidden        d of the rows dispatch will move
/// @param element_bytes sizeof the row element (2 for f16/bf16, 4 for f32, 8 for double)
/// @return the plan. Bad input on any rank, or ranks that disagree, throw moeroute::error on
///         every rank (validation mode; without it only the rank that sees the problem throws).
/// @note One all-gather of a fixed header (validation mode) and one of the counts; no other
///       communication. Deterministic: the same inputs give the same plan on every run.
[[nodiscard]] inline plan make_plan(transport& t, const routing_config& cfg, const placement& place,
                                    const options& opt, const local_dispatch_output& L,
                                    std::int64_t hidden, std::size_t element_bytes) {
  const std::int32_t R = t.ranks(), me = t.rank();
  status local = L.error;
  if (local && (L.rank != me || L.ranks != R))
    local = status::make(status_code::invalid_argument,
                         "local_dispatch_output is for rank " + std::to_string(L.rank) + " of " +
                             std::to_string(L.ranks) + "; this is rank " + std::to_string(me) +
                             " of " + std::to_string(R));
  if (local && (hidden < 0 || hidden > max_hidden))
    local =
        status::make(status_code::invalid_shape,
                     moeroute::detail::field_msg("hidden", hidden, "must be in [0, max_hidden]"));
  if (local && element_bytes != 2 && element_bytes != 4 && element_bytes != 8)
    local = status::make(
        status_code::invalid_argument,
        moeroute::detail::field_msg("element_bytes", element_bytes, "must be 2, 4 or 8"));
  if (local && place.ranks() != R)
    local = status::make(status_code::invalid_argument,
                         "placement.ranks() = " + std::to_string(place.ranks()) +
                             " but the transport has " + std::to_string(R) + " ranks");
  if (opt.check_ranks) {
    detail::plan_header h;
    h.config = detail::fingerprint(cfg);
    h.options = detail::fingerprint(opt);
    h.placement = place.fingerprint();
    h.ranks = place.ranks();
    h.hidden = hidden;
    h.element_bytes = static_cast<std::int64_t>(element_bytes);
    h.local = detail::to_record(local);
    detail::check_header(t, h);
  } else {
    throw_if_error(local);
  }

  std::vector<std::int64_t> mine = detail::count_record(cfg, opt, L);
  std::vector<std::int64_t> rec(static_cast<std::size_t>(R) * mine.size());
  t.allgather(mine.data(), rec.data(), mine.size() * sizeof(std::int64_t));
  return detail::plan_from_records(cfg, place, opt, L, rec, me, hidden, element_bytes);
}

/// @brief The plan rank `rank` would get, computed in one process from every rank's layout
///        (layouts[r] = ep::local_dispatch for rank r): no communication. The group counts (send
///        matrix, expert rows, drops, hotspot) are every rank's. What the capacity tool uses
///        to simulate a cluster of any size. Throws the first rank's layout error.
[[nodiscard]] inline plan simulate_plan(const routing_config& cfg, const placement& place,
                                        const options& opt,
                                        std::span<const local_dispatch_output> layouts,
                                        std::int32_t rank, std::int64_t hidden = 0,
                                        std::size_t element_bytes = 4) {
  if (static_cast<std::int64_t>(layouts.size()) != place.ranks())
    throw error(status::make(status_code::invalid_argument,
                             "simulate_plan: " + std::to_string(layouts.size()) +
                                 " layouts for a placement of " + std::to_string(place.ranks()) +
                                 " ranks"));
  std::vector<std::int64_t> rec;
  for (std::size_t r = 0; r < layouts.size(); ++r) {
    if (!layouts[r].error)
      throw error(status::make(layouts[r].error.code, "simulate_plan: rank " + std::to_string(r) +
                                                          ": " + layouts[r].error.message));
    const auto one = detail::count_record(cfg, opt, layouts[r]);
    rec.insert(rec.end(), one.begin(), one.end());
  }
  return detail::plan_from_records(cfg, place, opt, layouts[static_cast<std::size_t>(rank)], rec,
                                   rank, hidden, element_bytes);
}

/// @brief Bytes of host workspace dispatch, combine and the backward passes need with plan p:
///        the rows this rank sends, in send order, and their provenance records (rows arrive
///        straight in the receive layout).
[[nodiscard]] inline std::size_t workspace_bytes(const plan& p) {
  const auto rows = static_cast<std::size_t>(p.send_total());
  const std::size_t row_bytes = static_cast<std::size_t>(p.hidden) * p.element_bytes;
  const auto up = [](std::size_t n) { return (n + 255) / 256 * 256; };
  return up(rows * row_bytes) + up(rows * sizeof(row_source));
}

}  // namespace moeroute::ep
