// SPDX-License-Identifier: Apache-2.0
// Launcher: the router-logit gradient on the GPU (the CUDA twin of reference::gating_backward):
// the routing term (d combine weight through the gates) and the aux, sequence-aux and z-loss
// terms, in one kernel. Formulas in docs/numerics.md ("Gradients").
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/kernels/element.cuh>
#include <moeroute/kernels/gating_backward.cuh>
#include <moeroute/kernels/gating_semantics.cuh>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

/// @brief Inputs and output of cuda::gating_backward. Shapes: T = tokens, E = cfg.num_experts,
///        k = cfg.top_k, S = T / loss.sequence_length. The forward's ids, fates and sums come from
///        cuda::gating / cuda::dispatch (or all-reduced sums of a batch sharded over ranks).
/// @tparam Element the logits' type: float, __half or __nv_bfloat16
template <class Element>
struct gating_backward_params {
  const Element* d_logits = nullptr;      ///< [T, E] router logits (the forward's input)
  std::int64_t tokens = 0;                ///< T
  const std::uint8_t* d_valid = nullptr;  ///< [T] uint8 1 = real token; null = all valid
  /// From cuda::gating: d_ids [T, k] (routing term); sums.d_aux_count [E] (aux term),
  /// sums.d_valid_tokens [1] (null = T), sums.d_seq_count [S, E] and sums.d_seq_tokens [S]
  /// (sequence term). The other fields are not read.
  const_gating_result gated{};
  /// From cuda::dispatch: d_fate [T, k] (routing term). The other fields are not read.
  const_dispatch_result dispatched{};
  const float* d_grad_weight = nullptr;  ///< [T, k] f32 dL/d combine weight; null = no routing term
  gating_backward_weights
      weights{};                   ///< dL/d(term); 0 skips a term (loss coefficients apply on top)
  bool accumulate = true;          ///< add into d_grad_logits (true) or overwrite it
  float* d_grad_logits = nullptr;  ///< [T, E] f32 out
};

/// @brief Checks config, shape and pointers; names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const gating_backward_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");
  if (auto s = detail::validate_extents(cfg, p.tokens); !s) return s;
  if (p.tokens == 0) return status::success();
  if (auto s = detail::require_pointers("with tokens > 0", detail::required(p.d_logits, "d_logits"),
                                        detail::required(p.d_grad_logits, "d_grad_logits"));
      !s)
    return s;
  if (p.d_grad_weight)
    if (auto s = detail::require_pointers(
            "with d_grad_weight", detail::required(p.gated.d_ids, "gated.d_ids"),
            detail::required(p.dispatched.d_fate, "dispatched.d_fate"));
        !s)
      return s;
  const bool aux = cfg.loss.aux_coefficient != 0.0f;
  if (aux && p.weights.aux != 0.0)
    if (auto s = detail::require_pointers(
            "with an aux term (weights.aux and loss.aux_coefficient non-zero)",
            detail::required(p.gated.sums.d_aux_count, "gated.sums.d_aux_count"));
        !s)
      return s;
  if (!aux || cfg.loss.sequence_length == 0 || p.weights.sequence_aux == 0.0)
    return status::success();
  return detail::require_pointers(
      "with a sequence-aux term (loss.sequence_length > 0)",
      detail::required(p.gated.sums.d_seq_count, "gated.sums.d_seq_count"),
      detail::required(p.gated.sums.d_seq_tokens, "gated.sums.d_seq_tokens"));
}

/// @brief d logits [T, E] of the routing term (d_grad_weight through the gates: score function,
///        renormalisation before / after drop with the FLT_EPSILON clamp, scaling, noise as a
///        constant), the batch aux loss (through P only), the sequence aux loss (when
///        loss.sequence_length > 0) and the z-loss, added per element in that order into
///        d_grad_logits (or written, accumulate = false). Same formulas and order as
///        reference::gating_backward; math in double.
/// @return success, invalid_* (naming the field) or cuda_error.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. One thread per
///       token, fixed order: bitwise reproducible. Cost O(E k + S) per token. T = 0: no-op.
///       Padding tokens get 0 (written) or nothing (accumulate). Non-finite logits get 0.
template <class Element>
[[nodiscard]] status gating_backward(const routing_config& cfg,
                                     const gating_backward_params<Element>& p,
                                     cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  kernels::gating_backward_args<Element> a;
  a.logits = p.d_logits;
  a.tokens = p.tokens;
  a.valid = p.d_valid;
  a.gated = p.gated;
  a.fates = p.dispatched.d_fate;
  a.grad_weight = p.d_grad_weight;
  a.sem = kernels::make_gating_semantics(cfg);
  a.routing_weight = p.weights.routing;
  const double scale = aux_loss_scale(cfg);
  if (p.weights.aux != 0.0 && cfg.loss.aux_coefficient != 0.0f)
    a.aux_weight = p.weights.aux * cfg.loss.aux_coefficient * scale;
  if (cfg.loss.sequence_length > 0 && p.weights.sequence_aux != 0.0 &&
      cfg.loss.aux_coefficient != 0.0f) {
    a.sequences = p.tokens / cfg.loss.sequence_length;
    a.seq_len = cfg.loss.sequence_length;
    a.seq_weight = p.weights.sequence_aux * cfg.loss.aux_coefficient * scale;
  }
  a.z_weight = cfg.loss.z_coefficient != 0.0f ? p.weights.z * cfg.loss.z_coefficient : 0.0;
  a.accumulate = p.accumulate;
  a.grad_logits = p.d_grad_logits;
  constexpr int threads = 128;
  return launch("gating_backward_kernel", kernels::gating_backward_kernel<Element>,
                {grid_for(p.tokens, threads), threads, 0}, stream, a);
}

}  // namespace moeroute::cuda
