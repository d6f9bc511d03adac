// SPDX-License-Identifier: Apache-2.0
// The counting grant: capacity assignment without a sort, for the priorities whose order
// inside an expert is the assignment order (token-major: (t, j); choice-major: (j, t)). A
// competitor's rank at its expert is the number of competitors of that (group, expert) before
// it in that order, so three passes replace the key sort:
//   count_tiles_kernel    competitors per (tile, expert), a shared-memory histogram per tile;
//   count_offsets_kernel  one block: each (group, expert)'s exclusive scan over its tiles (the
//                         first rank of the tile's competitors), the requests, the capacity;
//   count_grant_kernel    per tile, the stable ranks inside it (warp match masks, then per-warp
//                         counts in shared memory), so rank = tile offset + in-tile rank.
// The tiles (dispatch_tiling) follow the priority order and never straddle a capacity group.
// Every count is an integer and every rank is a position in a fixed order: the results do not
// depend on the order threads run in, and equal the key sort's (and reference::dispatch's).
#pragma once

#include <cstdint>

#include <moeroute/dispatch_plan.hpp>
#include <moeroute/kernels/dispatch.cuh>
#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/kernels/shared_memory.cuh>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

namespace dispatch_count_detail {

/// The assignments of tile i, in priority order: size, and the assignment at position p.
struct tile_view {
  std::int64_t group = 0, slab = 0, first_token = 0, size = 0;
  std::int32_t k = 1;
  bool per_token = true;  // token-major: all k choices of each token; else choice `slab` only

  __device__ tile_view(const dispatch_state& s, const dispatch_tiling& d, std::int64_t i)
      : k(s.k), per_token(!d.choice_major) {
    // 32-bit divisions (tiles < T * k < 2^31): a 64-bit one is a called subroutine
    const auto tile = static_cast<std::int32_t>(i), chunks = static_cast<std::int32_t>(d.chunks);
    const auto per_group = static_cast<std::int32_t>(d.slabs) * chunks;
    group = tile / per_group;
    const std::int32_t in_group = tile - static_cast<std::int32_t>(group) * per_group;
    slab = in_group / chunks;
    const std::int64_t group_end = (group + 1) * s.group_tokens;
    first_token = group * s.group_tokens + (in_group - slab * chunks) * d.chunk_tokens;
    const std::int64_t end =
        first_token + d.chunk_tokens < group_end ? first_token + d.chunk_tokens : group_end;
    size = (end - first_token) * (per_token ? k : 1);
  }

  [[nodiscard]] __device__ std::int64_t assignment(std::int64_t p) const {
    return per_token ? first_token * k + p : (first_token + p) * k + slab;
  }
};

/// The expert assignment a competes for, or -1 (a padding or malformed token, a skipped second
/// choice: they compete nowhere, as the key sort puts them past every segment).
__device__ inline std::int32_t competing_expert(const dispatch_state& s, std::int64_t a) {
  using namespace dispatch_detail;
  return token_valid(s, token_of(s, a)) && !second_skipped(s, a) ? s.gated.d_ids[a] : -1;
}

}  // namespace dispatch_count_detail

/// Competitors per (tile, expert): d_tile_counts[i * E + e]. Dynamic shared memory: E int32.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    count_tiles_kernel(const dispatch_state s, const dispatch_tiling d) {
  enter_after_prior_grid();
  using namespace dispatch_count_detail;
  std::int32_t* hist = dynamic_shared<std::int32_t>();
  const std::int32_t E = s.experts;
  for (std::int64_t i = blockIdx.x; i < d.tiles; i += gridDim.x) {
    for (std::int32_t e = threadIdx.x; e < E; e += Threads) hist[e] = 0;
    __syncthreads();
    const tile_view tile(s, d, i);
    for (std::int64_t p = threadIdx.x; p < tile.size; p += Threads) {
      const std::int32_t e = competing_expert(s, tile.assignment(p));
      if (e >= 0) atomicAdd(&hist[e], 1);  // integer counts: the sum is order-free
    }
    __syncthreads();
    for (std::int32_t e = threadIdx.x; e < E; e += Threads)
      s.scratch.d_tile_counts[i * E + e] = hist[e];
    __syncthreads();  // hist is zeroed again for the next tile
  }
}

