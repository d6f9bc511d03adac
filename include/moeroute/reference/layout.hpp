// SPDX-License-Identifier: Apache-2.0
// CPU reference, stage 3: expert-buffer layouts. Both layouts are row-indexed buffers
// [num_rows, d]; they differ in where each expert's segment starts:
//   padded  — expert e owns rows [e*C, (e+1)*C) (a dedicated fallback gets its own segment);
//   compact — segments are packed, each rounded up to a multiple of block_size (the layout
//             vLLM's moe_align_block_size produces for a grouped GEMM).
// Row of an assignment = offsets[final expert] + slot; rows nobody holds are padding (-1).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::reference {

/// @brief An expert-buffer layout: which token each row holds and which row each assignment
///        uses (the owning twin of moeroute::layout_result).
struct layout_output {
  layout_kind kind = layout_kind::padded;
  std::int32_t total_experts = 0;
  std::int64_t num_rows = 0;
  std::int64_t block_size = 1;               ///< compact: segment alignment; padded: 1
  std::vector<std::int64_t> offsets;         ///< [total_experts + 1] first row of each expert
  std::vector<std::int64_t> rows_used;       ///< [total_experts] rows holding a token
  std::vector<std::int32_t> row_token;       ///< [num_rows] token of each row, -1 = padding
  std::vector<std::int64_t> assignment_row;  ///< [T, k] row of each assignment, -1 = none
  std::vector<std::int32_t> block_expert;    ///< [num_rows / block_size] expert of each block
                                             ///< (compact only; empty for padded)
  /// local_layout only: assignments held at experts of other ranks (row -1 here); the
  /// segments (offsets, rows_used, block_expert, total_experts) are then the local experts
  std::int64_t nonlocal = 0;
  [[nodiscard]] std::int64_t padding_rows() const noexcept {
    std::int64_t used = 0;
    for (auto u : rows_used) used += u;
    return num_rows - used;
  }
};

namespace detail {
/// A dispatch_output whose arrays have their documented lengths (a layout indexes them all).
inline void check_dispatch_output(const dispatch_output& dsp) {
  const auto bad = [](status_code c, const std::string& m) { throw error(status::make(c, m)); };
  if (dsp.tokens < 0 || dsp.tokens > max_tokens || dsp.k < 1 || dsp.experts < 1 ||
      dsp.total_experts < dsp.experts || dsp.total_experts > dsp.experts + 1)
    bad(status_code::invalid_shape, "dispatch_output: tokens = " + std::to_string(dsp.tokens) +
                                        ", k = " + std::to_string(dsp.k) +
                                        ", experts = " + std::to_string(dsp.experts) +
                                        ", total_experts = " + std::to_string(dsp.total_experts) +
                                        " are not the extents of a dispatch");
  const std::int64_t n = dsp.tokens * dsp.k;
  const auto sized = [&](const char* what, std::size_t got, std::int64_t want) {
    if (static_cast<std::int64_t>(got) != want)
      bad(status_code::invalid_shape, std::string("dispatch_output.") + what + " has " +
                                          std::to_string(got) + " elements, expected " +
                                          std::to_string(want));
  };
  sized("expert", dsp.expert.size(), n);
  sized("slot", dsp.slot.size(), n);
  sized("weight", dsp.weight.size(), n);
  sized("fates", dsp.fates.size(), n);
  sized("load", dsp.load.size(), dsp.total_experts);
  for (std::int32_t e = 0; e < dsp.total_experts; ++e)
    if (dsp.load[e] < 0 || dsp.load[e] > dsp.tokens)
      bad(status_code::invalid_argument, "dispatch_output.load[" + std::to_string(e) +
                                             "] = " + std::to_string(dsp.load[e]) +
                                             " is outside [0, tokens]");
}

inline void fill_rows(const dispatch_output& dsp, layout_output& L) {
  L.row_token.assign(L.num_rows, -1);
  L.assignment_row.assign(dsp.tokens * dsp.k, -1);
  for (std::int64_t a = 0; a < dsp.tokens * dsp.k; ++a) {
    const std::int32_t e = dsp.expert[a];
    if (e < 0) continue;
    if (e >= dsp.total_experts || dsp.slot[a] < 0 || dsp.slot[a] >= L.offsets[e + 1] - L.offsets[e])
      throw error(status::make(status_code::invalid_argument,
                               "dispatch_output: assignment " + std::to_string(a) + " has expert " +
                                   std::to_string(e) + ", slot " + std::to_string(dsp.slot[a]) +
                                   ", outside that expert's segment"));
    const std::int64_t row = L.offsets[e] + dsp.slot[a];
    L.assignment_row[a] = row;
    L.row_token[row] = static_cast<std::int32_t>(a / dsp.k);
  }
}
}  // namespace detail

