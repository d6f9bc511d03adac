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

/// @brief d logits [T, E] of the routing term (d_grad_weight through the gates: score function,
///        renormalisation before / after drop with the FLT_EPSILON clamp, scaling, noise as a
///        constant), the batch aux loss (through P only), the sequence aux loss (when
///        loss.sequence_length > 0) and the z-loss, added per element in that order into
///        d_grad_logits (or written, accumulate = false). Same formulas and order as
///        reference::gating_backward; math in double.
/// @return success, invalid_* (naming the field) or cuda_error.
/// @note A valid token whose d_ids hold an id outside [0, E) (the CPU backends refuse the
///       call) gets no routing term here and is counted in d_invalid_ids when given (zeroed
///       first, on the stream): its logits are never read at such an id.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. One warp per
///       token (one thread for E <= 16), fixed order (each sum over the experts: strided lane
///       parts, then a fixed butterfly): bitwise reproducible, within ~1e-16 relative of the
///       reference's sequential double sums before the float rounding (equal in order for
///       E <= 16). Cost O(E k + S) per token. T = 0: no-op.
///       Padding tokens get 0 (written) or nothing (accumulate). Non-finite logits get 0.
template <class Element>
[[nodiscard]] status gating_backward(const routing_config& cfg,
                                     const gating_backward_params<Element>& p,
                                     cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.d_invalid_ids != nullptr)
    if (auto s = from_cuda(cudaMemsetAsync(p.d_invalid_ids, 0, sizeof(std::int64_t), stream),
                           "cudaMemsetAsync(d_invalid_ids)");
        !s)
      return s;
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
    a.seq_order = cfg.loss.sequence_order;
    a.seq_sum = cfg.loss.sequence_reduce == sequence_reduction::sum;
    a.seq_weight = p.weights.sequence_aux * cfg.loss.aux_coefficient * scale;
  }
  a.z_weight = cfg.loss.z_coefficient != 0.0f ? p.weights.z * cfg.loss.z_coefficient : 0.0;
  a.accumulate = p.accumulate;
  a.grad_logits = p.d_grad_logits;
  a.invalid_ids = p.d_invalid_ids;
  constexpr int threads = 128;
  // a thread per token where a warp's lanes would mostly idle (its row in shared memory: 20
  // bytes an element a thread, 40 KiB a block at E = 16)
  if (cfg.num_experts <= 16)
    return launch("gating_backward_kernel", kernels::gating_backward_kernel<Element, 1, true>,
                  {grid_for(p.tokens, threads), threads,
                   kernels::gating_backward_cached_smem(threads, cfg.num_experts)},
                  stream, a);
  // a warp per token; rows of up to 512 experts keep their values in shared memory (20 bytes an
  // element a warp: 40 KiB a block at E = 512), wider ones recompute them in each pass
  if (cfg.num_experts <= kernels::gating_backward_cached_max)
    return launch("gating_backward_kernel", kernels::gating_backward_kernel<Element, 32, true>,
                  {grid_for(p.tokens, threads / 32), threads,
                   kernels::gating_backward_cached_smem(threads / 32, cfg.num_experts)},
                  stream, a);
  return launch("gating_backward_kernel", kernels::gating_backward_kernel<Element, 32>,
                {grid_for(p.tokens, threads / 32), threads, 0}, stream, a);
}

}  // namespace moeroute::cuda
