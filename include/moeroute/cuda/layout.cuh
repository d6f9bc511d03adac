// SPDX-License-Identifier: Apache-2.0
// Launcher: expert-buffer layouts on the GPU (the CUDA twin of reference::layout), built from
// what cuda::dispatch wrote.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/dispatch_workspace.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/kernels/layout.cuh>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

/// @brief Inputs and outputs of cuda::layout.
/// @note The row count depends on device data (C under max_load, the loads), so the caller
///       sizes the row buffers for an upper bound `max_rows` (layout_max_rows) and the launcher
///       writes the actual count to *out.d_num_rows. Rows in [num_rows, max_rows) are padding.
struct layout_params {
  layout_kind kind = layout_kind::padded;
  std::int64_t block_size = 1;  ///< compact: segment alignment (>= 1); padded: must be 1
  std::int64_t tokens = 0;      ///< T
  std::int64_t max_rows = 0;    ///< rows of out.d_row_token (and of the expert buffer)
  /// From cuda::dispatch: d_expert, d_slot [T, k], d_load [total_experts], d_totals [1].
  const_dispatch_result dispatched{};
  /// Outputs: d_offsets [total_experts + 1]; d_rows_used [total_experts] (optional);
  /// d_row_token [max_rows] (-1 = padding); d_assignment_row [T, k] (-1 = none);
  /// d_block_expert [max_rows / block_size] (compact only, optional; -1 past num_rows);
  /// d_num_rows [1].
  layout_result out{};
};

/// @brief Checks shapes and pointers against `cfg`, including that max_rows covers the bound.
[[nodiscard]] inline status validate(const routing_config& cfg, const layout_params& p) {
  auto bad = [](status_code c, std::string m) { return status::make(c, std::move(m)); };
  if (auto s = detail::validate_extents(cfg, p.tokens); !s) return s;
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
  const std::int64_t bound = layout_max_rows(cfg, p.tokens, p.kind, p.block_size);
  if (p.max_rows < bound)
    return bad(status_code::invalid_shape, "max_rows = " + std::to_string(p.max_rows) +
                                               ": below the layout bound " + std::to_string(bound));
  if (p.tokens == 0) return status::success();
  if (p.max_rows > 0)
    if (auto s = detail::require_pointers("with max_rows > 0",
                                          detail::required(p.out.d_row_token, "out.d_row_token"));
        !s)
      return s;
  return detail::require_pointers("with tokens > 0",
                                  detail::required(p.dispatched.d_expert, "dispatched.d_expert"),
                                  detail::required(p.dispatched.d_slot, "dispatched.d_slot"),
                                  detail::required(p.dispatched.d_load, "dispatched.d_load"),
                                  detail::required(p.dispatched.d_totals, "dispatched.d_totals"),
                                  detail::required(p.out.d_offsets, "out.d_offsets"),
                                  detail::required(p.out.d_assignment_row, "out.d_assignment_row"),
                                  detail::required(p.out.d_num_rows, "out.d_num_rows"));
}

/// @brief Builds the padded or compact layout from cuda::dispatch's outputs.
/// @param cfg the config cuda::dispatch ran with; p: see layout_params; stream last.
/// @return success, invalid_* or cuda_error. No workspace.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0 returns
///       success and writes nothing. Writes every row of d_row_token (padding -1) and, when
///       given, every entry of d_block_expert (-1 past num_rows).
[[nodiscard]] inline status layout(const routing_config& cfg, const layout_params& p,
                                   cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  constexpr int threads = 256;
  const std::int32_t E = cfg.num_experts, ET = cfg.total_experts();
  const bool compact = p.kind == layout_kind::compact;
  if (auto s = launch("layout_offsets_kernel", kernels::layout_offsets_kernel<threads>,
                      {1, threads, 0}, stream, compact, p.block_size, E, ET,
                      cfg.capacity_groups(p.tokens), p.dispatched, p.out);
      !s)
    return s;
  if (p.max_rows > 0)
    if (auto s = launch("layout_clear_rows_kernel", kernels::layout_clear_rows_kernel<threads>,
                        {grid_for(p.max_rows, threads), threads, 0}, stream, p.max_rows,
                        p.out.d_row_token);
        !s)
      return s;
  const std::int64_t n = p.tokens * cfg.top_k;
  if (auto s =
          launch("layout_rows_kernel", kernels::layout_rows_kernel<threads>,
                 {grid_for(n, threads), threads, 0}, stream, n, cfg.top_k, p.dispatched, p.out);
      !s)
    return s;
  const std::int64_t blocks = p.max_rows / p.block_size;
  if (compact && p.out.d_block_expert && blocks > 0)
    return launch("layout_block_expert_kernel", kernels::layout_block_expert_kernel<threads>,
                  {grid_for(blocks, threads), threads, 0}, stream, blocks, p.block_size, ET, p.out);
  return status::success();
}

}  // namespace moeroute::cuda
