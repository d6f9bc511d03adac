// SPDX-License-Identifier: Apache-2.0
// Launchers: the training backward passes on the GPU, the twins of reference/backward.hpp —
// router-logit gradients (routing + aux + z-loss in one kernel), combine backward, permute
// backward, and the expert-bias update. Formulas in docs/numerics.md ("Gradients").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/common.cuh>
#include <moeroute/dtype.hpp>
#include <moeroute/kernels/backward.cuh>
#include <moeroute/status.hpp>

namespace moeroute::cuda {

// ---------------------------------------------------------------------------------------------
// Router logits

/// @brief Inputs and output of cuda::logit_grads. Shapes: T = tokens, E = cfg.num_experts,
///        k = cfg.top_k. The forward's ids, fates and sums come from cuda::gating / dispatch.
struct logit_grads_params {
  const void* d_logits = nullptr;              ///< [T, E] router logits, element type logits_dtype
  moeroute::dtype logits_dtype = moeroute::dtype::f32;  ///< f32, f16 or bf16
  std::int64_t tokens = 0;                     ///< T
  const std::uint8_t* d_valid = nullptr;       ///< [T] uint8 1 = real token; null = all valid
  const std::int32_t* d_ids = nullptr;         ///< [T, k] int32 expert ids (gating_params::d_ids)
  const std::uint8_t* d_fate = nullptr;        ///< [T, k] uint8 moeroute::fate (dispatch)
  const float* d_grad_weight = nullptr;        ///< [T, k] f32 dL/d combine weight; null = no routing term
  const std::int64_t* d_aux_count = nullptr;   ///< [E] int64 aux counts (gating); null = no aux term
  const std::int64_t* d_valid_tokens = nullptr;///< [1] int64 valid tokens (gating); null = T
  const std::int64_t* d_seq_count = nullptr;   ///< [S, E] int64 (gating), S = T / loss.sequence_length
  const std::int64_t* d_seq_tokens = nullptr;  ///< [S] int64 valid tokens per sequence (gating)
  double routing_weight = 1.0;  ///< multiplies d_grad_weight (logit_grad_weights::routing)
  double aux_weight = 1.0;      ///< dL/d aux loss; 0 = no aux term (loss.aux_coefficient applies)
  /// dL/d sequence aux loss; used when loss.sequence_length > 0 (needs d_seq_count, d_seq_tokens)
  double sequence_aux_weight = 1.0;
  double z_weight = 1.0;        ///< dL/d z-loss; 0 = no z term (loss.z_coefficient applies)
  bool accumulate = true;       ///< add into d_grad_logits (true) or overwrite it
  float* d_grad_logits = nullptr;              ///< [T, E] f32 out
};

[[nodiscard]] inline status validate(const routing_config& cfg, const logit_grads_params& p) {
  if (auto s = moeroute::validate(cfg); !s) return s;
  if (auto s = validate_tokens(cfg, p.tokens); !s) return s;
  auto missing = [](const char* name, const char* when) {
    return status::make(status_code::invalid_argument, std::string(name) + " is null " + when);
  };
  if (p.logits_dtype != dtype::f32 && p.logits_dtype != dtype::f16 && p.logits_dtype != dtype::bf16)
    return status::make(status_code::invalid_argument, "logits_dtype: must be f32, f16 or bf16");
  if (p.tokens == 0) return status::success();
  const char* when = "with tokens > 0";
  if (!p.d_logits) return missing("d_logits", when);
  if (!p.d_grad_logits) return missing("d_grad_logits", when);
  if (p.d_grad_weight) {
    if (!p.d_ids) return missing("d_ids", "with d_grad_weight");
    if (!p.d_fate) return missing("d_fate", "with d_grad_weight");
  }
  if (p.aux_weight != 0.0 && cfg.loss.aux_coefficient != 0.0f && !p.d_aux_count)
    return missing("d_aux_count", "with an aux term (aux_weight and loss.aux_coefficient non-zero)");
  if (cfg.loss.sequence_length > 0 && p.sequence_aux_weight != 0.0 && cfg.loss.aux_coefficient != 0.0f) {
    if (!p.d_seq_count) return missing("d_seq_count", "with a sequence-aux term (loss.sequence_length > 0)");
    if (!p.d_seq_tokens) return missing("d_seq_tokens", "with a sequence-aux term (loss.sequence_length > 0)");
  }
  return status::success();
}

/// @brief d logits [T, E] of the routing term (d_grad_weight through the gates: score function,
///        renormalisation before / after drop with the FLT_EPSILON clamp, scaling, noise as a
///        constant), the batch aux loss (through P only), the sequence aux loss (when
///        loss.sequence_length > 0) and the z-loss, added per element in that order into
///        d_grad_logits (or written, accumulate = false). Same formulas and order as
///        reference::accumulate_logit_grads; math in double.
/// @return success, invalid_* (naming the field) or cuda_error.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. One thread per
///       token, fixed order: bitwise reproducible. Cost O(E k + S) per token. T = 0: no-op.
///       Padding tokens get 0 (written) or nothing (accumulate). Non-finite logits get 0.
inline status logit_grads(const routing_config& cfg, const logit_grads_params& p,
                          cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  const auto& g = cfg.gating;
  kernels::logit_grads_args a;
  a.logits = p.d_logits;
  a.tokens = p.tokens;
  a.experts = cfg.num_experts;
  a.k = cfg.top_k;
  a.valid = p.d_valid;
  a.ids = p.d_ids;
  a.fate = p.d_fate;
  a.grad_weight = p.d_grad_weight;
  a.valid_tokens = p.d_valid_tokens;
  a.score = static_cast<int>(g.score);
  a.softmax_after = g.score == score_function::softmax && g.stage == softmax_stage::after_topk;
  a.before_drop = g.renorm == renormalize::before_drop && !a.softmax_after;
  a.after_drop = g.renorm == renormalize::after_drop;
  a.renorm_epsilon = g.renorm_epsilon;
  a.scaling_factor = g.scaling_factor;
  a.noisy_gates = cfg.noise_active() && g.noise.target == noise_target::selection_and_gates;
  a.gaussian = g.noise.kind == noise_kind::gaussian;
  a.noise_scale = g.noise.scale;
  a.noise_seed = g.noise.seed;
  a.noise_offset = g.noise.offset;
  a.routing_weight = p.routing_weight;
  const bool aux = p.aux_weight != 0.0 && cfg.loss.aux_coefficient != 0.0f;
  a.aux_count = aux ? p.d_aux_count : nullptr;
  a.aux_weight = aux ? p.aux_weight * cfg.loss.aux_coefficient * aux_loss_scale(cfg) : 0.0;
  const bool seq = cfg.loss.sequence_length > 0 && p.sequence_aux_weight != 0.0 &&
                   cfg.loss.aux_coefficient != 0.0f;
  if (seq) {
    a.seq_count = p.d_seq_count;
    a.seq_tokens = p.d_seq_tokens;
    a.sequences = p.tokens / cfg.loss.sequence_length;
    a.seq_len = cfg.loss.sequence_length;
    a.seq_weight = p.sequence_aux_weight * cfg.loss.aux_coefficient * aux_loss_scale(cfg);
  }
  a.z_weight = cfg.loss.z_coefficient != 0.0f ? p.z_weight * cfg.loss.z_coefficient : 0.0;
  a.accumulate = p.accumulate;
  a.grad_logits = p.d_grad_logits;
  constexpr int threads = 128;
  const unsigned blocks = grid_for(p.tokens, threads);
  switch (p.logits_dtype) {
    case dtype::f16: kernels::logit_grads_kernel<__half><<<blocks, threads, 0, stream>>>(a); break;
    case dtype::bf16: kernels::logit_grads_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(a); break;
    default: kernels::logit_grads_kernel<float><<<blocks, threads, 0, stream>>>(a); break;
  }
  return last_launch("logit_grads_kernel");
}

// ---------------------------------------------------------------------------------------------
// Combine and permute

/// @brief Inputs and outputs of cuda::combine_backward. Element = float, __half or __nv_bfloat16.
template <class Element>
struct combine_backward_params {
  const Element* d_expert_out = nullptr;          ///< [rows, d] the experts' outputs (forward input)
  const Element* d_dy = nullptr;                  ///< [T, d] dL/dy
  const std::int32_t* d_row_token = nullptr;      ///< [rows] int32 token of each row, -1 = padding
  const std::int64_t* d_assignment_row = nullptr; ///< [T, k] int64 row of each assignment, -1 = none
  const float* d_weight = nullptr;                ///< [T, k] f32 combine weights (dispatch)
  const std::uint8_t* d_fate = nullptr;           ///< [T, k] uint8 moeroute::fate (dispatch)
  std::int64_t rows = 0;
  std::int64_t tokens = 0;                        ///< T
  std::int32_t k = 0;
  std::int64_t hidden = 0;                        ///< d
  drop_policy dropped = drop_policy::zero_weight; ///< residual: d x gets dy of passed-through tokens
  Element* d_grad_expert_out = nullptr;           ///< [rows, d] out (padding rows 0)
  float* d_grad_weight = nullptr;                 ///< [T, k] f32 out (0 for dropped / masked)
  Element* d_grad_x = nullptr;                    ///< [T, d] out or null: residual pass-through, else 0
};

template <class Element>
[[nodiscard]] status validate(const combine_backward_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>, "Element must be float, __half or __nv_bfloat16");
  auto bad = [](status_code c, std::string m) { return status::make(c, std::move(m)); };
  if (p.tokens < 0) return bad(status_code::invalid_shape, "tokens = " + std::to_string(p.tokens) + ": must be >= 0");
  if (p.rows < 0) return bad(status_code::invalid_shape, "rows = " + std::to_string(p.rows) + ": must be >= 0");
  if (p.k < 1) return bad(status_code::invalid_shape, "k = " + std::to_string(p.k) + ": must be >= 1");
  if (p.hidden < 1 || p.hidden > max_hidden)
    return bad(status_code::invalid_shape, "hidden = " + std::to_string(p.hidden) + ": must be in [1, 2^20]");
  if (p.rows > 0) {
    if (!p.d_expert_out) return bad(status_code::invalid_argument, "d_expert_out is null with rows > 0");
    if (!p.d_row_token) return bad(status_code::invalid_argument, "d_row_token is null with rows > 0");
    if (!p.d_grad_expert_out) return bad(status_code::invalid_argument, "d_grad_expert_out is null with rows > 0");
  }
  // The [T, .] inputs are empty with T = 0; rows may still be E * C > 0 (min_capacity), all of
  // them padding then, and the rows kernel reads nothing but row_token for a padding row.
  if (p.tokens > 0) {
    if (!p.d_dy) return bad(status_code::invalid_argument, "d_dy is null with tokens > 0");
    if (!p.d_assignment_row) return bad(status_code::invalid_argument, "d_assignment_row is null with tokens > 0");
    if (!p.d_weight) return bad(status_code::invalid_argument, "d_weight is null with tokens > 0");
    if (!p.d_fate) return bad(status_code::invalid_argument, "d_fate is null with tokens > 0");
    if (!p.d_grad_weight) return bad(status_code::invalid_argument, "d_grad_weight is null with tokens > 0");
  }
  return status::success();
}