/// @brief The padded or compact layout of a dispatch.
///        padded: expert e owns rows [e*C*Q, (e+1)*C*Q) for Q capacity groups (a dedicated
///        fallback expert gets a segment of its capacity, or of its load when unbounded);
///        needs a bounded capacity.
///        compact: packed segments, each rounded up to a multiple of block_size (the layout a
///        grouped GEMM over tiles of block_size rows wants).
/// @param cfg        the config the dispatch ran with
/// @param dsp        reference::dispatch's output
/// @param kind       layout_kind::padded or layout_kind::compact
/// @param block_size compact: segment alignment, >= 1; padded: must be 1
/// @return the layout; throws moeroute::error naming the bad argument.
inline layout_output layout(const routing_config& cfg, const dispatch_output& dsp, layout_kind kind,
                            std::int64_t block_size = 1) {
  detail::check_dispatch_of(cfg, dsp);
  const auto fail = [](status_code c, const std::string& m) { throw error(status::make(c, m)); };
  if (block_size < 1 || block_size > max_tokens)
    fail(status_code::invalid_argument,
         "block_size = " + std::to_string(block_size) + ": must be in [1, max_tokens]");
  if (kind == layout_kind::padded && block_size != 1)
    fail(status_code::invalid_argument,
         "block_size = " + std::to_string(block_size) + ": the padded layout takes 1");
  if (kind != layout_kind::padded && kind != layout_kind::compact)
    fail(status_code::invalid_argument, "kind: not a layout_kind");
  detail::check_dispatch_output(dsp);
  if (kind == layout_kind::padded && dsp.capacity < 0)
    fail(status_code::unsupported,
         "padded layout needs a bounded capacity; capacity_mode::unbounded works with the compact "
         "layout only (or use capacity_mode::max_load)");
  layout_output L;
  L.kind = kind;
  L.total_experts = dsp.total_experts;
  L.block_size = block_size;
  L.offsets.assign(dsp.total_experts + 1, 0);
  for (std::int32_t e = 0; e < dsp.total_experts; ++e) {
    std::int64_t seg = 0;
    if (kind == layout_kind::compact) {
      seg = (dsp.load[e] + block_size - 1) / block_size * block_size;
    } else {
      // C per capacity group, for each group of the batch
      const std::int64_t cap = e < dsp.experts ? dsp.capacity : dsp.fallback_capacity;
      seg = cap < 0 ? dsp.load[e] : expert_slots(cfg, dsp.tokens, cap);
    }
    L.offsets[e + 1] = L.offsets[e] + seg;
  }
  L.num_rows = L.offsets.back();
  L.rows_used = dsp.load;
  if (kind == layout_kind::compact) {
    L.block_expert.assign(L.num_rows / block_size, 0);
    for (std::int32_t e = 0; e < dsp.total_experts; ++e)
      for (std::int64_t b = L.offsets[e] / block_size; b < L.offsets[e + 1] / block_size; ++b)
        L.block_expert[b] = e;
  }
  detail::fill_rows(dsp, L);
  return L;
}

