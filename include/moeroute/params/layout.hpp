// SPDX-License-Identifier: Apache-2.0
// Parameters of the layout stage (expert-buffer rows from a dispatch),
// shared by every backend: cpu::layout and cuda::layout take the same struct and start their
// validate() with the same check_params(). Pointers are named d_ (data) in both: device
// memory for the CUDA backend, host memory for the CPU backend. Plain C++.
#pragma once

#include <cstdint>
#include <string>

#include <moeroute/config.hpp>
#include <moeroute/layout_rows.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// @brief Inputs and outputs of layout.
/// @note The row count depends on device data (C under max_load, the loads), so the caller
///       sizes the row buffers for an upper bound `max_rows` (layout_max_rows) and the launcher
///       writes the actual count to *out.d_num_rows. Rows in [num_rows, max_rows) are padding.
struct layout_params {
  layout_kind kind = layout_kind::padded;
  std::int64_t block_size = 1;  ///< compact: segment alignment (>= 1); padded: must be 1
  std::int64_t tokens = 0;      ///< T
  std::int64_t max_rows = 0;    ///< rows of out.d_row_token (and of the expert buffer)
  /// From dispatch: d_expert, d_slot [T, k], d_load [total_experts], d_totals [1].
  const_dispatch_result dispatched{};
  /// Local-expert view (an engine running its own expert-parallel exchange; vLLM's expert_map),
  /// compact layout only: d_expert_map [total_experts] int32 holds the local index in
  /// [0, local_experts) of each expert held here and -1 for the others, each local index
  /// once. The layout then has local_experts segments in local index order (offsets,
  /// rows_used and block_expert by local index); assignments at other experts get row -1 and
  /// are counted in *out.d_nonlocal. Null (and local_experts 0): every expert, in order.
  const std::int32_t* d_expert_map = nullptr;
  std::int32_t local_experts = 0;  ///< L (with d_expert_map)
  /// Outputs: d_offsets [total_experts + 1]; d_rows_used [total_experts] (optional);
  /// d_row_token [max_rows] (-1 = padding); d_assignment_row [T, k] (-1 = none);
  /// d_block_expert [max_rows / block_size] (compact only, optional; -1 past num_rows);
  /// d_num_rows [1].
  layout_result out{};
};

/// @brief Checks shapes and pointers against `cfg`, including that max_rows covers the bound. Every
/// backend's validate() runs this first.
[[nodiscard]] inline status check_params(const routing_config& cfg, const layout_params& p) {
  auto bad = [](status_code c, std::string m) { return status::make(c, std::move(m)); };
  if (auto s = param_checks::validate_extents(cfg, p.tokens); !s) return s;
  if (p.kind != layout_kind::padded && p.kind != layout_kind::compact)
    return bad(status_code::invalid_argument, "kind: not a layout_kind");
  if (p.block_size < 1)
    return bad(status_code::invalid_argument,
               "block_size = " + std::to_string(p.block_size) + ": must be >= 1");
  if (p.kind == layout_kind::padded && p.block_size != 1)
    return bad(status_code::invalid_argument,
               "block_size = " + std::to_string(p.block_size) + ": the padded layout takes 1");
  if (p.kind == layout_kind::padded && cfg.capacity.mode == capacity_mode::unbounded)
    return bad(status_code::unsupported,
               "padded layout needs a bounded capacity; capacity_mode::unbounded works with the "
               "compact layout");
  if (p.d_expert_map == nullptr && p.local_experts != 0)
    return bad(status_code::invalid_argument, "local_experts = " + std::to_string(p.local_experts) +
                                                  ": only read with d_expert_map; leave it 0");
  if (p.d_expert_map != nullptr) {
    if (p.kind != layout_kind::compact)
      return bad(status_code::unsupported,
                 "d_expert_map: a local-expert view is a compact layout (kind = compact)");
    if (p.local_experts < 1 || p.local_experts > cfg.total_experts())
      return bad(status_code::invalid_argument,
                 "local_experts = " + std::to_string(p.local_experts) +
                     ": must be in [1, total_experts = " + std::to_string(cfg.total_experts()) +
                     "] with d_expert_map");
  }
  const std::int64_t bound =
      p.d_expert_map != nullptr
          ? local_compact_max_rows(cfg, p.tokens, p.block_size, p.local_experts)
          : layout_max_rows(cfg, p.tokens, p.kind, p.block_size);
  if (p.max_rows < bound)
    return bad(status_code::invalid_shape, "max_rows = " + std::to_string(p.max_rows) +
                                               ": below the layout bound " + std::to_string(bound));
  if (p.tokens == 0) return status::success();
  if (p.max_rows > 0)
    if (auto s = param_checks::require_pointers(
            "with max_rows > 0", param_checks::required(p.out.d_row_token, "out.d_row_token"));
        !s)
      return s;
  return param_checks::require_pointers(
      "with tokens > 0", param_checks::required(p.dispatched.d_expert, "dispatched.d_expert"),
      param_checks::required(p.dispatched.d_slot, "dispatched.d_slot"),
      param_checks::required(p.dispatched.d_load, "dispatched.d_load"),
      param_checks::required(p.dispatched.d_totals, "dispatched.d_totals"),
      param_checks::required(p.out.d_offsets, "out.d_offsets"),
      param_checks::required(p.out.d_assignment_row, "out.d_assignment_row"),
      param_checks::required(p.out.d_num_rows, "out.d_num_rows"));
}

}  // namespace moeroute
