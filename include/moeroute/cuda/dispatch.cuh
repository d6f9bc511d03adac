// SPDX-License-Identifier: Apache-2.0
// Launcher: capacity assignment on the GPU (the CUDA twin of reference::dispatch). Gives every
// (token, choice) assignment a fate, a final expert, a slot and a combine weight, and writes
// the per-expert counts and the batch totals — all to device memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/cuda/dispatch_workspace.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/dispatch_plan.hpp>
#include <moeroute/kernels/dispatch.cuh>
#include <moeroute/kernels/dispatch_count.cuh>
#include <moeroute/params/dispatch.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

using moeroute::dispatch_params;

namespace detail {

/// Key layout of the grant sort: (segment << key_bits) | key. Token-major needs no key beyond
/// the stable order; batch_prioritized puts the choice rank above its 32-bit score key.
[[nodiscard]] inline int dispatch_key_bits(const routing_config& cfg, std::int64_t tokens) {
  const std::int64_t n = tokens * cfg.top_k;
  switch (cfg.dispatch.prio) {
    case priority::choice_major:
      return bits_for_value(static_cast<std::uint64_t>(n > 0 ? n - 1 : 0));
    case priority::token_major:
      return 0;
    case priority::batch_prioritized:
      return 32 + bits_for_value(static_cast<std::uint64_t>(cfg.top_k - 1));
    default:
      return 32;
  }
}

/// next_choice with candidates to try (R > 0): without any, it drops as zero_weight does.
[[nodiscard]] inline bool reroutes_next_choice(const routing_config& cfg) {
  return cfg.dispatch.dropped == drop_policy::next_choice && cfg.candidates_per_token() > cfg.top_k;
}

/// A dropped assignment may be rerouted: the reroute order is built, slots appended after C.
[[nodiscard]] inline bool reroutes(const routing_config& cfg) {
  return cfg.dispatch.dropped == drop_policy::fallback || reroutes_next_choice(cfg);
}

/// Bits of the capacity group index in the reroute-order sort (0 without groups).
[[nodiscard]] inline int dispatch_group_bits(const routing_config& cfg, std::int64_t tokens) {
  const std::int64_t groups = cfg.capacity_groups(tokens);
  return groups > 1 ? bits_for_value(static_cast<std::uint64_t>(groups - 1)) : 0;
}

/// Bits of the widest sort: the grant sort (key and segment index, groups * E standing for
/// padding) or the reroute-order sort (dropped flag, group, key).
[[nodiscard]] inline int dispatch_sort_bits(const routing_config& cfg, std::int64_t tokens) {
  const int key = dispatch_key_bits(cfg, tokens);
  const int grant = key + bits_for_value(static_cast<std::uint64_t>(cfg.capacity_groups(tokens)) *
                                         static_cast<std::uint64_t>(cfg.num_experts));
  const int pending = key + dispatch_group_bits(cfg, tokens) + 1;
  return grant > pending ? grant : pending;
}

}  // namespace detail

/// @brief Checks config, shapes and pointers (check_params), then the limits of the GPU sort:
///        at most 2^31 - 2 assignments, and keys of at most 64 bits.
[[nodiscard]] inline status validate(const routing_config& cfg, const dispatch_params& p) {
  if (auto s = check_params(cfg, p); !s) return s;
  const std::int64_t n = p.tokens * cfg.top_k;
  if (n > std::numeric_limits<std::int32_t>::max() - 1)
    return status::make(status_code::unsupported,
                        "tokens * top_k = " + std::to_string(n) +
                            ": cuda::dispatch handles at most 2^31 - 2 assignments");
  if (p.tokens == 0) return status::success();
  if (detail::dispatch_sort_bits(cfg, p.tokens) > 64)
    return status::make(status_code::unsupported,
                        "capacity groups * num_experts and the priority key need more than 64 "
                        "sort bits: fewer capacity groups or tokens per call");
  return status::success();
}

namespace detail {

/// One dispatch call in flight: the kernels' state, the stream, and the phases that launch
/// them in order. Every kernel goes through cuda::launch; every CUB call is checked the same way.
class dispatch_run {
 public:
  static constexpr int threads = 256;

