// SPDX-License-Identifier: Apache-2.0
// How the CUDA dispatch stage uses its caller-owned workspace: the scratch arrays its kernels
// share, carved by one sequence of calls that also sizes the workspace, so size and layout
// cannot disagree. Plain C++ with no CUDA header: the size query of cuda/dispatch_workspace.hpp
// and the kernels of kernels/dispatch.cuh both include it.
#pragma once

#include <cstddef>
#include <cstdint>

#include <moeroute/workspace.hpp>

namespace moeroute {

/// Smallest b with 2^b > v (bits needed to hold the value v); at least 1.
[[nodiscard]] constexpr int bits_for_value(std::uint64_t v) noexcept {
  int b = 1;
  while (b < 64 && (v >> b) != 0) ++b;
  return b;
}

/// Conservative bound on the temporary storage CUB's DeviceRadixSort (DoubleBuffer form,
/// 64-bit keys, 32-bit values) and DeviceScan need for n items. CUB itself can only be asked on
/// the device side; the launcher asks it at launch time and returns workspace_too_small if it
/// ever wanted more than this (the CUDA tests check that it never does).
[[nodiscard]] constexpr std::size_t cub_temp_bound(std::size_t n) noexcept {
  return (std::size_t{1} << 20) + 8 * n;
}

/// @brief How the counting grant cuts a batch into tiles. A tile is a run of assignments in
///        priority order inside one capacity group: `chunk_tokens` consecutive tokens, all k
///        choices of each (token-major: one slab) or choice j of each (choice-major: slab j).
///        Tile i is group i / (slabs * chunks), slab (i / chunks) % slabs, chunk i % chunks, so
///        a group's tiles are consecutive and in priority order.
struct dispatch_tiling {
  std::int64_t slabs = 0;         ///< 1 (token-major) or k (choice-major)
  std::int64_t chunk_tokens = 0;  ///< tokens of a tile (the group's last chunk may be shorter)
  std::int64_t chunks = 0;        ///< tiles per (group, slab)
  std::int64_t tiles = 0;         ///< groups * slabs * chunks; 0 = the key sort grants instead
  bool choice_major = false;      ///< tile order (j, t) (else (t, j)); slabs = k then
  [[nodiscard]] constexpr bool counting() const noexcept { return tiles > 0; }
};

/// Widest expert count the counting grant serves: its grant kernel keeps (warps + 1) * E
/// 32-bit counters in shared memory (36 KiB at 1024 experts and eight warps).
inline constexpr std::int32_t count_grant_max_experts = 1024;

/// @brief The counting grant's tiles for T tokens in `groups` capacity groups, where the
///        priority order inside an expert is the assignment order (token-major) or the
///        (choice, token) order (choice-major); every other priority passes order_keyed =
///        false and gets tiles = 0. About 256 tiles of at least 512 assignments: enough blocks
///        for a GPU, few enough that one block scans the per-tile counts.
[[nodiscard]] constexpr dispatch_tiling dispatch_tiles(bool order_keyed, bool choice_major,
                                                       std::int64_t tokens, std::int32_t k,
                                                       std::int32_t experts,
                                                       std::int64_t groups) noexcept {
  dispatch_tiling d;
  if (!order_keyed || experts > count_grant_max_experts || tokens <= 0 || k <= 0 || groups <= 0)
    return d;
  const std::int64_t n = tokens * k;
  const std::int64_t per_tile =
      std::int64_t{256} * ((n / 256 + 255) / 256);  // n / 256, rounded up to 256s
  const std::int64_t tile = per_tile > 512 ? per_tile : 512;
  const std::int64_t group_tokens = tokens / groups;
  d.choice_major = choice_major;
  d.slabs = choice_major ? k : 1;
  const std::int64_t chunk = choice_major ? tile : (tile / k > 0 ? tile / k : 1);
  d.chunk_tokens = chunk < group_tokens ? chunk : group_tokens;
  d.chunks = (group_tokens + d.chunk_tokens - 1) / d.chunk_tokens;
  d.tiles = groups * d.slabs * d.chunks;
  return d;
}

/// @brief The dispatch kernels' scratch arrays (n = T * k assignments).
struct dispatch_scratch {
  std::uint32_t* d_key32 = nullptr;     ///< [n] priority key of each assignment
  std::uint64_t* d_keys_a = nullptr;    ///< [n] radix-sort key double buffer
  std::uint64_t* d_keys_b = nullptr;    ///< [n]
  std::int32_t* d_vals_a = nullptr;     ///< [n] radix-sort value double buffer
  std::int32_t* d_vals_b = nullptr;     ///< [n]
  std::int32_t* d_pending = nullptr;    ///< [n] assignments in global reroute order (dropped first)
  std::int32_t* d_pos = nullptr;        ///< [n] position of a dropped assignment in pending, or -1
  std::int32_t* d_flags = nullptr;      ///< [n] fallback competitor flags, scanned in place
  std::uint8_t* d_holder = nullptr;     ///< [n] 1 = the assignment holds its slot (not a share)
  std::int32_t* d_per_token = nullptr;  ///< [T] first pending assignment / next candidate
  std::uint8_t* d_usable = nullptr;     ///< [T] 1 = a real token with well-formed ids and gates
  std::int32_t* d_seg = nullptr;        ///< [segments + 2] segment starts in a sorted array
  std::int64_t* d_num_pending = nullptr;  ///< [1] dropped assignments after the first grant
  std::int64_t* d_vload = nullptr;        ///< [groups * total_experts] load per (group, expert)
  std::int64_t* d_group_base = nullptr;   ///< [groups * total_experts] slots in earlier groups
  std::int32_t* d_group_first = nullptr;  ///< [groups] first / last position of a group's
  std::int32_t* d_group_last = nullptr;   ///< [groups]   dropped assignments in reroute order
  std::int32_t* d_tile_counts = nullptr;  ///< [tiles * E] per tile and expert: competitors,
                                          ///< then their first rank (the counting grant)
  void* d_cub = nullptr;                  ///< CUB temporary storage
  std::size_t cub_bytes = 0;
};

/// @brief Carves (base = the caller's buffer) or sizes (a sizing carver) the dispatch scratch
///        for `groups` capacity groups of `total_experts` experts (`experts` of them routed to
///        by gating), and the counting grant's `tiles`.
[[nodiscard]] inline dispatch_scratch carve_dispatch_scratch(
    workspace_carver& w, std::int64_t tokens, std::int32_t k, std::int32_t experts,
    std::int32_t total_experts, std::int64_t groups, const dispatch_tiling& tiles) noexcept {
  const std::int64_t segments = groups * total_experts;
  const auto n = static_cast<std::size_t>(tokens * k);
  dispatch_scratch p;
  p.d_key32 = w.take<std::uint32_t>(n);
  p.d_keys_a = w.take<std::uint64_t>(n);
  p.d_keys_b = w.take<std::uint64_t>(n);
  p.d_vals_a = w.take<std::int32_t>(n);
  p.d_vals_b = w.take<std::int32_t>(n);
  p.d_pending = w.take<std::int32_t>(n);
  p.d_pos = w.take<std::int32_t>(n);
  p.d_flags = w.take<std::int32_t>(n);
  p.d_holder = w.take<std::uint8_t>(n);
  p.d_per_token = w.take<std::int32_t>(static_cast<std::size_t>(tokens));
  p.d_usable = w.take<std::uint8_t>(static_cast<std::size_t>(tokens));
  p.d_seg = w.take<std::int32_t>(static_cast<std::size_t>(segments) + 2);
  p.d_num_pending = w.take<std::int64_t>(1);
  p.d_vload = w.take<std::int64_t>(static_cast<std::size_t>(segments));
  p.d_group_base = w.take<std::int64_t>(static_cast<std::size_t>(segments));
  p.d_group_first = w.take<std::int32_t>(static_cast<std::size_t>(groups));
  p.d_group_last = w.take<std::int32_t>(static_cast<std::size_t>(groups));
  p.d_tile_counts = w.take<std::int32_t>(static_cast<std::size_t>(tiles.tiles * experts));
  p.cub_bytes = cub_temp_bound(n);
  p.d_cub = w.take<std::byte>(p.cub_bytes);
  return p;
}

}  // namespace moeroute
