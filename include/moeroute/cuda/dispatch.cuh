// SPDX-License-Identifier: Apache-2.0
// Launcher: capacity assignment on the GPU (the CUDA twin of reference::dispatch). Gives every
// (token, choice) assignment a fate, a final expert, a slot and a combine weight, and writes
// the per-expert counts and the batch totals — all to device memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/cuda/common.cuh>
#include <moeroute/cuda/dispatch_workspace.hpp>
#include <moeroute/kernels/dispatch.cuh>
#include <moeroute/reference/dispatch.hpp>  // moeroute::fate (the values d_fate holds)

namespace moeroute::cuda {

/// @brief Inputs and outputs of cuda::dispatch. Inputs are what the gating stage wrote.
struct dispatch_params {
  routing_config config{};       ///< the config the gating ran with (must pass validate())
  std::int64_t tokens = 0;       ///< T
  std::int32_t reroute_candidates = 0;  ///< R = config.candidates_per_token() - top_k

  const std::int32_t* d_ids = nullptr;          ///< [T, k] int32 expert ids, best first
  const float* d_gates = nullptr;               ///< [T, k] f32 pre-drop gates
  const std::int32_t* d_reroute_ids = nullptr;  ///< [T, R] int32 (next_choice with R > 0 only)
  const std::uint8_t* d_valid = nullptr;        ///< [T] uint8 1 = real token; null = all valid

  std::int32_t* d_expert = nullptr;  ///< [T, k] int32 out: final expert, -1 if none
  std::int32_t* d_slot = nullptr;    ///< [T, k] int32 out: slot in that expert, -1 if none
  float* d_weight = nullptr;         ///< [T, k] f32 out: combine weight (0 unless it survived)
  std::uint8_t* d_fate = nullptr;    ///< [T, k] uint8 out: moeroute::fate values