  dispatch_run(const routing_config& cfg, const dispatch_params& p, const dispatch_scratch& w,
               const dispatch_tiling& tiles, cudaStream_t stream)
      : cfg_(cfg), stream_(stream), tiles_(tiles) {
    s_.tokens = p.tokens;
    s_.k = cfg.top_k;
    s_.n = p.tokens * cfg.top_k;
    s_.experts = cfg.num_experts;
    s_.total_experts = cfg.total_experts();
    s_.reroute = cfg.reroute_candidates();
    s_.groups = cfg.capacity_groups(p.tokens);
    s_.group_tokens = cfg.capacity_group_tokens(p.tokens);
    s_.gated = p.gated;
    // read only where the config says they exist
    if (cfg.gating.second_expert.policy != second_expert_policy::random)
      s_.gated.d_second_skipped = nullptr;
    // every kernel after the check reads the tokens it found real and well-formed
    s_.given_valid = p.d_valid;
    s_.valid = w.d_usable;
    s_.token_count = p.d_token_count;
    s_.out = p.out;
    s_.scratch = w;
    key_bits_ = dispatch_key_bits(cfg, p.tokens);
    group_bits_ = dispatch_group_bits(cfg, p.tokens);
  }

  /// The whole dispatch of a small batch in one launch (kernels::dispatch_one_block_kernel):
  /// no memset, no other kernel.
  [[nodiscard]] status one_block() {
    const auto& g = cfg_.gating;
    return launch("dispatch_one_block_kernel",
                  kernels::dispatch_one_block_kernel<kernels::one_block_threads>,
                  {1, kernels::one_block_threads,
                   kernels::one_block_shared_bytes(s_.experts, s_.total_experts)},
                  stream_, s_, tiles_, cfg_.dispatch.prio == priority::batch_prioritized,
                  capacity_rule(), g.renorm == renormalize::after_drop, g.scaling_factor);
  }

  /// Checks the ids (and zeroes the counters later kernels add to: no memset), then grants the
  /// first C of each (group, expert): by counting where the priority order is the assignment
  /// order, else by the key sort.
  [[nodiscard]] status grant() {
    // the check kernel's grid covers the counters too (ET of them)
    if (auto s = run("dispatch_check_kernel", kernels::dispatch_check_kernel<threads>,
                     s_.tokens > s_.total_experts ? s_.tokens : s_.total_experts,
                     cfg_.dispatch.prio == priority::batch_prioritized);
        !s)
      return s;
    return tiles_.counting() ? grant_by_counts() : grant_by_sort();
  }

  /// The dropped assignments in the global reroute order (pending, pos, num_pending).
  [[nodiscard]] status pending_order() {
    if (auto s = run("pending_keys_kernel", kernels::pending_keys_kernel<threads>, s_.n, key_bits_,
                     group_bits_, cfg_.dispatch.prio == priority::batch_prioritized);
        !s)
      return s;
    if (auto s = sort(key_bits_ + group_bits_ + 1); !s) return s;
    if (auto s = run("pending_scatter_kernel", kernels::pending_scatter_kernel<threads>, s_.n,
                     sorted_keys_, sorted_vals_, key_bits_ + group_bits_);
        !s)
      return s;
    const auto group_bytes = static_cast<std::size_t>(s_.groups) * sizeof(std::int32_t);
    for (std::int32_t* p : {s_.scratch.d_group_first, s_.scratch.d_group_last})
      if (auto s = from_cuda(cudaMemsetAsync(p, 0xff, group_bytes, stream_), "cudaMemsetAsync"); !s)
        return s;
    return run("pending_groups_kernel", kernels::pending_groups_kernel<threads>, s_.n);
  }

  /// drop_policy::fallback: every dropped assignment tries the fallback expert, in order.
  [[nodiscard]] status fallback() {
    const bool dedicated = cfg_.dispatch.fallback.expert < 0;
    const std::int32_t target = dedicated ? s_.experts : cfg_.dispatch.fallback.expert;
    const dispatch_scratch& w = s_.scratch;
    if (auto s = run("fallback_first_kernel", kernels::fallback_first_kernel<threads>, s_.tokens);
        !s)
      return s;
    if (auto s = run("fallback_classify_kernel", kernels::fallback_classify_kernel<threads>, s_.n,
                     target);
        !s)
      return s;
    if (auto s = cub_call("cub::DeviceScan::InclusiveSum",
                          [&](void* tmp, std::size_t& bytes) {
                            return cub::DeviceScan::InclusiveSum(tmp, bytes, w.d_flags,
                                                                 static_cast<int>(s_.n), stream_);
                          });
        !s)
      return s;
    if (auto s = run("fallback_grant_kernel", kernels::fallback_grant_kernel<threads>, s_.n, target,
                     dedicated);
        !s)
      return s;
    return run("fallback_load_kernel", kernels::fallback_load_kernel<threads>, s_.groups, target,
               dedicated);
  }

