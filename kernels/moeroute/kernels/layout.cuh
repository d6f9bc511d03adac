// SPDX-License-Identifier: Apache-2.0
// Expert-buffer layout kernels: segment offsets (padded or compact, a block-wide scan), the
// row of every assignment, the token of every row and the expert of every compact block.
#pragma once

#include <cstdint>

#include <cub/block/block_scan.cuh>

#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

/// One block. Padded: offsets[e] = e * C * Q for routed experts (C per capacity group, Q
/// groups), then the dedicated fallback segment (its capacity, or its load when unbounded).
/// Compact: exclusive scan of each load rounded up to block_size. Writes offsets, rows_used
/// and *num_rows over `segments` segments: every expert (map null, segments = ET), or the
/// local experts of `map` in local index order (compact only). A map the host cannot check
/// (device data) with an entry outside [-1, segments), or a local index held twice or by
/// nobody, gives an empty layout: every segment 0 rows, so every held assignment is nonlocal.
/// (layout_offsets: the body, block-wide; layout_offsets_kernel launches it.)
template <int Threads>
__device__ void layout_offsets(bool compact, std::int64_t block_size, std::int32_t experts,
                               std::int32_t total_experts, std::int64_t capacity_groups,
                               const std::int32_t* __restrict__ map, std::int32_t segments,
                               const const_dispatch_result& in, const layout_result& out) {
  using scan = cub::BlockScan<std::int64_t, Threads>;
  __shared__ typename scan::TempStorage tmp;
  __shared__ std::int64_t s_carry;
  __shared__ int s_bad;
  if (threadIdx.x == 0) {
    s_carry = 0;
    s_bad = 0;
  }
  if (map != nullptr) {
    // offsets[l] <- the expert holding local index l (the map's inverse), then the scan
    for (std::int32_t l = static_cast<std::int32_t>(threadIdx.x); l < segments; l += Threads)
      out.d_offsets[l] = -1;
    __syncthreads();
    for (std::int32_t e = static_cast<std::int32_t>(threadIdx.x); e < total_experts; e += Threads) {
      const std::int32_t l = map[e];
      if (l < -1 || l >= segments) {
        s_bad = 1;
      } else if (l >= 0 && atomicCAS(reinterpret_cast<unsigned long long*>(&out.d_offsets[l]),
                                     ~0ull, static_cast<unsigned long long>(e)) != ~0ull) {
        s_bad = 1;  // a local index held twice
      }
    }
    __syncthreads();
    for (std::int32_t l = static_cast<std::int32_t>(threadIdx.x); l < segments; l += Threads)
      if (out.d_offsets[l] < 0) s_bad = 1;  // held by nobody
  }
  __syncthreads();
  const bool bad = s_bad != 0;
  const std::int64_t C = in.d_totals->capacity;
  const std::int64_t fb = in.d_totals->fallback_capacity;
  for (std::int32_t base = 0; base < segments; base += Threads) {
    const std::int32_t l = base + static_cast<std::int32_t>(threadIdx.x);
    std::int64_t seg = 0;
    if (l < segments) {
      const std::int32_t e = map != nullptr ? static_cast<std::int32_t>(out.d_offsets[l]) : l;
      const std::int64_t load = bad ? 0 : in.d_load[e];
      if (out.d_rows_used) out.d_rows_used[l] = load;
      if (compact) {
        seg = (load + block_size - 1) / block_size * block_size;
      } else {
        seg = e < experts ? C * capacity_groups : (fb < 0 ? load : fb * capacity_groups);
      }
    }
    std::int64_t offset = 0, total = 0;
    scan(tmp).ExclusiveSum(seg, offset, total);
    const std::int64_t carry = s_carry;
    __syncthreads();  // every thread has read its expert from offsets[l] and s_carry
    if (l < segments) out.d_offsets[l] = carry + offset;
    if (threadIdx.x == 0) s_carry = carry + total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out.d_offsets[segments] = s_carry;
    *out.d_num_rows = s_carry;
  }
}

template <int Threads>
__global__ void __launch_bounds__(Threads)
    layout_offsets_kernel(bool compact, std::int64_t block_size, std::int32_t experts,
                          std::int32_t total_experts, std::int64_t capacity_groups,
                          const std::int32_t* __restrict__ map, std::int32_t segments,
                          const const_dispatch_result in, const layout_result out) {
  enter_after_prior_grid();
  layout_offsets<Threads>(compact, block_size, experts, total_experts, capacity_groups, map,
                          segments, in, out);
}

namespace layout_detail {

/// The items [first, n) with step `stride` of a grid-stride loop (the whole grid's, or one
/// block's).
struct stride_range {
  std::int64_t first, stride;
};

__device__ inline stride_range grid_range() {
  return {static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
          static_cast<std::int64_t>(gridDim.x) * blockDim.x};
}

}  // namespace layout_detail

