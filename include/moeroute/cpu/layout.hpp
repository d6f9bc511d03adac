// SPDX-License-Identifier: Apache-2.0
// CPU backend: expert-buffer layouts (padded or compact) from cpu::dispatch's outputs — the
// operation and params of cuda::layout, the results of reference::layout.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <moeroute/config.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/layout_rows.hpp>
#include <moeroute/params/layout.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cpu {

using moeroute::layout_params;

/// @brief Checks config, shapes and pointers (check_params); names the first bad field. (layout()
///        also rejects a load outside [0, T] and a slot outside its expert's segment.)
[[nodiscard]] inline status validate(const routing_config& cfg, const layout_params& p) {
  return check_params(cfg, p);
}

/// @brief Builds the padded or compact layout of a dispatch on the CPU (or the compact layout
///        of the local experts only, with p.d_expert_map).
/// @param ex accepted for the common signature; the layout runs on the calling thread (one
///           O(T k + E + max_rows) pass)
/// @return success, or invalid_* naming the field (including a slot outside its segment, and
///         an expert map entry outside [-1, L) or a local index held twice or by nobody).
/// @note Synchronous, no allocation. T = 0: success, nothing written. Writes every row of
///       out.d_row_token (padding -1) and, when given, every entry of out.d_block_expert (-1
///       past num_rows).
[[nodiscard]] inline status layout(const routing_config& cfg, const layout_params& p,
                                   [[maybe_unused]] const executor& ex = {}) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  const std::int32_t E = cfg.num_experts, ET = cfg.total_experts(), k = cfg.top_k;
  const std::int64_t Q = cfg.capacity_groups(p.tokens);
  const const_dispatch_result& in = p.dispatched;
  const layout_result& out = p.out;
  const std::int64_t C = in.d_totals->capacity, fb = in.d_totals->fallback_capacity;
  const bool compact = p.kind == layout_kind::compact;
  for (std::int32_t e = 0; e < ET; ++e)
    if (in.d_load[e] < 0 || in.d_load[e] > p.tokens)
      return status::make(status_code::invalid_argument, "dispatched.d_load[" + std::to_string(e) +
                                                             "] = " + std::to_string(in.d_load[e]) +
                                                             " is outside [0, tokens]");
  // Segments: every expert in order, or the local experts in local index order (the map's
  // inverse is built in offsets[0, L) first, then replaced by the scan in place).
  const std::int32_t* map = p.d_expert_map;
  const std::int32_t segments = map != nullptr ? p.local_experts : ET;
  if (map != nullptr) {
    std::fill(out.d_offsets, out.d_offsets + segments, std::int64_t{-1});
    for (std::int32_t e = 0; e < ET; ++e) {
      const std::int32_t l = map[e];
      if (l < -1 || l >= segments)
        return status::make(status_code::invalid_argument, "d_expert_map[" + std::to_string(e) +
                                                               "] = " + std::to_string(l) +
                                                               " is outside [-1, local_experts)");
      if (l < 0) continue;
      if (out.d_offsets[l] >= 0)
        return status::make(status_code::invalid_argument,
                            "d_expert_map[" + std::to_string(e) + "] = " + std::to_string(l) +
                                ": local index already held by expert " +
                                std::to_string(out.d_offsets[l]));
      out.d_offsets[l] = e;
    }
    for (std::int32_t l = 0; l < segments; ++l)
      if (out.d_offsets[l] < 0)
        return status::make(status_code::invalid_argument,
                            "d_expert_map: no expert has local index " + std::to_string(l) +
                                " (local_experts = " + std::to_string(segments) + ")");
  }
  std::int64_t offset = 0;
  for (std::int32_t l = 0; l < segments; ++l) {
    const std::int32_t e = map != nullptr ? static_cast<std::int32_t>(out.d_offsets[l]) : l;
    const std::int64_t load = in.d_load[e];
    if (out.d_rows_used != nullptr) out.d_rows_used[l] = load;
    out.d_offsets[l] = offset;
    if (compact) {
      offset += (load + p.block_size - 1) / p.block_size * p.block_size;
    } else {
      offset += e < E ? C * Q : (fb < 0 ? load : fb * Q);
    }
  }
  out.d_offsets[segments] = offset;
  *out.d_num_rows = offset;
  if (offset > p.max_rows)
    return status::make(status_code::invalid_argument,
                        "the layout needs " + std::to_string(offset) + " rows, max_rows = " +
                            std::to_string(p.max_rows) + ": dispatched is not of this config");
  std::fill(out.d_row_token, out.d_row_token + p.max_rows, -1);
  std::int64_t nonlocal = 0;
  // the walk's pointers as locals, and a bad entry only found here and named after the loop:
  // through `out` GCC reloaded the pointers and offsets after every store (Megatron's top-2 of
  // 64 at T = 16384: 39-47 -> 35-40 us, docs/performance.md, session 38)
  const std::int32_t* const expert_of = in.d_expert;
  const std::int32_t* const slot_of = in.d_slot;
  const std::int64_t* const offsets = out.d_offsets;
  std::int32_t* const row_token = out.d_row_token;
  std::int64_t* const assignment_row = out.d_assignment_row;
  const std::int64_t n = p.tokens * k;
  std::int64_t bad = -1;  // the first assignment outside its expert's segment or range
  for (std::int64_t a = 0, t = 0, j = 0; a < n; ++a) {  // (token t's choice j)
    const std::int32_t e = expert_of[a];
    std::int64_t row = -1;
    if (e >= ET) {
      bad = a;
      break;
    }
    const std::int32_t l = e < 0 ? -1 : (map != nullptr ? map[e] : e);
    if (e >= 0 && l < 0) ++nonlocal;  // held at an expert of another rank
    if (l >= 0) {
      const std::int64_t slot = slot_of[a];
      if (slot < 0 || slot >= offsets[l + 1] - offsets[l]) {
        bad = a;
        break;
      }
      row = offsets[l] + slot;
      row_token[row] = static_cast<std::int32_t>(t);
    }
    assignment_row[a] = row;
    if (++j == k) {
      j = 0;
      ++t;
    }
  }
  if (bad >= 0) {
    const std::int32_t e = expert_of[bad];
    return status::make(status_code::invalid_argument,
                        e >= ET ? "dispatched: assignment " + std::to_string(bad) + " has expert " +
                                      std::to_string(e) + ", outside [-1, total_experts)"
                                : "dispatched: assignment " + std::to_string(bad) + " has expert " +
                                      std::to_string(e) + ", slot " + std::to_string(slot_of[bad]) +
                                      ", outside that expert's segment");
  }
  if (map != nullptr && out.d_nonlocal != nullptr) *out.d_nonlocal = nonlocal;
  if (compact && out.d_block_expert != nullptr) {
    const std::int64_t blocks = p.max_rows / p.block_size;
    std::int32_t l = 0;
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t x = b * p.block_size;
      if (x >= offset) {
        out.d_block_expert[b] = -1;
        continue;
      }
      while (out.d_offsets[l + 1] <= x) ++l;  // last segment with offsets[l] <= x
      out.d_block_expert[b] = l;
    }
  }
  return status::success();
}

}  // namespace moeroute::cpu