  /// drop_policy::next_choice: R rounds, each dropped assignment trying its token's next
  /// candidate. A round without any attempt changes nothing, so running all R needs no
  /// device-to-host read (reroute_rounds counts the rounds with attempts).
  [[nodiscard]] status next_choice() {
    if (auto s = from_cuda(
            cudaMemsetAsync(s_.scratch.d_per_token, 0, sizeof(std::int32_t) * s_.tokens, stream_),
            "cudaMemsetAsync(next candidate)");
        !s)
      return s;
    for (std::int32_t round = 0; round < s_.reroute; ++round) {
      if (auto s =
              run("next_choice_attempt_kernel", kernels::next_choice_attempt_kernel<threads>, s_.n);
          !s)
        return s;
      if (auto s = run("next_choice_advance_kernel", kernels::next_choice_advance_kernel<threads>,
                       s_.tokens);
          !s)
        return s;
      // segments: (capacity group, target) pairs; groups * ET = no attempt
      const std::int64_t segments = s_.groups * s_.total_experts;
      if (auto s = sort(bits_for_value(static_cast<std::uint64_t>(segments))); !s) return s;
      if (auto s = segment_starts(0, segments); !s) return s;
      if (auto s = run("next_choice_grant_kernel", kernels::next_choice_grant_kernel<threads>, s_.n,
                       sorted_keys_, sorted_vals_);
          !s)
        return s;
      if (auto s =
              run("next_choice_load_kernel", kernels::next_choice_load_kernel<threads>, segments);
          !s)
        return s;
    }
    return status::success();
  }

  /// Capacity groups with slot_order::priority: local slots become dense over the batch.
  [[nodiscard]] status rebase() {
    if (auto s = run("group_base_kernel", kernels::group_base_kernel<threads>, s_.total_experts);
        !s)
      return s;
    return run("rebase_kernel", kernels::rebase_kernel<threads>, s_.n);
  }

  /// slot_order::token_index: each expert's holders ranked by assignment (= token) index.
  [[nodiscard]] status renumber() {
    if (auto s = run("holder_keys_kernel", kernels::holder_keys_kernel<threads>, s_.n); !s)
      return s;
    if (auto s = sort(bits_for_value(static_cast<std::uint64_t>(s_.total_experts))); !s) return s;
    if (auto s = segment_starts(0, s_.total_experts); !s) return s;
    return run("renumber_kernel", kernels::renumber_kernel<threads>, s_.n, sorted_keys_,
               sorted_vals_);
  }

  /// Shared slots (fallback only), combine weights, per-expert and total counts.
  [[nodiscard]] status finalize() {
    if (cfg_.dispatch.dropped == drop_policy::fallback)  // the only policy that shares slots
      if (auto s = run("follower_slot_kernel", kernels::follower_slot_kernel<threads>, s_.n); !s)
        return s;
    if (auto s =
            run("dispatch_weights_kernel", kernels::dispatch_weights_kernel<threads>, s_.tokens,
                cfg_.gating.renorm == renormalize::after_drop, cfg_.gating.scaling_factor);
        !s)
      return s;
    // shared tallies pay off when a block sees many assignments per expert: 4096 per block
    const bool shared = s_.total_experts <= kernels::tally_max_experts;
    return launch("dispatch_stats_kernel", kernels::dispatch_stats_kernel<threads>,
                  {grid_for(s_.n, shared ? 4096 : threads), threads,
                   shared ? kernels::fate_tally_bytes(s_.experts, s_.total_experts) : 0},
                  stream_, s_, shared);
  }

 private:
  /// The capacity as the config says: a host value, or computed on the device (max_load needs
  /// the requests; a d_token_count is known there only).
  [[nodiscard]] kernels::capacity_rule capacity_rule() const {
    kernels::capacity_rule rule;
    rule.on_device = cfg_.capacity.mode == capacity_mode::max_load || s_.token_count != nullptr;
    rule.cap = cfg_.capacity;
    rule.experts = cfg_.num_experts;
    rule.k = cfg_.top_k;
    rule.factor = cfg_.active_capacity_factor();
    rule.d_token_count = s_.token_count;
    if (!rule.on_device) rule.value = expert_capacity(cfg_, s_.tokens);  // -1: unbounded
    rule.fallback_capacity = cfg_.has_dedicated_fallback() ? cfg_.dispatch.fallback.capacity : 0;
    return rule;
  }