/// @brief The compact layout of the experts held here — a local-expert view for an engine that
///        runs its own expert-parallel exchange (vLLM's expert_map): expert_map
///        [total_experts] holds each held expert's local index (each of 0 .. L-1 exactly once)
///        and -1 for the others. Segments of the L local experts in local index order, each
///        rounded up to block_size; total_experts, offsets, rows_used and block_expert are by
///        local index; an assignment held at another expert gets row -1 and is counted in
///        `nonlocal`.
/// @return the layout; throws moeroute::error naming the bad argument.
inline layout_output local_layout(const routing_config& cfg, const dispatch_output& dsp,
                                  std::int64_t block_size,
                                  std::span<const std::int32_t> expert_map) {
  const auto fail = [](status_code c, const std::string& m) { throw error(status::make(c, m)); };
  if (static_cast<std::int64_t>(expert_map.size()) != dsp.total_experts)
    fail(status_code::invalid_shape,
         "expert_map has " + std::to_string(expert_map.size()) +
             " entries, expected total_experts = " + std::to_string(dsp.total_experts));
  detail::check_dispatch_of(cfg, dsp);
  if (block_size < 1 || block_size > max_tokens)
    fail(status_code::invalid_argument,
         "block_size = " + std::to_string(block_size) + ": must be in [1, max_tokens]");
  detail::check_dispatch_output(dsp);
  std::int32_t local = 0;
  for (const std::int32_t l : expert_map) local += l >= 0 ? 1 : 0;
  std::vector<std::int32_t> global_of(static_cast<std::size_t>(local), -1);
  for (std::size_t e = 0; e < expert_map.size(); ++e) {
    const std::int32_t l = expert_map[e];
    if (l < -1 || l >= local)
      fail(status_code::invalid_argument,
           "expert_map[" + std::to_string(e) + "] = " + std::to_string(l) +
               " is outside [-1, local experts = " + std::to_string(local) + ")");
    if (l < 0) continue;
    if (global_of[l] >= 0)
      fail(status_code::invalid_argument,
           "expert_map[" + std::to_string(e) + "] = " + std::to_string(l) +
               ": local index already held by expert " + std::to_string(global_of[l]));
    global_of[l] = static_cast<std::int32_t>(e);
  }
  layout_output L;
  L.kind = layout_kind::compact;
  L.total_experts = local;
  L.block_size = block_size;
  L.offsets.assign(static_cast<std::size_t>(local) + 1, 0);
  L.rows_used.assign(static_cast<std::size_t>(local), 0);
  for (std::int32_t l = 0; l < local; ++l) {
    const std::int64_t load = dsp.load[global_of[l]];
    L.rows_used[l] = load;
    L.offsets[l + 1] = L.offsets[l] + (load + block_size - 1) / block_size * block_size;
  }
  L.num_rows = L.offsets.back();
  L.block_expert.assign(static_cast<std::size_t>(L.num_rows / block_size), 0);
  for (std::int32_t l = 0; l < local; ++l)
    for (std::int64_t b = L.offsets[l] / block_size; b < L.offsets[l + 1] / block_size; ++b)
      L.block_expert[b] = l;
  L.row_token.assign(static_cast<std::size_t>(L.num_rows), -1);
  L.assignment_row.assign(dsp.expert.size(), -1);
  for (std::size_t a = 0; a < dsp.expert.size(); ++a) {
    const std::int32_t e = dsp.expert[a];
    if (e < 0) continue;
    if (e >= dsp.total_experts || dsp.slot[a] < 0 ||
        dsp.slot[a] >= (dsp.load[e] + block_size - 1) / block_size * block_size)
      fail(status_code::invalid_argument,
           "dispatch_output: assignment " + std::to_string(a) + " has expert " + std::to_string(e) +
               ", slot " + std::to_string(dsp.slot[a]) + ", outside that expert's segment");
    const std::int32_t l = expert_map[e];
    if (l < 0) {
      ++L.nonlocal;
      continue;
    }
    const std::int64_t row = L.offsets[l] + dsp.slot[a];
    L.assignment_row[a] = row;
    L.row_token[row] = static_cast<std::int32_t>(a / static_cast<std::size_t>(dsp.k));
  }
  return L;
}

}  // namespace moeroute::reference
