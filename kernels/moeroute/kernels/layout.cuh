// SPDX-License-Identifier: Apache-2.0
// Expert-buffer layout kernels: segment offsets (padded or compact, a block-wide scan), the
// row of every assignment, the token of every row and the expert of every compact block.
#pragma once

#include <cstdint>

#include <cub/block/block_scan.cuh>

#include <moeroute/types.hpp>

namespace moeroute::kernels {

/// One block. Padded: offsets[e] = e * C * Q for routed experts (C per capacity group, Q
/// groups), then the dedicated fallback segment (its capacity, or its load when unbounded).
/// Compact: exclusive scan of each load rounded up to block_size. Writes offsets [ET + 1],
/// rows_used [ET] and *num_rows.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    layout_offsets_kernel(bool compact, std::int64_t block_size, std::int32_t experts,
                          std::int32_t total_experts, std::int64_t capacity_groups,
                          const const_dispatch_result in, const layout_result out) {
  using scan = cub::BlockScan<std::int64_t, Threads>;
  __shared__ typename scan::TempStorage tmp;
  __shared__ std::int64_t s_carry;
  if (threadIdx.x == 0) s_carry = 0;
  __syncthreads();
  const std::int64_t C = in.d_totals->capacity;
  const std::int64_t fb = in.d_totals->fallback_capacity;
  for (std::int32_t base = 0; base < total_experts; base += Threads) {
    const std::int32_t e = base + static_cast<std::int32_t>(threadIdx.x);
    std::int64_t seg = 0;
    if (e < total_experts) {
      const std::int64_t load = in.d_load[e];
      if (out.d_rows_used) out.d_rows_used[e] = load;
      if (compact) {
        seg = (load + block_size - 1) / block_size * block_size;
      } else {
        seg = e < experts ? C * capacity_groups : (fb < 0 ? load : fb * capacity_groups);
      }
    }
    std::int64_t offset = 0, total = 0;
    scan(tmp).ExclusiveSum(seg, offset, total);
    const std::int64_t carry = s_carry;
    if (e < total_experts) out.d_offsets[e] = carry + offset;
    __syncthreads();  // everyone has read s_carry and tmp
    if (threadIdx.x == 0) s_carry = carry + total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out.d_offsets[total_experts] = s_carry;
    *out.d_num_rows = s_carry;
  }
}

/// row_token[r] = -1 for every row of the caller's buffer.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    layout_clear_rows_kernel(std::int64_t max_rows, std::int32_t* __restrict__ d_row_token) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       r < max_rows; r += stride)
    d_row_token[r] = -1;
}

/// assignment_row[a] = offsets[expert] + slot (-1 if none); row_token[row] = token. Shared
/// slots write the same row with the same token, so the result does not depend on order.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    layout_rows_kernel(std::int64_t n, std::int32_t k, const const_dispatch_result in,
                       const layout_result out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t a = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; a < n;
       a += stride) {
    const std::int32_t e = in.d_expert[a];
    std::int64_t row = -1;
    if (e >= 0) {
      row = out.d_offsets[e] + in.d_slot[a];
      out.d_row_token[row] = static_cast<std::int32_t>(a / k);
    }
    out.d_assignment_row[a] = row;
  }
}

/// block_expert[b] = expert whose segment holds row b * block_size; -1 past num_rows.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    layout_block_expert_kernel(std::int64_t num_blocks, std::int64_t block_size,
                               std::int32_t total_experts, const layout_result out) {
  const std::int64_t rows = *out.d_num_rows;
  const std::int64_t* d_offsets = out.d_offsets;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < num_blocks; b += stride) {
    const std::int64_t x = b * block_size;
    std::int32_t e = -1;
    if (x < rows) {
      // last e with offsets[e] <= x (empty segments share their offset with the next one)
      std::int32_t lo = 0, hi = total_experts + 1;  // upper_bound over offsets[0..ET]
      while (lo < hi) {
        const std::int32_t mid = lo + (hi - lo) / 2;
        if (d_offsets[mid] <= x) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      e = lo - 1;
    }
    out.d_block_expert[b] = e;
  }
}

}  // namespace moeroute::kernels