  /// Token- and choice-major: per-tile counts, their scan and the capacity (one block), then
  /// the stable ranks inside each tile (kernels/dispatch_count.cuh). Three launches, no sort.
  [[nodiscard]] status grant_by_counts() {
    const unsigned grid =
        tiles_.tiles < max_tile_blocks ? static_cast<unsigned>(tiles_.tiles) : max_tile_blocks;
    const auto hist_bytes = static_cast<std::size_t>(s_.experts) * sizeof(std::int32_t);
    if (auto s = launch("count_tiles_kernel", kernels::count_tiles_kernel<threads>,
                        {grid, threads, hist_bytes}, stream_, s_, tiles_);
        !s)
      return s;
    if (auto s = launch("count_offsets_kernel", kernels::count_offsets_kernel<threads>,
                        {1, threads, 0}, stream_, s_, tiles_, capacity_rule());
        !s)
      return s;
    // the priority keys are read only by the reroute order's sort
    return launch("count_grant_kernel", kernels::count_grant_kernel<threads>,
                  {grid, threads, kernels::count_grant_shared_bytes(threads, s_.experts)}, stream_,
                  s_, tiles_, reroutes(cfg_));
  }

  /// Every other priority: keys, the grant sort, segment starts, capacity, the first C.
  [[nodiscard]] status grant_by_sort() {
    const auto& d = cfg_.dispatch;
    if (auto s = run("dispatch_keys_kernel", kernels::dispatch_keys_kernel<threads>, s_.n, d.prio,
                     d.random_seed, d.random_offset, key_bits_);
        !s)
      return s;
    const std::int64_t segments = s_.groups * s_.experts;
    if (auto s = sort(key_bits_ + bits_for_value(static_cast<std::uint64_t>(segments))); !s)
      return s;
    if (auto s = segment_starts(key_bits_, segments); !s) return s;
    if (auto s = launch("dispatch_capacity_kernel", kernels::dispatch_capacity_kernel<threads>,
                        {1, threads, 0}, stream_, s_, capacity_rule());
        !s)
      return s;
    return run("dispatch_grant_kernel", kernels::dispatch_grant_kernel<threads>, s_.n, sorted_keys_,
               sorted_vals_, key_bits_);
  }

  /// A grid-stride kernel over `items` items, with the state as its first argument.
  template <class... Params, class... Args>
  [[nodiscard]] status run(const char* name, void (*kernel)(Params...), std::int64_t items,
                           Args&&... args) {
    return launch(name, kernel, {grid_for(items, threads), threads, 0}, stream_, s_,
                  std::forward<Args>(args)...);
  }

  [[nodiscard]] status segment_starts(int shift, std::int64_t groups) {
    return launch("segment_starts_kernel", kernels::segment_starts_kernel<threads>,
                  {grid_for(groups + 1, threads), threads, 0}, stream_, sorted_keys_, s_.n, shift,
                  groups, s_.scratch.d_seg);
  }

  /// A CUB device call, made twice as CUB wants (size, then run), its temporary storage taken
  /// from the bound the workspace reserves.
  template <class Call>
  [[nodiscard]] status cub_call(const char* name, Call&& call) {
    std::size_t bytes = 0;
    if (auto s = from_cuda(call(nullptr, bytes), name); !s) return s;
    if (bytes > s_.scratch.cub_bytes)
      return status::make(status_code::workspace_too_small,
                          std::string(name) + " wants " + std::to_string(bytes) +
                              " bytes, the bound reserves " + std::to_string(s_.scratch.cub_bytes) +
                              " (please report)");
    return from_cuda(call(s_.scratch.d_cub, bytes), name);
  }

  /// Stable LSD radix sort of (keys_a, vals_a) over bits [0, end_bit); the sorted arrays are
  /// where CUB's double buffer left them.
  [[nodiscard]] status sort(int end_bit) {
    const dispatch_scratch& w = s_.scratch;
    cub::DoubleBuffer<std::uint64_t> keys(w.d_keys_a, w.d_keys_b);
    cub::DoubleBuffer<std::int32_t> vals(w.d_vals_a, w.d_vals_b);
    if (auto s = cub_call("cub::DeviceRadixSort::SortPairs",
                          [&](void* tmp, std::size_t& bytes) {
                            return cub::DeviceRadixSort::SortPairs(tmp, bytes, keys, vals,
                                                                   static_cast<int>(s_.n), 0,
                                                                   end_bit, stream_);
                          });
        !s)
      return s;
    sorted_keys_ = keys.Current();
    sorted_vals_ = vals.Current();
    return status::success();
  }

