// SPDX-License-Identifier: Apache-2.0
// Launcher: expert-buffer layouts on the GPU (the CUDA twin of reference::padded_layout and
// reference::compact_layout), built from what cuda::dispatch wrote.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/common.cuh>
#include <moeroute/cuda/dispatch_workspace.hpp>
#include <moeroute/kernels/layout.cuh>

namespace moeroute::cuda {

enum class layout_kind : std::uint8_t {
  padded,   ///< expert e owns rows [e*C, (e+1)*C); a dedicated fallback gets its own segment
  compact,  ///< packed segments, each rounded up to a multiple of block_size
};

/// @brief Inputs and outputs of cuda::build_layout.
/// @note The row count depends on device data (C under max_load, the loads), so the caller
///       passes an upper bound `max_rows` (padded_max_rows / compact_max_rows) and the launcher
///       writes the actual count to *d_num_rows. Rows in [num_rows, max_rows) are padding.
struct layout_params {
  layout_kind kind = layout_kind::padded;
  std::int64_t block_size = 1;  ///< compact: segment alignment (>= 1); padded: must be 1
  std::int64_t tokens = 0;      ///< T
  std::int32_t k = 0;
  std::int32_t experts = 0;        ///< E routed experts
  std::int32_t total_experts = 0;  ///< E, or E + 1 with a dedicated fallback
  std::int64_t max_rows = 0;       ///< rows of d_row_token (and of the expert buffer)

  const std::int32_t* d_expert = nullptr;        ///< [T, k] int32 from cuda::dispatch
  const std::int32_t* d_slot = nullptr;          ///< [T, k] int32 from cuda::dispatch
  const std::int64_t* d_load = nullptr;          ///< [total_experts] int64 from cuda::dispatch
  const dispatch_totals* d_totals = nullptr;     ///< [1] from cuda::dispatch (capacity fields)

  std::int64_t* d_offsets = nullptr;         ///< [total_experts + 1] int64 out: first row of e
  std::int64_t* d_rows_used = nullptr;       ///< [total_experts] int64 out (optional, may be null)
  std::int32_t* d_row_token = nullptr;       ///< [max_rows] int32 out: token of each row, -1 = padding
  std::int64_t* d_assignment_row = nullptr;  ///< [T, k] int64 out: row of each assignment, -1 = none
  std::int32_t* d_block_expert = nullptr;    ///< [max_rows / block_size] int32 out (compact only;
                                             ///< optional), -1 past num_rows
  std::int64_t* d_num_rows = nullptr;        ///< [1] int64 out: rows the layout uses
};

/// @brief The max_rows a layout of `kind` needs for this config and batch (-1: unsupported).
[[nodiscard]] inline std::int64_t layout_max_rows(const routing_config& cfg, std::int64_t tokens,
                                                  layout_kind kind, std::int64_t block_size = 1) {
  return kind == layout_kind::padded ? padded_max_rows(cfg, tokens)
                                     : compact_max_rows(cfg, tokens, block_size);
}

/// @brief Checks shapes and pointers against `cfg`, including that max_rows covers the bound.
[[nodiscard]] inline status validate(const layout_params& p, const routing_config& cfg) {
  auto bad = [](status_code c, std::string m) { return status::make(c, std::move(m)); };
  if (auto s = validate(cfg); !s) return s;
  if (auto s = validate_tokens(cfg, p.tokens); !s) return s;
  if (p.k != cfg.top_k) return bad(status_code::invalid_shape, "k = " + std::to_string(p.k) + ": must equal config.top_k");
  if (p.experts != cfg.num_experts)
    return bad(status_code::invalid_shape, "experts = " + std::to_string(p.experts) + ": must equal config.num_experts");
  if (p.total_experts != cfg.total_experts())
    return bad(status_code::invalid_shape, "total_experts = " + std::to_string(p.total_experts) +
                                               ": must equal config.total_experts()");
  if (p.block_size < 1) return bad(status_code::invalid_argument, "block_size = " + std::to_string(p.block_size) + ": must be >= 1");
  if (p.kind == layout_kind::padded && p.block_size != 1)
    return bad(status_code::invalid_argument, "block_size = " + std::to_string(p.block_size) + ": padded layout takes 1");
  if (p.kind == layout_kind::padded && cfg.capacity.mode == capacity_mode::unbounded)
    return bad(status_code::unsupported,
               "padded layout needs a bounded capacity; capacity_mode::unbounded works with the compact layout");
  const std::int64_t bound = layout_max_rows(cfg, p.tokens, p.kind, p.block_size);
  if (p.max_rows < bound)
    return bad(status_code::invalid_shape, "max_rows = " + std::to_string(p.max_rows) +
                                               ": below the layout bound " + std::to_string(bound));
  if (p.tokens == 0) return status::success();
  auto null = [&](const char* what) { return bad(status_code::invalid_argument, std::string(what) + " is null with tokens > 0"); };
  if (!p.d_expert) return null("d_expert");
  if (!p.d_slot) return null("d_slot");
  if (!p.d_load) return null("d_load");
  if (!p.d_totals) return null("d_totals");
  if (!p.d_offsets) return null("d_offsets");
  if (p.max_rows > 0 && !p.d_row_token) return null("d_row_token");
  if (!p.d_assignment_row) return null("d_assignment_row");
  if (!p.d_num_rows) return null("d_num_rows");
  return status::success();
}

/// @brief Builds the padded or compact layout from cuda::dispatch's outputs.
/// @param p   see layout_params; cfg: the config cuda::dispatch ran with; stream last.
/// @return success, invalid_* or cuda_error. No workspace.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0 returns
///       success and writes nothing. Writes every row of d_row_token (padding -1) and, when
///       given, every entry of d_block_expert (-1 past num_rows).
inline status build_layout(const layout_params& p, const routing_config& cfg, cudaStream_t stream = nullptr) {
  if (auto s = validate(p, cfg); !s) return s;
  if (p.tokens == 0) return status::success();
  constexpr int threads = 256;
  const bool compact = p.kind == layout_kind::compact;
  kernels::layout_offsets_kernel<threads><<<1, threads, 0, stream>>>(
      compact, p.block_size, p.experts, p.total_experts, p.d_load, p.d_totals, p.d_offsets, p.d_rows_used,
      p.d_num_rows);
  if (auto s = last_launch("layout_offsets_kernel"); !s) return s;
  if (p.max_rows > 0) {
    kernels::layout_clear_rows_kernel<threads><<<grid_for(p.max_rows, threads), threads, 0, stream>>>(p.max_rows, p.d_row_token);
    if (auto s = last_launch("layout_clear_rows_kernel"); !s) return s;
  }
  const std::int64_t n = p.tokens * p.k;
  kernels::layout_rows_kernel<threads><<<grid_for(n, threads), threads, 0, stream>>>(n, p.k, p.d_expert, p.d_slot, p.d_offsets,
                                                                            p.d_assignment_row, p.d_row_token);
  if (auto s = last_launch("layout_rows_kernel"); !s) return s;
  if (compact && p.d_block_expert) {
    const std::int64_t blocks = p.max_rows / p.block_size;
    if (blocks > 0) {
      kernels::layout_block_expert_kernel<threads><<<grid_for(blocks, threads), threads, 0, stream>>>(
          blocks, p.block_size, p.total_experts, p.d_offsets, p.d_num_rows, p.d_block_expert);
      if (auto s = last_launch("layout_block_expert_kernel"); !s) return s;
    }
  }
  return status::success();
}

}  // namespace moeroute::cuda
