// SPDX-License-Identifier: Apache-2.0
// Pure C++ part of the CUDA dispatch / layout launchers: the device-written totals record, the
// workspace size query and the row bounds of both layouts. Includes no CUDA header, so a .cpp
// file can size buffers before it ever touches the GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cuda {

/// @brief Batch totals written by cuda::dispatch to device memory (one record, int64 fields).
///        Mirrors the scalar fields of reference::dispatch_output.
struct dispatch_totals {
  std::int64_t capacity = 0;           ///< C of each routed expert; -1 = unbounded
  std::int64_t fallback_capacity = 0;  ///< C of the dedicated fallback (-1 unbounded; 0 if none)
  std::int64_t kept = 0;
  std::int64_t rerouted = 0;
  std::int64_t dropped = 0;
  std::int64_t masked = 0;
  std::int64_t reroute_rounds = 0;     ///< rounds run by next_choice (0 otherwise)
};

namespace detail {

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

/// Every sub-buffer of the dispatch workspace. The same carving sequence sizes the workspace
/// (base = nullptr) and hands out the pointers, so the two cannot disagree.
struct dispatch_workspace_ptrs {
  std::uint32_t* key32 = nullptr;   ///< [n] priority key of each assignment
  std::uint64_t* keys_a = nullptr;  ///< [n] radix-sort key double buffer
  std::uint64_t* keys_b = nullptr;  ///< [n]
  std::int32_t* vals_a = nullptr;   ///< [n] radix-sort value double buffer
  std::int32_t* vals_b = nullptr;   ///< [n]
  std::int32_t* pending = nullptr;  ///< [n] assignments in global reroute order (dropped first)
  std::int32_t* pos = nullptr;      ///< [n] position of a dropped assignment in `pending`, or -1
  std::int32_t* flags = nullptr;    ///< [n] fallback competitor flags, scanned in place
  std::uint8_t* holder = nullptr;   ///< [n] 1 = the assignment holds its slot (not a share)
  std::int32_t* per_token = nullptr;  ///< [T] first pending assignment / next candidate
  std::int32_t* seg = nullptr;      ///< [total_experts + 2] segment starts in a sorted array
  std::int64_t* scalars = nullptr;  ///< [8] device scalars (pending count, ...)
  void* cub = nullptr;              ///< CUB temporary storage
  std::size_t cub_bytes = 0;
};

[[nodiscard]] inline dispatch_workspace_ptrs carve_dispatch_workspace(workspace_carver& w,
                                                                      std::int64_t tokens,
                                                                      std::int32_t k,
                                                                      std::int32_t total_experts) {
  const auto n = static_cast<std::size_t>(tokens * k);
  dispatch_workspace_ptrs p;
  p.key32 = w.take<std::uint32_t>(n);
  p.keys_a = w.take<std::uint64_t>(n);
  p.keys_b = w.take<std::uint64_t>(n);
  p.vals_a = w.take<std::int32_t>(n);
  p.vals_b = w.take<std::int32_t>(n);
  p.pending = w.take<std::int32_t>(n);
  p.pos = w.take<std::int32_t>(n);
  p.flags = w.take<std::int32_t>(n);
  p.holder = w.take<std::uint8_t>(n);
  p.per_token = w.take<std::int32_t>(static_cast<std::size_t>(tokens));
  p.seg = w.take<std::int32_t>(static_cast<std::size_t>(total_experts) + 2);
  p.scalars = w.take<std::int64_t>(8);
  p.cub_bytes = cub_temp_bound(n);
  p.cub = w.take<std::byte>(p.cub_bytes);
  return p;
}

}  // namespace detail

/// @brief Workspace bytes cuda::dispatch needs for `tokens` tokens under `cfg`. Pure C++.
/// @return 0 for tokens <= 0 (a T = 0 call touches nothing).
[[nodiscard]] inline std::size_t dispatch_workspace_bytes(const routing_config& cfg,
                                                          std::int64_t tokens) {
  if (tokens <= 0) return 0;
  workspace_carver w;
  (void)detail::carve_dispatch_workspace(w, tokens, cfg.top_k, cfg.total_experts());
  return w.bytes();
}

/// @brief Rows a padded layout can need for `tokens` tokens: E * C (+ the dedicated fallback
///        segment). With capacity_mode::max_load, C is bounded by expert_capacity(cfg, T, T)
///        (an expert receives at most T assignments); an unbounded dedicated fallback holds at
///        most T rows. Returns -1 for capacity_mode::unbounded (padded needs a bound).
[[nodiscard]] inline std::int64_t padded_max_rows(const routing_config& cfg, std::int64_t tokens) {
  if (cfg.capacity.mode == capacity_mode::unbounded) return -1;
  const std::int64_t C = expert_capacity(cfg, tokens, tokens);
  std::int64_t rows = std::int64_t{cfg.num_experts} * C;
  if (cfg.has_dedicated_fallback())
    rows += cfg.dispatch.fallback.capacity < 0 ? tokens : cfg.dispatch.fallback.capacity;
  return rows;
}

/// @brief Rows a compact layout with segments aligned to `block_size` can need:
///        T * k + total_experts * (block_size - 1) (every slot is held by one assignment).
[[nodiscard]] inline std::int64_t compact_max_rows(const routing_config& cfg, std::int64_t tokens,
                                                   std::int64_t block_size) {
  return tokens * cfg.top_k + std::int64_t{cfg.total_experts()} * (block_size - 1);
}

}  // namespace moeroute::cuda
