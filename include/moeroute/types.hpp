// SPDX-License-Identifier: Apache-2.0
// Vocabulary every backend shares: the fate of an assignment, the batch totals of a dispatch,
// the two expert-buffer layouts, and the views through which one stage's outputs reach the
// next (gating sums, gating result, dispatch result, layout result). Plain C++ with no CUDA
// header: the reference, the launchers and the kernels all include it, so a value means the
// same thing everywhere and is spelt once.
#pragma once

#include <cstdint>
#include <type_traits>

#include <moeroute/macros.hpp>

namespace moeroute {

/// What happened to one (token, choice) assignment. Stored as one byte; the kernels compare
/// against these enumerators, never against their numbers.
enum class fate : std::uint8_t {
  kept = 0,      ///< got a slot at the expert it chose
  rerouted = 1,  ///< got a slot at the fallback expert or a next-best expert
  dropped = 2,   ///< got no slot anywhere: contributes nothing
  masked = 3,    ///< belongs to a padding token (valid = 0): routed nowhere, counted apart
};

/// True for the fates whose assignment holds a row: kept and rerouted.
MOEROUTE_HOST_DEVICE constexpr bool holds_row(fate f) noexcept {
  return f == fate::kept || f == fate::rerouted;
}

/// The two expert-buffer layouts; both are row-indexed buffers [rows, d] with per-expert
/// segment offsets, and differ in where each segment starts.
enum class layout_kind : std::uint8_t {
  padded,   ///< expert e owns rows [e*C, (e+1)*C); a dedicated fallback gets its own segment
  compact,  ///< packed segments, each rounded up to a multiple of block_size
};

/// @brief Batch totals of one dispatch (one record, int64 fields). cuda::dispatch writes it to
///        device memory; reference::dispatch_output has the same numbers as scalar fields.
struct dispatch_totals {
  std::int64_t capacity = 0;           ///< C of each routed expert; -1 = unbounded
  std::int64_t fallback_capacity = 0;  ///< C of the dedicated fallback (-1 unbounded; 0 if none)
  std::int64_t kept = 0;
  std::int64_t rerouted = 0;
  std::int64_t dropped = 0;
  std::int64_t masked = 0;
  std::int64_t reroute_rounds = 0;  ///< rounds run by next_choice (0 otherwise)
  /// cuda::dispatch only: real tokens masked (fate::masked, counted in `masked` too) because
  /// their given ids were out of range or repeated, or a gate or priority was not finite. A
  /// launcher cannot return a status for device data without a sync; the host backends return
  /// invalid_argument for the same input instead, so this stays 0 there.
  std::int64_t invalid_tokens = 0;
};

/// @brief Multipliers dL/d(term) of the terms gating_backward adds into the logit gradient (the
///        loss coefficients of the config apply on top, as in the forward values). A weight of 0
///        skips its term.
struct gating_backward_weights {
  double routing = 1.0;       ///< multiplies d_weight (the gradient of the combine weights)
  double aux = 1.0;           ///< dL / d aux loss
  double sequence_aux = 1.0;  ///< dL / d sequence aux loss; used when loss.sequence_length > 0
  double z = 1.0;             ///< dL / d z-loss
};

// ---------------------------------------------------------------------------------------------
// Views of stage outputs. Each comes mutable (the stage that writes it) and const (the stages
// that read it); a mutable view converts to the const one, so the output of one call is the
// input of the next without copying pointers field by field. Pointers are device pointers for
// the CUDA backend. Shapes: T tokens, E routed experts, ET = E (+1 with a dedicated fallback),
// k choices, R = reroute candidates, S = T / loss.sequence_length sequences.

namespace detail {
template <class T, bool Const>
using view_ptr = std::conditional_t<Const, const T*, T*>;
}  // namespace detail

/// @brief The sums the gating stage writes for the losses (and the loss gradients).
template <bool Const>
struct basic_gating_sums {
  detail::view_ptr<double, Const> d_aux_score_sum = nullptr;       ///< [E] f64 sum_t P[t, e]
  detail::view_ptr<std::int64_t, Const> d_aux_count = nullptr;     ///< [E] int64 aux-loss counts
  detail::view_ptr<std::int64_t, Const> d_valid_tokens = nullptr;  ///< [1] int64 valid tokens
  /// [1] f64 sum_t logsumexp^2 over valid tokens: needed iff loss.z_coefficient != 0 (null:
  /// not computed; a config without a z-loss then skips the logsumexp of per-expert scores)
  detail::view_ptr<double, Const> d_z_sum_squares = nullptr;
  detail::view_ptr<std::int64_t, Const> d_nonfinite = nullptr;   ///< [1] int64 NaN/Inf logits
                                                                 ///< seen (optional)
  detail::view_ptr<double, Const> d_seq_score_sum = nullptr;     ///< [S, E] f64 (sequences only)
  detail::view_ptr<std::int64_t, Const> d_seq_count = nullptr;   ///< [S, E] int64 (sequences only)
  detail::view_ptr<std::int64_t, Const> d_seq_tokens = nullptr;  ///< [S] int64 (sequences only)