/// One block: each (group, expert) segment's counts become exclusive offsets over its tiles in
/// order (the rank of the segment's first competitor in each tile), its total goes to d_seg[q *
/// E + e], and grant_capacity turns the totals into the capacity and the loads.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    count_offsets_kernel(const dispatch_state s, const dispatch_tiling d, capacity_rule rule) {
  enter_after_prior_grid();
  const std::int64_t E = s.experts, per_group = d.slabs * d.chunks;
  std::int32_t* counts = s.scratch.d_tile_counts;
  std::int32_t* totals = s.scratch.d_seg;
  constexpr int batch = 16;  // loads in flight: one at a time, the scan is 256 L2 latencies
  for (std::int64_t g = threadIdx.x; g < s.groups * E; g += Threads) {
    const std::int64_t q = g / E, e = g - q * E, end = (q + 1) * per_group;
    std::int32_t running = 0;
    for (std::int64_t i0 = q * per_group; i0 < end; i0 += batch) {
      std::int32_t c[batch];
#pragma unroll
      for (int u = 0; u < batch; ++u) c[u] = i0 + u < end ? counts[(i0 + u) * E + e] : 0;
#pragma unroll
      for (int u = 0; u < batch; ++u) {
        if (i0 + u < end) counts[(i0 + u) * E + e] = running;
        running += c[u];
      }
    }
    totals[g] = running;
  }
  __syncthreads();
  grant_capacity<Threads>(s, rule, [totals](std::int64_t g) -> std::int64_t { return totals[g]; });
}

/// Bytes of count_grant_kernel's dynamic shared memory for E experts.
[[nodiscard]] constexpr std::size_t count_grant_shared_bytes(int threads, std::int32_t experts) {
  return static_cast<std::size_t>(threads / 32 + 1) * static_cast<std::size_t>(experts) * 4;
}