/// @brief Combine backward: d expert_out (bitwise equal to reference::combine_backward: fp32,
///        rank order, no fma), d weight (warp dot products, fixed butterfly: reproducible, within
///        fp32 rounding of the reference) and the residual d x.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. No workspace.
///       T = 0: the [T, .] pointers may be null; d_grad_expert_out (all padding rows) gets 0.
template <class Element>
status combine_backward(const combine_backward_params<Element>& p, cudaStream_t stream = nullptr) {
  if (auto s = validate(p); !s) return s;
  const int threads = static_cast<int>(std::clamp<std::int64_t>((p.hidden + 31) / 32 * 32, 32, 256));
  if (p.rows > 0) {
    const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(p.rows, 65535LL * 16));
    kernels::combine_backward_rows_kernel<Element><<<blocks, threads, 0, stream>>>(
        p.d_dy, p.d_row_token, p.d_assignment_row, p.d_weight, p.rows, p.k, p.hidden, p.d_grad_expert_out);
    if (auto s = last_launch("combine_backward_rows_kernel"); !s) return s;
  }
  if (p.tokens > 0) {
    const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(p.tokens, 65535LL * 16));
    kernels::combine_backward_tokens_kernel<Element><<<blocks, 128, 0, stream>>>(
        p.d_dy, p.d_expert_out, p.d_assignment_row, p.d_fate, p.tokens, p.k, p.hidden,
        p.dropped == drop_policy::residual, p.d_grad_weight, p.d_grad_x);
    if (auto s = last_launch("combine_backward_tokens_kernel"); !s) return s;
  }
  return status::success();
}