  std::int64_t* d_requested = nullptr;  ///< [E] int64 out, by the expert first chosen
  std::int64_t* d_kept = nullptr;       ///< [E] int64 out
  std::int64_t* d_rerouted = nullptr;   ///< [E] int64 out
  std::int64_t* d_dropped = nullptr;    ///< [E] int64 out
  std::int64_t* d_received = nullptr;   ///< [total_experts] int64 out: reroutes landing at e
  std::int64_t* d_load = nullptr;       ///< [total_experts] int64 out: slots in use at e
  dispatch_totals* d_totals = nullptr;  ///< [1] out: capacity, totals, reroute rounds
};

/// @brief Checks config, shapes and pointers; names the first bad field.
[[nodiscard]] inline status validate(const dispatch_params& p) {
  if (auto s = validate(p.config); !s) return s;
  if (auto s = validate_tokens(p.config, p.tokens); !s) return s;
  const auto& c = p.config;
  const std::int64_t n = p.tokens * c.top_k;
  if (p.tokens > std::numeric_limits<std::int32_t>::max() ||
      n > std::numeric_limits<std::int32_t>::max() - 1)
    return status::make(status_code::unsupported,
                        "tokens * top_k = " + std::to_string(n) +
                            ": cuda::dispatch handles at most 2^31 - 2 assignments");
  const std::int32_t R = c.candidates_per_token() - c.top_k;
  if (p.reroute_candidates != R)
    return status::make(status_code::invalid_shape,
                        "reroute_candidates = " + std::to_string(p.reroute_candidates) +
                            ": must equal config.candidates_per_token() - top_k = " + std::to_string(R));
  if (p.tokens == 0) return status::success();
  auto null = [](const char* what) {
    return status::make(status_code::invalid_argument, std::string(what) + " is null with tokens > 0");
  };
  if (!p.d_ids) return null("d_ids");
  if (!p.d_gates) return null("d_gates");
  if (R > 0 && !p.d_reroute_ids) return null("d_reroute_ids (next_choice, reroute_candidates > 0)");
  if (!p.d_expert) return null("d_expert");
  if (!p.d_slot) return null("d_slot");
  if (!p.d_weight) return null("d_weight");
  if (!p.d_fate) return null("d_fate");
  if (!p.d_requested) return null("d_requested");
  if (!p.d_kept) return null("d_kept");
  if (!p.d_rerouted) return null("d_rerouted");
  if (!p.d_dropped) return null("d_dropped");
  if (!p.d_received) return null("d_received");
  if (!p.d_load) return null("d_load");
  if (!p.d_totals) return null("d_totals");
  return status::success();
}

namespace detail {
inline int priority_index(priority pr) noexcept {
  switch (pr) {
    case priority::token_major: return kernels::dispatch_detail::prio_token_major;
    case priority::choice_major: return kernels::dispatch_detail::prio_choice_major;
    case priority::score_per_expert: return kernels::dispatch_detail::prio_score;
    case priority::random: return kernels::dispatch_detail::prio_random;
  }
  return 0;
}
}  // namespace detail

/// @brief Capacity assignment for a batch, bit-identical to reference::dispatch on the same
///        gating output.
/// @param p          shapes, inputs and outputs (see dispatch_params)
/// @param workspace  device buffer of at least dispatch_workspace_bytes(p.config, p.tokens)
/// @param workspace_bytes its size
/// @param stream     stream to run on (last)
/// @return success; invalid_* from validate(); workspace_too_small; cuda_error.
/// @note Asynchronous: no allocation, no synchronisation, graph-capturable. T = 0 returns
///       success and writes nothing. Grant order per expert follows the priority key
///       (token_major (t, j); choice_major (j, t); score_per_expert (-gate, t, j); random
///       (-U, t, j)); dropped assignments are rerouted in the global order of the same key.
///       Precondition (as the gating stage guarantees): ids of a token are distinct and in
///       [0, E), reroute candidates distinct from them and from each other.
inline status dispatch(const dispatch_params& p, void* workspace, std::size_t workspace_bytes,
                       cudaStream_t stream = nullptr) {
  namespace K = kernels;
  if (auto s = validate(p); !s) return s;
  if (p.tokens == 0) return status::success();
  const routing_config& cfg = p.config;
  const std::int64_t T = p.tokens;
  const std::int32_t k = cfg.top_k, E = cfg.num_experts, ET = cfg.total_experts();
  const std::int32_t R = p.reroute_candidates;
  const std::int64_t n = T * k;
  const int nn = static_cast<int>(n);

  const std::size_t need = dispatch_workspace_bytes(cfg, T);
  if (workspace == nullptr || workspace_bytes < need)
    return status::make(status_code::workspace_too_small,
                        "workspace has " + std::to_string(workspace_bytes) + " bytes, dispatch needs " +
                            std::to_string(need) + " (dispatch_workspace_bytes)");
  workspace_carver carver(workspace, workspace_bytes);
  const auto w = detail::carve_dispatch_workspace(carver, T, k, ET);

  // Key layout: (group << key_bits) | key32. Token-major needs no key beyond the stable order.
  const int prio = detail::priority_index(cfg.dispatch.prio);
  int key_bits = 32;
  if (cfg.dispatch.prio == priority::token_major) key_bits = 0;
  if (cfg.dispatch.prio == priority::choice_major) key_bits = moeroute::cuda::detail::bits_for_value(static_cast<std::uint64_t>(n - 1));

  constexpr int threads = 256;
  const unsigned blocks_n = grid_for(n, threads);
  const unsigned blocks_t = grid_for(T, threads);

  // Stable LSD radix sort of (keys_a, vals_a) over [begin, end) bits; result pointers out.
  const std::uint64_t* sorted_keys = nullptr;
  const std::int32_t* sorted_vals = nullptr;
  auto sort = [&](int end_bit) -> status {
    cub::DoubleBuffer<std::uint64_t> keys(w.keys_a, w.keys_b);
    cub::DoubleBuffer<std::int32_t> vals(w.vals_a, w.vals_b);
    std::size_t bytes = 0;
    if (auto s = from_cuda(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, vals, nn, 0, end_bit, stream),
                           "cub::DeviceRadixSort::SortPairs (size)"); !s)
      return s;
    if (bytes > w.cub_bytes)
      return status::make(status_code::workspace_too_small,
                          "CUB radix sort wants " + std::to_string(bytes) + " bytes, the bound reserves " +
                              std::to_string(w.cub_bytes) + " (please report)");
    if (auto s = from_cuda(cub::DeviceRadixSort::SortPairs(w.cub, bytes, keys, vals, nn, 0, end_bit, stream),
                           "cub::DeviceRadixSort::SortPairs"); !s)
      return s;
    sorted_keys = keys.Current();
    sorted_vals = vals.Current();
    return status::success();
  };

  // Counters that are accumulated: zero them first.
  const auto zero = [&](void* ptr, std::size_t bytes, const char* what) {
    return from_cuda(cudaMemsetAsync(ptr, 0, bytes, stream), what);
  };
  if (auto s = zero(p.d_kept, sizeof(std::int64_t) * E, "cudaMemsetAsync(d_kept)"); !s) return s;
  if (auto s = zero(p.d_rerouted, sizeof(std::int64_t) * E, "cudaMemsetAsync(d_rerouted)"); !s) return s;
  if (auto s = zero(p.d_dropped, sizeof(std::int64_t) * E, "cudaMemsetAsync(d_dropped)"); !s) return s;
  if (auto s = zero(p.d_received, sizeof(std::int64_t) * ET, "cudaMemsetAsync(d_received)"); !s) return s;
  if (auto s = zero(p.d_totals, sizeof(dispatch_totals), "cudaMemsetAsync(d_totals)"); !s) return s;