namespace dispatch_count_detail {

/// The shared tables of the in-tile ranking: base[e] = the rank the next competitor for e
/// gets, posted[w * E + e] = warp w's competitors for e in the current round, tagged with it.
struct rank_tables {
  std::int32_t* base = nullptr;     // [E]
  std::uint32_t* posted = nullptr;  // [warps * E]
  std::uint32_t tag = 0;            // round number of this block, from 1
};

/// Carves the tables from count_grant_shared_bytes of `smem` and clears posted. Block-wide;
/// the caller syncs before the first round.
template <int Threads>
__device__ rank_tables begin_ranks(std::int32_t* smem, std::int32_t experts) {
  rank_tables r;
  r.base = smem;
  r.posted = reinterpret_cast<std::uint32_t*>(smem + experts);
  for (std::int32_t i = threadIdx.x; i < Threads / 32 * experts; i += Threads) r.posted[i] = 0;
  return r;
}

/// Grants tile `tile`, Threads positions at a time (a round), each competitor's rank being
/// base[e] + its rank among the tile's earlier competitors for e: the lanes of a warp with the
/// same expert find each other (__match_any_sync), the lowest of them posts the warp's count,
/// every competitor adds the counts of the warps before its own, and the round's counts then
/// move base. A posted count carries its round's tag, so a stale one reads as 0 without
/// clearing the table. Kept below C (slot = rank, local to the group), else dropped.
/// write_keys: the 32-bit priority key of every assignment for the reroute order (token-major
/// 0, choice-major j * T + t). Block-wide; base is read after a sync and left moved past the
/// tile, after a sync.
template <int Threads>
__device__ void grant_tile(const dispatch_state& s, const tile_view& tile, rank_tables& r,
                           std::int64_t C, bool write_keys) {
  using namespace dispatch_detail;
  constexpr unsigned count_bits = 6;  // a warp's count: 0..32
  const std::int32_t E = s.experts;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  for (std::int64_t p0 = 0; p0 < tile.size; p0 += Threads) {  // block-uniform
    const std::uint32_t tag = ++r.tag;
    const std::int64_t p = p0 + threadIdx.x;
    const std::int64_t a = p < tile.size ? tile.assignment(p) : -1;
    const std::int32_t e = a >= 0 ? competing_expert(s, a) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const unsigned below = peers & ((1u << lane) - 1u);
    if (e >= 0 && below == 0) r.posted[warp * E + e] = tag << count_bits | __popc(peers);
    __syncthreads();
    std::int64_t rank = 0;
    if (e >= 0) {
      rank = r.base[e] + __popc(below);
      for (int w = 0; w < warp; ++w) {
        const std::uint32_t v = r.posted[w * E + e];
        if (v >> count_bits == tag) rank += v & ((1u << count_bits) - 1u);
      }
    }
    __syncthreads();  // every base read before the round moves it
    if (e >= 0 && below == 0) atomicAdd(&r.base[e], __popc(peers));  // integer: order-free
    if (a >= 0) {
      fate f = fate::masked;
      std::int32_t expert = -1, slot = -1;
      if (e >= 0) {
        if (C < 0 || rank < C) {
          f = fate::kept;
          expert = e;
          slot = static_cast<std::int32_t>(rank);
        } else {
          f = fate::dropped;
        }
      } else if (token_valid(s, token_of(s, a)) && second_skipped(s, a)) {
        f = fate::dropped;  // lost the draw: dropped without competing
      }
      s.out.d_fate[a] = f;
      s.out.d_expert[a] = expert;
      s.out.d_slot[a] = slot;
      s.scratch.d_holder[a] = f == fate::kept ? 1 : 0;
      if (write_keys)
        s.scratch.d_key32[a] =
            tile.per_token ? 0u : static_cast<std::uint32_t>(tile.slab * s.tokens + token_of(s, a));
    }
    __syncthreads();  // the moved bases are read by the next round
  }
}

}  // namespace dispatch_count_detail

/// Fates, experts and slots of every assignment, tile by tile: base starts at the tile's
/// offsets from count_offsets_kernel (grant_tile). Dynamic shared memory:
/// count_grant_shared_bytes(Threads, E).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    count_grant_kernel(const dispatch_state s, const dispatch_tiling d, bool write_keys) {
  enter_after_prior_grid();
  using namespace dispatch_count_detail;
  const std::int32_t E = s.experts;
  rank_tables r = begin_ranks<Threads>(dynamic_shared<std::int32_t>(), E);
  const std::int64_t C = s.out.d_totals->capacity;
  for (std::int64_t i = blockIdx.x; i < d.tiles; i += gridDim.x) {
    for (std::int32_t e = threadIdx.x; e < E; e += Threads)
      r.base[e] = s.scratch.d_tile_counts[i * E + e];
    __syncthreads();
    grant_tile<Threads>(s, tile_view(s, d, i), r, C, write_keys);
  }
}

// ----- the whole dispatch in one block ------------------------------------------------------

/// The one-block dispatch (dispatch_one_block_kernel): its threads, the widest batch and
/// expert count it takes. A small batch's dispatch is launch-bound: one block doing the work of
/// eight launches (check, counts, capacity, grant, weights, tallies) is faster below a few
/// thousand assignments, where a block still finishes in a handful of rounds. The bound is a
/// first estimate until a device run times both paths across it.
inline constexpr int one_block_threads = 512;
inline constexpr std::int64_t one_block_max_assignments = 4096;
inline constexpr std::int32_t one_block_max_experts = 256;

/// Bytes of dispatch_one_block_kernel's dynamic shared memory.
[[nodiscard]] constexpr std::size_t one_block_shared_bytes(std::int32_t experts,
                                                           std::int32_t total_experts) {
  return count_grant_shared_bytes(one_block_threads, experts) +
         fate_tally_bytes(experts, total_experts) + 5 * 4;
}