/// @brief Inputs and outputs of cuda::permute_backward.
template <class Element>
struct permute_backward_params {
  const Element* d_grad_buf = nullptr;            ///< [rows, d] dL/d expert-buffer rows
  const std::int64_t* d_assignment_row = nullptr; ///< [T, k] int64, -1 = none
  std::int64_t tokens = 0;                        ///< T
  std::int32_t k = 0;
  std::int64_t hidden = 0;                        ///< d
  bool accumulate = false;                        ///< add into d_grad_x (e.g. on the residual part)
  Element* d_grad_x = nullptr;                    ///< [T, d] out
};

template <class Element>
[[nodiscard]] status validate(const permute_backward_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>, "Element must be float, __half or __nv_bfloat16");
  auto bad = [](status_code c, std::string m) { return status::make(c, std::move(m)); };
  if (p.tokens < 0) return bad(status_code::invalid_shape, "tokens = " + std::to_string(p.tokens) + ": must be >= 0");
  if (p.k < 1) return bad(status_code::invalid_shape, "k = " + std::to_string(p.k) + ": must be >= 1");
  if (p.hidden < 1 || p.hidden > max_hidden)
    return bad(status_code::invalid_shape, "hidden = " + std::to_string(p.hidden) + ": must be in [1, 2^20]");
  if (p.tokens == 0) return status::success();
  if (!p.d_grad_buf) return bad(status_code::invalid_argument, "d_grad_buf is null with tokens > 0");
  if (!p.d_assignment_row) return bad(status_code::invalid_argument, "d_assignment_row is null with tokens > 0");
  if (!p.d_grad_x) return bad(status_code::invalid_argument, "d_grad_x is null with tokens > 0");
  return status::success();
}