  template <bool C = Const>
  requires(!C) MOEROUTE_HOST_DEVICE operator basic_gating_sums<!C>() const noexcept {
    return {d_aux_score_sum, d_aux_count,     d_valid_tokens, d_z_sum_squares,
            d_nonfinite,     d_seq_score_sum, d_seq_count,    d_seq_tokens};
  }
};
using gating_sums = basic_gating_sums<false>;
using const_gating_sums = basic_gating_sums<true>;

/// @brief Everything the gating stage writes.
template <bool Const>
struct basic_gating_result {
  detail::view_ptr<std::int32_t, Const> d_ids = nullptr;  ///< [T, k] int32 expert ids, best first
  detail::view_ptr<float, Const> d_gates = nullptr;       ///< [T, k] f32 pre-drop gates
  detail::view_ptr<std::int32_t, Const> d_reroute_ids = nullptr;  ///< [T, R] int32 (next_choice)
  /// [T] f32 logsumexp of the clean logits (optional: null = not written)
  detail::view_ptr<float, Const> d_logsumexp = nullptr;
  basic_gating_sums<Const> sums{};  ///< the loss sums
  /// [T] f32 the token's top-1 clean score (priority::batch_prioritized only, else unused)
  detail::view_ptr<float, Const> d_token_priority = nullptr;
  /// [T] uint8 1 = the second choice lost the draw (second_expert_policy::random only)
  detail::view_ptr<std::uint8_t, Const> d_second_skipped = nullptr;
  /// Optional per-token aux-loss inputs, for a caller computing its own loss; written only
  /// when given (no cost otherwise). A padding token gets a row of 0 and ids of -1, so the
  /// rows add up to sums.d_aux_score_sum / d_aux_count.
  /// [T, E] f32 P[t, e]: the score row the aux loss averages (softmax of the clean logits, or
  /// the normalised per-expert scores)
  detail::view_ptr<float, Const> d_aux_scores = nullptr;
  /// [T, c] int32 the experts token t counts for, c = 1 (aux_counts::top1) or k: its routed
  /// choices or a fresh top-c of P (aux_count_source), best first
  detail::view_ptr<std::int32_t, Const> d_aux_count_ids = nullptr;

  template <bool C = Const>
  requires(!C) MOEROUTE_HOST_DEVICE operator basic_gating_result<!C>() const noexcept {
    return {d_ids,          d_gates,          d_reroute_ids,    d_logsumexp,
            sums,           d_token_priority, d_second_skipped, d_aux_scores,
            d_aux_count_ids};
  }
};
using gating_result = basic_gating_result<false>;
using const_gating_result = basic_gating_result<true>;

/// @brief Everything the dispatch stage writes.
template <bool Const>
struct basic_dispatch_result {
  detail::view_ptr<std::int32_t, Const> d_expert =
      nullptr;                                             ///< [T, k] int32 final expert, -1 = none
  detail::view_ptr<std::int32_t, Const> d_slot = nullptr;  ///< [T, k] int32 slot there, -1 = none
  detail::view_ptr<float, Const> d_weight = nullptr;       ///< [T, k] f32 combine weight
  detail::view_ptr<fate, Const> d_fate = nullptr;          ///< [T, k] moeroute::fate
  detail::view_ptr<std::int64_t, Const> d_requested = nullptr;  ///< [E] by the expert first chosen
  detail::view_ptr<std::int64_t, Const> d_kept = nullptr;       ///< [E]
  detail::view_ptr<std::int64_t, Const> d_rerouted = nullptr;   ///< [E]
  detail::view_ptr<std::int64_t, Const> d_dropped = nullptr;    ///< [E]
  detail::view_ptr<std::int64_t, Const> d_received = nullptr;   ///< [ET] reroutes landing at e
  detail::view_ptr<std::int64_t, Const> d_load = nullptr;       ///< [ET] slots in use at e
  detail::view_ptr<dispatch_totals, Const> d_totals = nullptr;  ///< [1] capacity and totals

  template <bool C = Const>
  requires(!C) MOEROUTE_HOST_DEVICE operator basic_dispatch_result<!C>() const noexcept {
    return {d_expert,   d_slot,    d_weight,   d_fate, d_requested, d_kept,
            d_rerouted, d_dropped, d_received, d_load, d_totals};
  }
};
using dispatch_result = basic_dispatch_result<false>;
using const_dispatch_result = basic_dispatch_result<true>;

/// @brief Everything the layout stage writes. The row count depends on device data, so the
///        buffers are sized for an upper bound (max_rows) and d_num_rows holds the real count.
template <bool Const>
struct basic_layout_result {
  /// [ET + 1] first row of e ([L + 1] by local index with a local-expert view; so are
  /// rows_used and the experts block_expert names)
  detail::view_ptr<std::int64_t, Const> d_offsets = nullptr;
  detail::view_ptr<std::int64_t, Const> d_rows_used = nullptr;  ///< [ET] rows holding a token
                                                                ///< (optional)
  detail::view_ptr<std::int32_t, Const> d_row_token = nullptr;  ///< [max_rows] token, -1 = padding
  detail::view_ptr<std::int64_t, Const> d_assignment_row = nullptr;  ///< [T, k] row, -1 = none
  detail::view_ptr<std::int32_t, Const> d_block_expert = nullptr;    ///< [max_rows / block_size]
                                                                     ///< compact only (optional)
  detail::view_ptr<std::int64_t, Const> d_num_rows = nullptr;        ///< [1] rows the layout uses
  /// [1] written with a local-expert view only (layout_params::d_expert_map; optional):
  /// assignments that hold a row at an expert not held here, left out of this layout (row -1)
  detail::view_ptr<std::int64_t, Const> d_nonlocal = nullptr;

  template <bool C = Const>
  requires(!C) MOEROUTE_HOST_DEVICE operator basic_layout_result<!C>() const noexcept {
    return {d_offsets,      d_rows_used, d_row_token, d_assignment_row,
            d_block_expert, d_num_rows,  d_nonlocal};
  }
};
using layout_result = basic_layout_result<false>;
using const_layout_result = basic_layout_result<true>;

}  // namespace moeroute