  /// Blocks of the counting grant's tile kernels (each strides over the tiles beyond).
  static constexpr unsigned max_tile_blocks = 4096;

  const routing_config& cfg_;
  cudaStream_t stream_;
  dispatch_tiling tiles_;
  kernels::dispatch_state s_{};
  int key_bits_ = 32;
  int group_bits_ = 0;
  const std::uint64_t* sorted_keys_ = nullptr;
  const std::int32_t* sorted_vals_ = nullptr;
};

/// Whether the dispatch of T tokens runs in one block: a counting priority, one capacity group,
/// no reroute, slots in grant order (token-major grants by token index too), and a batch and
/// expert count within the one-block kernel's bounds.
[[nodiscard]] inline bool dispatch_in_one_block(const routing_config& cfg, std::int64_t tokens,
                                                const dispatch_tiling& tiles) {
  const bool slots_granted =
      cfg.dispatch.slots == slot_order::priority || cfg.dispatch.prio == priority::token_major;
  return tiles.counting() && cfg.capacity_groups(tokens) == 1 && !reroutes(cfg) && slots_granted &&
         tokens * cfg.top_k <= kernels::one_block_max_assignments &&
         cfg.num_experts <= kernels::one_block_max_experts;
}

}  // namespace detail

/// @brief Capacity assignment for a batch, bit-identical to reference::dispatch on the same
///        gating output.
/// @param cfg        the config the gating ran with
/// @param p          shapes, inputs and outputs (see dispatch_params)
/// @param d_workspace     device buffer of at least dispatch_workspace_bytes(cfg, p.tokens),
///                        8-byte aligned (cudaMalloc's 256 is best)
/// @param workspace_bytes its size
/// @param stream     stream to run on (last)
/// @return success; invalid_* from validate() (or a misaligned workspace); workspace_too_small;
///         cuda_error.
/// @note Asynchronous: no allocation, no synchronisation, graph-capturable. T = 0 returns
///       success and writes nothing. Grant order per expert follows the priority key
///       (token_major (t, j); choice_major (j, t); score_per_expert (-gate, t, j); random
///       (-U, t, j)); dropped assignments are rerouted in the global order of the same key.
///       Precondition (as the gating stage guarantees): ids of a token are distinct and in
///       [0, E), reroute candidates distinct from them and from each other.
[[nodiscard]] inline status dispatch(const routing_config& cfg, const dispatch_params& p,
                                     void* d_workspace, std::size_t workspace_bytes,
                                     cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  if (auto s = detail::validate_workspace("dispatch", "dispatch_workspace_bytes", p.tokens,
                                          dispatch_workspace_bytes(cfg, p.tokens), d_workspace,
                                          workspace_bytes);
      !s)
    return s;
  workspace_carver carver(d_workspace, workspace_bytes);
  const dispatch_tiling tiles = dispatch_tiles(cfg, p.tokens);
  const dispatch_scratch w =
      carve_dispatch_scratch(carver, p.tokens, cfg.top_k, cfg.num_experts, cfg.total_experts(),
                             cfg.capacity_groups(p.tokens), tiles);
  detail::dispatch_run run(cfg, p, w, tiles, stream);
  if (detail::dispatch_in_one_block(cfg, p.tokens, tiles)) return run.one_block();

  if (auto s = run.grant(); !s) return s;
  const bool rerouted = detail::reroutes(cfg);
  if (rerouted)
    if (auto s = run.pending_order(); !s) return s;
  if (cfg.dispatch.dropped == drop_policy::fallback)
    if (auto s = run.fallback(); !s) return s;
  if (detail::reroutes_next_choice(cfg))
    if (auto s = run.next_choice(); !s) return s;
  // token-major grants each expert's slots in token order already; only a reroute, which
  // appends slots in reroute order, needs them renumbered
  const bool renumber = cfg.dispatch.slots == slot_order::token_index &&
                        (rerouted || cfg.dispatch.prio != priority::token_major);
  if (renumber) {
    if (auto s = run.renumber(); !s) return s;
  } else if (cfg.capacity_groups(p.tokens) > 1) {
    if (auto s = run.rebase(); !s) return s;
  }
  return run.finalize();
}

}  // namespace moeroute::cuda
