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

/// @brief Builds the padded or compact layout of a dispatch on the CPU.
/// @param ex accepted for the common signature; the layout runs on the calling thread (one
///           O(T k + E + max_rows) pass)
/// @return success, or invalid_* naming the field (including a slot outside its segment).
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
  std::int64_t offset = 0;
  for (std::int32_t e = 0; e < ET; ++e) {
    const std::int64_t load = in.d_load[e];
    if (out.d_rows_used != nullptr) out.d_rows_used[e] = load;
    out.d_offsets[e] = offset;
    if (compact) {
      offset += (load + p.block_size - 1) / p.block_size * p.block_size;
    } else {
      offset += e < E ? C * Q : (fb < 0 ? load : fb * Q);
    }
  }
  out.d_offsets[ET] = offset;
  *out.d_num_rows = offset;
  if (offset > p.max_rows)
    return status::make(status_code::invalid_argument,
                        "the layout needs " + std::to_string(offset) + " rows, max_rows = " +
                            std::to_string(p.max_rows) + ": dispatched is not of this config");
  std::fill(out.d_row_token, out.d_row_token + p.max_rows, -1);
  for (std::int64_t a = 0, t = 0; t < p.tokens; ++t)
    for (std::int32_t j = 0; j < k; ++j, ++a) {
      const std::int32_t e = in.d_expert[a];
      std::int64_t row = -1;
      if (e >= 0) {
        const std::int64_t slot = in.d_slot[a];
        if (e >= ET || slot < 0 || slot >= out.d_offsets[e + 1] - out.d_offsets[e])
          return status::make(status_code::invalid_argument,
                              "dispatched: assignment " + std::to_string(a) + " has expert " +
                                  std::to_string(e) + ", slot " + std::to_string(slot) +
                                  ", outside that expert's segment");
        row = out.d_offsets[e] + slot;
        out.d_row_token[row] = static_cast<std::int32_t>(t);
      }
      out.d_assignment_row[a] = row;
    }
  if (compact && out.d_block_expert != nullptr) {
    const std::int64_t blocks = p.max_rows / p.block_size;
    std::int32_t e = 0;
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t x = b * p.block_size;
      if (x >= offset) {
        out.d_block_expert[b] = -1;
        continue;
      }
      while (out.d_offsets[e + 1] <= x) ++e;  // last e with offsets[e] <= x
      out.d_block_expert[b] = e;
    }
  }
  return status::success();
}

}  // namespace moeroute::cpu