  // 1. priority keys, sorted by (chosen expert, key): the grant order of every expert.
  K::dispatch_keys_kernel<threads><<<blocks_n, threads, 0, stream>>>(
      p.d_ids, p.d_gates, p.d_valid, T, k, E, prio, cfg.dispatch.random_seed,
      cfg.dispatch.random_offset, key_bits, w.key32, w.keys_a, w.vals_a);
  if (auto s = last_launch("dispatch_keys_kernel"); !s) return s;
  if (auto s = sort(key_bits + moeroute::cuda::detail::bits_for_value(static_cast<std::uint64_t>(E))); !s) return s;
  K::segment_starts_kernel<threads><<<grid_for(E + 1, threads), threads, 0, stream>>>(sorted_keys, n, key_bits, E, w.seg);
  if (auto s = last_launch("segment_starts_kernel"); !s) return s;

  // 2. capacity (max_load needs the largest request), then the first C of each expert.
  K::capacity_rule rule;
  if (cfg.capacity.mode == capacity_mode::max_load) {
    rule.from_max_load = true;
    rule.min_capacity = cfg.capacity.min_capacity;
    rule.clamp_to_tokens = cfg.capacity.clamp_to_tokens;
    rule.tokens = T;
  } else {
    rule.value = expert_capacity(cfg, T);  // unbounded_capacity (-1) for capacity_mode::unbounded
  }
  rule.fallback_capacity = cfg.has_dedicated_fallback() ? cfg.dispatch.fallback.capacity : 0;
  K::dispatch_capacity_kernel<threads><<<1, threads, 0, stream>>>(w.seg, E, ET, rule, p.d_requested,
                                                                  p.d_load, p.d_totals);
  if (auto s = last_launch("dispatch_capacity_kernel"); !s) return s;
  K::dispatch_grant_kernel<threads><<<blocks_n, threads, 0, stream>>>(sorted_keys, sorted_vals, n, key_bits, E, w.seg,
                                                              p.d_totals, p.d_fate, p.d_expert, p.d_slot,
                                                              w.holder);
  if (auto s = last_launch("dispatch_grant_kernel"); !s) return s;

  // 3. reroutes, in the global order of the same priority key.
  const drop_policy policy = cfg.dispatch.dropped;
  const bool reroute = policy == drop_policy::fallback || (policy == drop_policy::next_choice && R > 0);
  std::int64_t* d_num_pending = w.scalars + 0;
  if (reroute) {
    K::pending_keys_kernel<threads><<<blocks_n, threads, 0, stream>>>(p.d_fate, w.key32, n, key_bits, w.keys_a, w.vals_a);
    if (auto s = last_launch("pending_keys_kernel"); !s) return s;
    if (auto s = sort(key_bits + 1); !s) return s;
    K::pending_scatter_kernel<threads><<<blocks_n, threads, 0, stream>>>(sorted_keys, sorted_vals, n, key_bits,
                                                                 w.pending, w.pos);
    if (auto s = last_launch("pending_scatter_kernel"); !s) return s;
    K::count_below_kernel<32><<<1, 32, 0, stream>>>(sorted_keys, n, key_bits, 1, d_num_pending);
    if (auto s = last_launch("count_below_kernel"); !s) return s;
  }