/// @brief Permute backward: d x[t] = sum of d buf over token t's distinct rows in rank order
///        (fp32, no fma): bitwise equal to reference::permute_backward. No float atomics.
/// @note Asynchronous, no allocation, no synchronisation, graph-capturable. T = 0: no-op.
template <class Element>
status permute_backward(const permute_backward_params<Element>& p, cudaStream_t stream = nullptr) {
  if (auto s = validate(p); !s) return s;
  if (p.tokens == 0) return status::success();
  const int threads = static_cast<int>(std::clamp<std::int64_t>((p.hidden + 31) / 32 * 32, 32, 256));
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(p.tokens, 65535LL * 16));
  kernels::permute_backward_kernel<Element><<<blocks, threads, 0, stream>>>(
      p.d_grad_buf, p.d_assignment_row, p.tokens, p.k, p.hidden, p.accumulate, p.d_grad_x);
  return last_launch("permute_backward_kernel");
}

// ---------------------------------------------------------------------------------------------
// Expert-bias update

struct expert_bias_update_params {
  float* d_bias = nullptr;                ///< [E] f32, updated in place
  const std::int64_t* d_load = nullptr;   ///< [E] int64 loads summed over the step's micro-batches
  std::int32_t experts = 0;               ///< E
  float rate = 1e-3f;
  bool recenter = false;
};

[[nodiscard]] inline status validate(const expert_bias_update_params& p) {
  if (p.experts < 1 || p.experts > max_experts)
    return status::make(status_code::invalid_shape, "experts = " + std::to_string(p.experts) + ": must be in [1, 8192]");
  if (!std::isfinite(p.rate) || p.rate < 0.0f)  // as reference::update_expert_bias
    return status::make(status_code::invalid_argument, "rate = " + std::to_string(p.rate) + ": must be finite and >= 0");
  if (!p.d_bias) return status::make(status_code::invalid_argument, "d_bias is null");
  if (!p.d_load) return status::make(status_code::invalid_argument, "d_load is null");
  return status::success();
}

/// @brief bias += rate * sign(mean load - load), then optionally bias -= mean(bias); the same
///        arithmetic as reference::update_expert_bias (bitwise). Loads accumulate on the device
///        by adding each micro-batch's dispatch counts (requested) once per micro-batch.
/// @note Asynchronous, one thread (E <= 8192), no allocation, no synchronisation.
inline status expert_bias_update(const expert_bias_update_params& p, cudaStream_t stream = nullptr) {
  if (auto s = validate(p); !s) return s;
  kernels::expert_bias_update_kernel<><<<1, 1, 0, stream>>>(p.d_bias, p.d_load, p.experts, p.rate, p.recenter);
  return last_launch("expert_bias_update_kernel");
}

}  // namespace moeroute::cuda