/// The whole dispatch of a batch in one block, for the counting priorities with one capacity
/// group and no rerouting: the checks, the requests (a shared histogram), the capacity, the
/// grant (one pass of grant_tile per tile, base running on), the combine weights and the
/// counts. It writes every output and counter itself (stores, not adds): no memset before it.
/// Dynamic shared memory: one_block_shared_bytes.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    dispatch_one_block_kernel(const dispatch_state s, const dispatch_tiling d, bool priority_read,
                              capacity_rule rule, bool after_drop, float scaling) {
  enter_after_prior_grid();
  using namespace dispatch_detail;
  using namespace dispatch_count_detail;
  const std::int32_t E = s.experts;
  std::int32_t* smem = dynamic_shared<std::int32_t>();
  // (each table is set up where it is first needed: nothing stays live across the capacity's
  // 64-bit divisions, which are calls, so nothing spills)
  std::int32_t* requests = smem;  // [E], then rank_tables::base
  for (std::int32_t e = threadIdx.x; e < E; e += Threads) requests[e] = 0;
  for (std::int64_t t = threadIdx.x; t < s.tokens; t += Threads) check_token(s, t, priority_read);
  __syncthreads();
  for (std::int64_t a = threadIdx.x; a < s.n; a += Threads) {
    const std::int32_t e = competing_expert(s, a);
    if (e >= 0) atomicAdd(&requests[e], 1);  // integer: order-free
  }
  __syncthreads();
  grant_capacity<Threads>(s, rule, [requests](std::int64_t e) -> std::int64_t {
    return requests[e];  // one capacity group: segment e
  });
  __syncthreads();
  rank_tables r = begin_ranks<Threads>(smem, E);
  for (std::int32_t e = threadIdx.x; e < E; e += Threads) r.base[e] = 0;
  __syncthreads();
  const std::int64_t C = s.out.d_totals->capacity;
  for (std::int64_t i = 0; i < d.tiles; ++i)
    grant_tile<Threads>(s, tile_view(s, d, i), r, C, false);
  std::int32_t* tallies = smem + (Threads / 32 + 1) * E;
  std::int32_t* sums = tallies + 4 * E + s.total_experts;  // fate_tally::totals, the block's
  fate_tally tl = begin_tally(s, tallies, Threads);
  if (threadIdx.x < 5) sums[threadIdx.x] = 0;
  __syncthreads();
  for (std::int64_t t = threadIdx.x; t < s.tokens; t += Threads) {
    token_weights(s, t, after_drop, scaling);
    tally_invalid(s, tl, t);
  }
  for (std::int64_t a = threadIdx.x; a < s.n; a += Threads) tally(s, tl, a);
#pragma unroll
  for (int i = 0; i < 5; ++i) tl.totals[i] = __reduce_add_sync(0xffffffffu, tl.totals[i]);
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int i = 0; i < 5; ++i) atomicAdd(&sums[i], tl.totals[i]);
  }
  __syncthreads();
  const dispatch_result& o = s.out;
  for (std::int32_t e = threadIdx.x; e < E; e += Threads) {
    o.d_kept[e] = tl.kept[e];
    o.d_rerouted[e] = tl.rerouted[e];
    o.d_dropped[e] = tl.dropped[e];
    o.d_requested[e] += tl.skipped[e];  // grant_capacity's thread for e wrote it
  }
  for (std::int32_t e = threadIdx.x; e < s.total_experts; e += Threads)
    o.d_received[e] = tl.received[e];
  if (threadIdx.x == 0) {
    o.d_totals->kept = sums[0];
    o.d_totals->rerouted = sums[1];
    o.d_totals->dropped = sums[2];
    o.d_totals->masked = sums[3];
    o.d_totals->reroute_rounds = 0;
    o.d_totals->invalid_tokens = sums[4];
  }
}

}  // namespace moeroute::kernels
