// SPDX-License-Identifier: Apache-2.0
// Parameters of the gating backward pass (d logits of the routing term, the aux,
// sequence-aux and z losses),
// shared by every backend: cpu::gating_backward and cuda::gating_backward take the same struct and
// start their validate() with the same check_params(). Pointers are named d_ (data) in both: device
// memory for the CUDA backend, host memory for the CPU backend. Plain C++.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// @brief Inputs and output of gating_backward. Shapes: T = tokens, E = cfg.num_experts,
///        k = cfg.top_k, S = T / loss.sequence_length. The forward's ids, fates and sums come from
///        gating / dispatch (or all-reduced sums of a batch sharded over ranks).
/// @tparam Element the logits' type: float, __half or __nv_bfloat16
template <class Element>
struct gating_backward_params {
  const Element* d_logits = nullptr;      ///< [T, E] router logits (the forward's input)
  std::int64_t tokens = 0;                ///< T
  const std::uint8_t* d_valid = nullptr;  ///< [T] uint8 1 = real token; null = all valid
  /// From gating: d_ids [T, k] (routing term); sums.d_aux_count [E] (aux term),
  /// sums.d_valid_tokens [1] (null = T), sums.d_seq_count [S, E] and sums.d_seq_tokens [S]
  /// (sequence term). The other fields are not read.
  const_gating_result gated{};
  /// From dispatch: d_fate [T, k] (routing term). The other fields are not read.
  const_dispatch_result dispatched{};
  const float* d_grad_weight = nullptr;  ///< [T, k] f32 dL/d combine weight; null = no routing term
  gating_backward_weights
      weights{};                   ///< dL/d(term); 0 skips a term (loss coefficients apply on top)
  bool accumulate = true;          ///< add into d_grad_logits (true) or overwrite it
  float* d_grad_logits = nullptr;  ///< [T, E] f32 out
  /// [1] int64 out, optional: how many valid tokens held an id outside [0, E) in gated.d_ids
  /// (with a routing term). The CUDA backend, which cannot refuse the call without a sync,
  /// skips those tokens' routing term and counts them here; the CPU backend refuses such ids
  /// (invalid_argument naming the element) and writes 0 here when it runs. Null: not counted.
  std::int64_t* d_invalid_ids = nullptr;
};

/// @brief Checks config, shape and pointers; names the first bad field. Every backend's validate()
/// runs this first.
template <class Element>
[[nodiscard]] status check_params(const routing_config& cfg,
                                  const gating_backward_params<Element>& p) {
  if (auto s = param_checks::validate_extents(cfg, p.tokens); !s) return s;
  if (p.tokens == 0) return status::success();
  if (auto s = param_checks::require_pointers(
          "with tokens > 0", param_checks::required(p.d_logits, "d_logits"),
          param_checks::required(p.d_grad_logits, "d_grad_logits"));
      !s)
    return s;
  if (p.d_grad_weight)
    if (auto s = param_checks::require_pointers(
            "with d_grad_weight", param_checks::required(p.gated.d_ids, "gated.d_ids"),
            param_checks::required(p.dispatched.d_fate, "dispatched.d_fate"));
        !s)
      return s;
  const bool aux = cfg.loss.aux_coefficient != 0.0f;
  if (aux && p.weights.aux != 0.0)
    if (auto s = param_checks::require_pointers(
            "with an aux term (weights.aux and loss.aux_coefficient non-zero)",
            param_checks::required(p.gated.sums.d_aux_count, "gated.sums.d_aux_count"));
        !s)
      return s;
  if (!aux || cfg.loss.sequence_length == 0 || p.weights.sequence_aux == 0.0)
    return status::success();
  return param_checks::require_pointers(
      "with a sequence-aux term (loss.sequence_length > 0)",
      param_checks::required(p.gated.sums.d_seq_count, "gated.sums.d_seq_count"),
      param_checks::required(p.gated.sums.d_seq_tokens, "gated.sums.d_seq_tokens"));
}

/// @brief The same call with the logits read as `To` (same size and bits).
template <class To, class From>
[[nodiscard]] gating_backward_params<To> rebind(const gating_backward_params<From>& p) noexcept {
  gating_backward_params<To> q;
  q.d_logits = param_checks::rebind_elements<To>(p.d_logits);
  q.tokens = p.tokens;
  q.d_valid = p.d_valid;
  q.gated = p.gated;
  q.dispatched = p.dispatched;
  q.d_grad_weight = p.d_grad_weight;
  q.weights = p.weights;
  q.accumulate = p.accumulate;
  q.d_grad_logits = p.d_grad_logits;
  q.d_invalid_ids = p.d_invalid_ids;
  return q;
}

}  // namespace moeroute