/// row_token[r] = -1 for every row of the caller's buffer.
__device__ inline void clear_rows(layout_detail::stride_range it, std::int64_t max_rows,
                                  std::int32_t* __restrict__ d_row_token) {
  for (std::int64_t r = it.first; r < max_rows; r += it.stride) d_row_token[r] = -1;
}

template <int Threads>
__global__ void __launch_bounds__(Threads)
    layout_clear_rows_kernel(std::int64_t max_rows, std::int32_t* __restrict__ d_row_token) {
  enter_after_prior_grid();
  clear_rows(layout_detail::grid_range(), max_rows, d_row_token);
}

/// assignment_row[a] = offsets[segment] + slot (-1 if none); row_token[row] = token. Shared
/// slots write the same row with the same token, so the result does not depend on order. With
/// a map, an assignment at an expert not held here (or any, after a bad map: num_rows 0) gets
/// -1 and is counted in *d_nonlocal (zeroed beforehand; integer atomics).
__device__ inline void assignment_rows(layout_detail::stride_range it, std::int64_t n,
                                       std::int32_t k, const std::int32_t* __restrict__ map,
                                       std::int32_t segments, const const_dispatch_result& in,
                                       const layout_result& out) {
  const bool empty = map != nullptr && *out.d_num_rows == 0;
  for (std::int64_t a = it.first; a < n; a += it.stride) {
    const std::int32_t e = in.d_expert[a];
    std::int64_t row = -1;
    if (e >= 0) {
      std::int32_t l = e;
      if (map != nullptr) {
        l = map[e];
        if (empty || l < 0 || l >= segments) l = -1;
        if (l < 0 && out.d_nonlocal)
          atomicAdd(reinterpret_cast<unsigned long long*>(out.d_nonlocal), 1ull);
      }
      if (l >= 0) {
        row = out.d_offsets[l] + in.d_slot[a];
        out.d_row_token[row] = static_cast<std::int32_t>(static_cast<std::int32_t>(a) / k);
      }
    }
    out.d_assignment_row[a] = row;
  }
}

template <int Threads>
__global__ void __launch_bounds__(Threads)
    layout_rows_kernel(std::int64_t n, std::int32_t k, const std::int32_t* __restrict__ map,
                       std::int32_t segments, const const_dispatch_result in,
                       const layout_result out) {
  enter_after_prior_grid();
  assignment_rows(layout_detail::grid_range(), n, k, map, segments, in, out);
}

/// block_expert[b] = segment (expert, or local index) holding row b * block_size; -1 past
/// num_rows.
__device__ inline void block_experts(layout_detail::stride_range it, std::int64_t num_blocks,
                                     std::int64_t block_size, std::int32_t total_experts,
                                     const layout_result& out) {
  const std::int64_t rows = *out.d_num_rows;
  const std::int64_t* d_offsets = out.d_offsets;
  for (std::int64_t b = it.first; b < num_blocks; b += it.stride) {
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

template <int Threads>
__global__ void __launch_bounds__(Threads)
    layout_block_expert_kernel(std::int64_t num_blocks, std::int64_t block_size,
                               std::int32_t total_experts, const layout_result out) {
  enter_after_prior_grid();
  block_experts(layout_detail::grid_range(), num_blocks, block_size, total_experts, out);
}

/// layout_one_block_kernel's threads, and the most items (assignments + rows + blocks) it
/// takes: below that one block's few passes beat four launches (a first estimate until a
/// device run times both across it).
inline constexpr int layout_one_block_threads = 512;
inline constexpr std::int64_t layout_one_block_max_items = 16384;

/// The layout of a small batch in one launch: the four kernels above, one after the other in
/// one block (a sync between phases makes each phase's global writes visible to the next), and
/// *d_nonlocal zeroed first. num_blocks 0: no block table.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    layout_one_block_kernel(bool compact, std::int64_t block_size, std::int32_t experts,
                            std::int32_t total_experts, std::int64_t capacity_groups,
                            const std::int32_t* __restrict__ map, std::int32_t segments,
                            std::int64_t n, std::int32_t k, std::int64_t max_rows,
                            std::int64_t num_blocks, const const_dispatch_result in,
                            const layout_result out) {
  enter_after_prior_grid();
  const layout_detail::stride_range it{threadIdx.x, Threads};
  if (threadIdx.x == 0 && map != nullptr && out.d_nonlocal != nullptr) *out.d_nonlocal = 0;
  layout_offsets<Threads>(compact, block_size, experts, total_experts, capacity_groups, map,
                          segments, in, out);
  clear_rows(it, max_rows, out.d_row_token);
  __syncthreads();
  assignment_rows(it, n, k, map, segments, in, out);
  if (num_blocks > 0) block_experts(it, num_blocks, block_size, segments, out);
}

}  // namespace moeroute::kernels
