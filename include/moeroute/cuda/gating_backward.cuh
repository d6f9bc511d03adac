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
#include <moeroute/params/gating_backward.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

using moeroute::gating_backward_params;

/// @brief Checks config, shapes and pointers; names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const gating_backward_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");
  return check_params(cfg, p);
}

namespace detail {

/// How gating_backward spreads a token over threads: a warp (lanes over the experts, sums by
/// butterfly), a thread (small E), or a warp whose sums go lane by lane in expert order (small
/// E in a small batch: a thread's bits with 32 threads' latency).
enum class backward_lanes { warp, thread, warp_ordered };

/// The launcher's choice for E experts and T tokens: E <= 16 takes a thread per token where
/// the batch fills the GPU (a warp per token leaves most lanes idle: H200, Mixtral, T = 16384:
/// 24 us against 67), and the ordered warp below 2048 tokens, where a thread per token is
/// latency bound (13 us against 19 at T <= 1024). The two give the same bits.
[[nodiscard]] inline backward_lanes backward_lanes_for(std::int32_t E, std::int64_t T) noexcept {
  if (E > 16) return backward_lanes::warp;
  return T >= 2048 ? backward_lanes::thread : backward_lanes::warp_ordered;
}

/// gating_backward with the lanes given (tests run both small-E layouts on the same inputs).
template <class Element>
[[nodiscard]] status gating_backward_with(const routing_config& cfg,
                                          const gating_backward_params<Element>& p,
                                          backward_lanes lanes, cudaStream_t stream) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  if (lanes == backward_lanes::warp_ordered && cfg.num_experts > 32)
    return status::make(status_code::invalid_argument,
                        "gating_backward: an ordered warp per token needs num_experts <= 32");
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
    a.seq_order = cfg.loss.sequence_order;
    a.seq_sum = cfg.loss.sequence_reduce == sequence_reduction::sum;
    a.seq_weight = p.weights.sequence_aux * cfg.loss.aux_coefficient * scale;
  }
  a.z_weight = cfg.loss.z_coefficient != 0.0f ? p.weights.z * cfg.loss.z_coefficient : 0.0;
  a.accumulate = p.accumulate;
  a.grad_logits = p.d_grad_logits;
  constexpr int threads = 128;
  switch (lanes) {
    case backward_lanes::thread:
      return launch("gating_backward_kernel", kernels::gating_backward_kernel<Element, 1>,
                    {grid_for(p.tokens, threads), threads, 0}, stream, a);
    case backward_lanes::warp_ordered:
      return launch("gating_backward_kernel", kernels::gating_backward_kernel<Element, 32, true>,
                    {grid_for(p.tokens, threads / 32), threads, 0}, stream, a);
    case backward_lanes::warp:
      break;
  }
  return launch("gating_backward_kernel", kernels::gating_backward_kernel<Element, 32>,
                {grid_for(p.tokens, threads / 32), threads, 0}, stream, a);
}

}  // namespace detail

/// @brief d logits [T, E] of the routing term (d_grad_weight through the gates: score function,
///        renormalisation before / after drop with the FLT_EPSILON clamp, scaling, noise as a
///        constant), the batch aux loss (through P only), the sequence aux loss (when
///        loss.sequence_length > 0) and the z-loss, added per element in that order into
///        d_grad_logits (or written, accumulate = false). Same formulas and order as
///        reference::gating_backward; math in double.
/// @return success, invalid_* (naming the field) or cuda_error.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. One warp per
///       token (for E <= 16 a thread per token from T = 2048, below that a warp whose sums
///       go in expert order: the same bits), fixed order (each sum over the experts: strided
///       lane parts, then a fixed butterfly): bitwise reproducible, within ~1e-16 relative of
///       the reference's sequential double sums before the float rounding (equal in order for
///       E <= 16). Cost O(E k + S) per token. T = 0: no-op.
template <class Element>
[[nodiscard]] status gating_backward(const routing_config& cfg,
                                     const gating_backward_params<Element>& p,
                                     cudaStream_t stream = nullptr) {
  return detail::gating_backward_with(cfg, p, detail::backward_lanes_for(cfg.num_experts, p.tokens),
                                      stream);
}

}  // namespace moeroute::cuda
