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
#include <moeroute/params/layout.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

using moeroute::layout_params;

/// @brief Checks config, shapes and pointers; names the first bad field.
[[nodiscard]] inline status validate(const routing_config& cfg, const layout_params& p) {
  return check_params(cfg, p);
}

/// @brief Builds the padded or compact layout from cuda::dispatch's outputs.
/// @param cfg the config cuda::dispatch ran with; p: see layout_params; stream last.
/// @return success, invalid_* or cuda_error. No workspace.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0 returns
///       success and writes nothing. Writes every row of d_row_token (padding -1) and, when
///       given, every entry of d_block_expert (-1 past num_rows). A local-expert view
///       (d_expert_map) is device data the launcher cannot check: a map with an entry outside
///       [-1, local_experts) or a local index held twice or by nobody gives an empty layout
///       (*d_num_rows 0, every held assignment counted in *d_nonlocal) where the host backends
///       return invalid_argument.
[[nodiscard]] inline status layout(const routing_config& cfg, const layout_params& p,
                                   cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  constexpr int threads = 256;
  const std::int32_t E = cfg.num_experts, ET = cfg.total_experts();
  const bool compact = p.kind == layout_kind::compact;
  const std::int32_t* map = p.d_expert_map;
  const std::int32_t segments = map != nullptr ? p.local_experts : ET;
  const std::int64_t n = p.tokens * cfg.top_k;
  const std::int64_t blocks = compact && p.out.d_block_expert ? p.max_rows / p.block_size : 0;
  if (n + p.max_rows + blocks <= kernels::layout_one_block_max_items)  // a small batch: one launch
    return launch("layout_one_block_kernel",
                  kernels::layout_one_block_kernel<kernels::layout_one_block_threads>,
                  {1, kernels::layout_one_block_threads, 0}, stream, compact, p.block_size, E, ET,
                  cfg.capacity_groups(p.tokens), map, segments, n, cfg.top_k, p.max_rows, blocks,
                  p.dispatched, p.out);
  if (auto s = launch("layout_offsets_kernel", kernels::layout_offsets_kernel<threads>,
                      {1, threads, 0}, stream, compact, p.block_size, E, ET,
                      cfg.capacity_groups(p.tokens), map, segments, p.dispatched, p.out);
      !s)
    return s;
  if (map != nullptr && p.out.d_nonlocal != nullptr)
    if (auto s = from_cuda(cudaMemsetAsync(p.out.d_nonlocal, 0, sizeof(std::int64_t), stream),
                           "cudaMemsetAsync(d_nonlocal)");
        !s)
      return s;
  if (p.max_rows > 0)
    if (auto s = launch("layout_clear_rows_kernel", kernels::layout_clear_rows_kernel<threads>,
                        {grid_for(p.max_rows, threads), threads, 0}, stream, p.max_rows,
                        p.out.d_row_token);
        !s)
      return s;
  if (auto s = launch("layout_rows_kernel", kernels::layout_rows_kernel<threads>,
                      {grid_for(n, threads), threads, 0}, stream, n, cfg.top_k, map, segments,
                      p.dispatched, p.out);
      !s)
    return s;
  if (blocks > 0)
    return launch("layout_block_expert_kernel", kernels::layout_block_expert_kernel<threads>,
                  {grid_for(blocks, threads), threads, 0}, stream, blocks, p.block_size, segments,
                  p.out);
  return status::success();
}

}  // namespace moeroute::cuda