  if (policy == drop_policy::fallback) {
    const bool dedicated = cfg.dispatch.fallback.expert < 0;
    const std::int32_t target = dedicated ? E : cfg.dispatch.fallback.expert;
    K::fallback_first_kernel<threads><<<blocks_t, threads, 0, stream>>>(w.pos, T, k, w.per_token);
    if (auto s = last_launch("fallback_first_kernel"); !s) return s;
    K::fallback_classify_kernel<threads><<<blocks_n, threads, 0, stream>>>(w.pending, d_num_pending, n, k, target,
                                                                   p.d_fate, p.d_expert, w.per_token,
                                                                   w.vals_a, w.flags);
    if (auto s = last_launch("fallback_classify_kernel"); !s) return s;
    std::size_t bytes = 0;
    if (auto s = from_cuda(cub::DeviceScan::InclusiveSum(nullptr, bytes, w.flags, nn, stream),
                           "cub::DeviceScan::InclusiveSum (size)"); !s)
      return s;
    if (bytes > w.cub_bytes)
      return status::make(status_code::workspace_too_small,
                          "CUB scan wants " + std::to_string(bytes) + " bytes, the bound reserves " +
                              std::to_string(w.cub_bytes) + " (please report)");
    if (auto s = from_cuda(cub::DeviceScan::InclusiveSum(w.cub, bytes, w.flags, nn, stream),
                           "cub::DeviceScan::InclusiveSum"); !s)
      return s;
    K::fallback_grant_kernel<threads><<<blocks_n, threads, 0, stream>>>(
        w.pending, d_num_pending, k, target, dedicated, w.vals_a, w.flags, w.pos, w.per_token, p.d_load,
        p.d_totals, p.d_fate, p.d_expert, p.d_slot, w.holder);
    if (auto s = last_launch("fallback_grant_kernel"); !s) return s;
    K::fallback_load_kernel<32><<<1, 32, 0, stream>>>(d_num_pending, w.flags, target, dedicated, p.d_totals, p.d_load);
    if (auto s = last_launch("fallback_load_kernel"); !s) return s;
  } else if (policy == drop_policy::next_choice && R > 0) {
    if (auto s = zero(w.per_token, sizeof(std::int32_t) * T, "cudaMemsetAsync(next candidate)"); !s) return s;
    // At most R rounds; a round without any attempt changes nothing, so running all R on the
    // host side needs no device-to-host read (reroute_rounds counts the rounds with attempts).
    for (std::int32_t round = 0; round < R; ++round) {
      K::next_choice_attempt_kernel<threads><<<blocks_n, threads, 0, stream>>>(w.pending, d_num_pending, n, k, R, E,
                                                                       w.pos, p.d_fate, w.per_token,
                                                                       p.d_reroute_ids, w.keys_a, w.vals_a);
      if (auto s = last_launch("next_choice_attempt_kernel"); !s) return s;
      K::next_choice_advance_kernel<threads><<<blocks_t, threads, 0, stream>>>(T, k, R, w.pos, p.d_fate, w.per_token);
      if (auto s = last_launch("next_choice_advance_kernel"); !s) return s;
      if (auto s = sort(moeroute::cuda::detail::bits_for_value(static_cast<std::uint64_t>(E))); !s) return s;
      K::segment_starts_kernel<threads><<<grid_for(E + 1, threads), threads, 0, stream>>>(sorted_keys, n, 0, E, w.seg);
      if (auto s = last_launch("segment_starts_kernel"); !s) return s;
      K::next_choice_grant_kernel<threads><<<blocks_n, threads, 0, stream>>>(sorted_keys, sorted_vals, n, E, w.seg,
                                                                     w.pending, p.d_load, p.d_totals,
                                                                     p.d_fate, p.d_expert, p.d_slot, w.holder);
      if (auto s = last_launch("next_choice_grant_kernel"); !s) return s;
      K::next_choice_load_kernel<threads><<<grid_for(E, threads), threads, 0, stream>>>(E, w.seg, p.d_load, p.d_totals);
      if (auto s = last_launch("next_choice_load_kernel"); !s) return s;
    }
  }

  // 4. slot numbering by token index: each expert's holders ranked by assignment index.
  if (cfg.dispatch.slots == slot_order::token_index) {
    K::holder_keys_kernel<threads><<<blocks_n, threads, 0, stream>>>(w.holder, p.d_expert, n, ET, w.keys_a, w.vals_a);
    if (auto s = last_launch("holder_keys_kernel"); !s) return s;
    if (auto s = sort(moeroute::cuda::detail::bits_for_value(static_cast<std::uint64_t>(ET))); !s) return s;
    K::segment_starts_kernel<threads><<<grid_for(ET + 1, threads), threads, 0, stream>>>(sorted_keys, n, 0, ET, w.seg);
    if (auto s = last_launch("segment_starts_kernel"); !s) return s;
    K::renumber_kernel<threads><<<blocks_n, threads, 0, stream>>>(sorted_keys, sorted_vals, ET, w.seg, p.d_slot);
    if (auto s = last_launch("renumber_kernel"); !s) return s;
  }
  if (policy == drop_policy::fallback) {  // only the fallback policy creates shared slots
    K::follower_slot_kernel<threads><<<blocks_n, threads, 0, stream>>>(n, k, p.d_expert, w.holder, p.d_slot);
    if (auto s = last_launch("follower_slot_kernel"); !s) return s;
  }

  // 5. weights and counts.
  K::dispatch_weights_kernel<threads><<<blocks_t, threads, 0, stream>>>(T, k, p.d_gates, p.d_fate,
                                                                cfg.gating.renorm == renormalize::after_drop,
                                                                cfg.gating.scaling_factor, p.d_weight);
  if (auto s = last_launch("dispatch_weights_kernel"); !s) return s;
  K::dispatch_stats_kernel<threads><<<blocks_n, threads, 0, stream>>>(n, p.d_ids, p.d_fate, p.d_expert, p.d_kept,
                                                                      p.d_rerouted, p.d_dropped, p.d_received,
                                                                      p.d_totals);
  return last_launch("dispatch_stats_kernel");
}

}  // namespace moeroute::cuda
