// SPDX-License-Identifier: Apache-2.0
// Launcher: fused gating on the GPU. Router logits [T, E] (f32, f16 or bf16) -> top-k expert
// ids and gates, reroute candidates, logsumexp, and the sums the aux / sequence / z losses need.
// Same semantics as reference::gate; formulas in docs/numerics.md ("Gating").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/common.cuh>
#include <moeroute/cuda/gating_workspace.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/kernels/gating.cuh>
#include <moeroute/status.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cuda {

/// @brief Inputs and outputs of one gating call. Every output is written (never added to).
///        R = cfg.candidates_per_token() - k reroute candidates; S = T / loss.sequence_length.
struct gating_params {
  const void* d_logits = nullptr;        ///< [tokens, E] router logits, element type `dtype`
  moeroute::dtype logits_dtype = moeroute::dtype::f32;  ///< f32, f16 (IEEE half) or bf16
  std::int64_t tokens = 0;               ///< T
  const float* d_bias = nullptr;         ///< [E] f32 expert bias: required iff cfg.gating.expert_bias;
                                         ///<      must be finite (not checked on the device)
  const std::uint8_t* d_valid = nullptr; ///< [tokens] uint8, 1 = real token, 0 = padding; null = all valid

  std::int32_t* d_ids = nullptr;          ///< [tokens, k] int32 expert ids, best first
  float* d_gates = nullptr;               ///< [tokens, k] f32 pre-drop gates (see reference::gating_output)
  std::int32_t* d_reroute_ids = nullptr;  ///< [tokens, R] int32 experts ranked k+1..k+R (needed iff R > 0)
  float* d_logsumexp = nullptr;           ///< [tokens] f32 logsumexp of the sanitised clean logits

  double* d_aux_score_sum = nullptr;      ///< [E] f64: sum over valid tokens of P[t, e]
  std::int64_t* d_aux_count = nullptr;    ///< [E] int64: aux-loss counts (top-1 or all k, routed or fresh)
  std::int64_t* d_valid_tokens = nullptr; ///< [1] int64: valid tokens
  double* d_z_sum_squares = nullptr;      ///< [1] f64: sum over valid tokens of logsumexp^2
  std::int64_t* d_nonfinite = nullptr;    ///< [1] int64: NaN/Inf logits seen (optional, may be null)

  double* d_seq_score_sum = nullptr;      ///< [S, E] f64 (needed iff loss.sequence_length > 0)
  std::int64_t* d_seq_count = nullptr;    ///< [S, E] int64 (needed iff loss.sequence_length > 0)
  std::int64_t* d_seq_tokens = nullptr;   ///< [S] int64 valid tokens per sequence (same condition)
};

/// @brief Checks config, shape and pointers of a gating call; names the first bad field.
[[nodiscard]] inline status validate(const routing_config& cfg, const gating_params& p) {
  if (auto s = moeroute::validate(cfg); !s) return s;
  if (auto s = validate_tokens(cfg, p.tokens); !s) return s;
  auto missing = [](const char* name, const char* when) {
    return status::make(status_code::invalid_argument, std::string(name) + " is null " + when);
  };
  if (p.logits_dtype != dtype::f32 && p.logits_dtype != dtype::f16 && p.logits_dtype != dtype::bf16)
    return status::make(status_code::invalid_argument,
                        "logits_dtype = " + std::to_string(static_cast<int>(p.logits_dtype)) +
                            ": must be f32, f16 or bf16");
  if (cfg.gating.expert_bias && p.tokens > 0 && p.d_bias == nullptr)
    return missing("d_bias", "with gating.expert_bias = true");
  if (!cfg.gating.expert_bias && p.d_bias != nullptr)
    return status::make(status_code::invalid_argument,
                        "d_bias given but gating.expert_bias is false");
  if (p.tokens == 0) return status::success();
  const char* when = "with tokens > 0";
  if (p.d_logits == nullptr) return missing("d_logits", when);
  if (p.d_ids == nullptr) return missing("d_ids", when);
  if (p.d_gates == nullptr) return missing("d_gates", when);
  if (p.d_logsumexp == nullptr) return missing("d_logsumexp", when);
  if (p.d_aux_score_sum == nullptr) return missing("d_aux_score_sum", when);
  if (p.d_aux_count == nullptr) return missing("d_aux_count", when);
  if (p.d_valid_tokens == nullptr) return missing("d_valid_tokens", when);
  if (p.d_z_sum_squares == nullptr) return missing("d_z_sum_squares", when);
  if (cfg.candidates_per_token() > cfg.top_k && p.d_reroute_ids == nullptr)
    return missing("d_reroute_ids", "with dispatch.dropped = next_choice (R > 0)");
  if (cfg.loss.sequence_length > 0) {
    const char* w = "with loss.sequence_length > 0";
    if (p.d_seq_score_sum == nullptr) return missing("d_seq_score_sum", w);
    if (p.d_seq_count == nullptr) return missing("d_seq_count", w);
    if (p.d_seq_tokens == nullptr) return missing("d_seq_tokens", w);
  }
  return status::success();
}

namespace detail {

template <class In, int Lanes, int Slots, int Warps, bool Generic>
status launch_gating_kernel(const kernels::gating_kernel_args& a, std::int64_t chunks,
                            const void* d_logits, cudaStream_t stream) {
  constexpr int Vec = (Slots * sizeof(In) >= 16) ? kernels::gating_math::vec16<In> : 1;
  kernels::gating_kernel_args args = a;
  args.vector_loads = Vec > 1 && a.experts % Vec == 0 &&
                      reinterpret_cast<std::uintptr_t>(d_logits) % 16 == 0;
  if constexpr (Generic) {
    const int per_pass = 32 * Vec;
    args.slots = (a.experts + per_pass - 1) / per_pass * Vec;
  } else {
    args.slots = Slots;
  }
  const std::size_t smem = kernels::gating_kernel_smem(Lanes, Warps, Generic, a.experts);
  kernels::gating_kernel<In, Lanes, Slots, Warps, Generic>
      <<<static_cast<unsigned>(chunks), Warps * 32, smem, stream>>>(args);
  return last_launch("gating_kernel");
}

template <class In>
status launch_gating_typed(const gating_plan& plan, const kernels::gating_kernel_args& a,
                           const void* d_logits, cudaStream_t stream) {
  const std::int64_t n = plan.chunks;
  if (plan.generic) return launch_gating_kernel<In, 32, max_experts / 32, 1, true>(a, n, d_logits, stream);
  if (plan.lanes == 8) return launch_gating_kernel<In, 8, 1, 8, false>(a, n, d_logits, stream);
  if (plan.lanes == 16) return launch_gating_kernel<In, 16, 1, 8, false>(a, n, d_logits, stream);
  switch (plan.values_per_lane) {
    case 1: return launch_gating_kernel<In, 32, 1, 8, false>(a, n, d_logits, stream);
    case 2: return launch_gating_kernel<In, 32, 2, 8, false>(a, n, d_logits, stream);
    case 4: return launch_gating_kernel<In, 32, 4, 8, false>(a, n, d_logits, stream);
    case 8: return launch_gating_kernel<In, 32, 8, 8, false>(a, n, d_logits, stream);
    default: return launch_gating_kernel<In, 32, 16, 8, false>(a, n, d_logits, stream);
  }
}

}  // namespace detail

/// @brief Fused gating of T tokens: sanitise, noise, scores, bias, group limit, top-k (+ R
///        reroute candidates), renormalisation and scaling, logsumexp, and the aux / z-loss sums.
/// @param cfg             a routing_config (checked with validate())
/// @param p               pointers and shapes, see gating_params
/// @param d_workspace     caller-owned device memory, at least gating_workspace_bytes(cfg, T)
///                        bytes, 8-byte aligned (cudaMalloc's 256 is best); may be null when 0
/// @param workspace_bytes its size
/// @param stream          the stream to run on
/// @return success; invalid_config / invalid_shape / invalid_argument (the message names the
///         field); workspace_too_small; cuda_error for a failed launch.
/// @note Asynchronous: no synchronisation, no allocation; capturable in a CUDA graph. Two
///       kernels (gating, then a fixed-order reduction of per-chunk partials); no float
///       atomics, so the same inputs give the same bits on every run.
///       Ties go to the lower expert index (groups: the lower group index). NaN logits count
///       as -FLT_MAX, +-Inf as +-FLT_MAX. Padding tokens (d_valid[t] = 0) are routed (their ids
///       and gates are defined) but count in no sum. T = 0: success, nothing is written.
///       exp and log1p are evaluated in double and rounded once to float (correctly rounded);
///       the CPU reference's glibc expf / log1pf are not always, so a score can differ from
///       the reference's by 1 ulp (~0.06% of exps, ~1% of log1ps; docs/numerics.md).
inline status gating(const routing_config& cfg, const gating_params& p, void* d_workspace,
                     std::size_t workspace_bytes, cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  const std::size_t need = gating_workspace_bytes(cfg, p.tokens);
  if (workspace_bytes < need || (need > 0 && d_workspace == nullptr))
    return status::make(status_code::workspace_too_small,
                        "workspace_bytes = " + std::to_string(workspace_bytes) +
                            ": gating needs gating_workspace_bytes(cfg, " +
                            std::to_string(p.tokens) + ") = " + std::to_string(need));
  if (reinterpret_cast<std::uintptr_t>(d_workspace) % 8 != 0)
    return status::make(status_code::invalid_argument, "d_workspace is not 8-byte aligned");
  const gating_plan plan = make_gating_plan(cfg, p.tokens);
  if (plan.chunks > 0x7fffffffLL)
    return status::make(status_code::unsupported,
                        "gating: " + std::to_string(plan.chunks) +
                            " chunks exceed the grid limit (use a longer loss.sequence_length)");
  workspace_carver carver(d_workspace, workspace_bytes);
  const gating_workspace_layout ws = carve_gating_workspace(carver, plan, cfg.num_experts);

  const auto& g = cfg.gating;
  const bool noise = cfg.noise_active();
  kernels::gating_kernel_args a;
  a.logits = p.d_logits;
  a.bias = cfg.gating.expert_bias ? p.d_bias : nullptr;
  a.valid = p.d_valid;
  a.ids = p.d_ids;
  a.gates = p.d_gates;
  a.reroute_ids = p.d_reroute_ids;
  a.logsumexp = p.d_logsumexp;
  a.part_scores = ws.d_partial_scores;
  a.part_counts = ws.d_partial_counts;
  a.part_z = ws.d_partial_z;
  a.part_valid = ws.d_partial_valid;
  a.part_nonfinite = ws.d_partial_nonfinite;
  a.tokens = p.tokens;
  a.experts = cfg.num_experts;
  a.k = cfg.top_k;
  a.reroute = cfg.candidates_per_token() - cfg.top_k;
  a.score = g.score;
  a.select_scores = g.select == select_from::scores;
  a.softmax_after = g.score == score_function::softmax && g.stage == softmax_stage::after_topk;
  a.renorm = g.renorm;
  a.renorm_epsilon = g.renorm_epsilon;
  a.scaling = g.scaling_factor;
  a.groups = g.group_limit.groups > 1 ? g.group_limit.groups : 1;
  a.group_topk = a.groups > 1 ? g.group_limit.group_topk : 1;
  a.per_group = cfg.num_experts / a.groups;
  a.group_take = a.groups > 1 ? cfg.top_k / g.group_limit.group_topk : 0;
  a.noise = noise;
  a.gaussian = g.noise.kind == noise_kind::gaussian;
  a.noisy_gates = noise && g.noise.target == noise_target::selection_and_gates;
  a.noise_scale = g.noise.scale;
  a.noise_seed = g.noise.seed;
  a.noise_offset = g.noise.offset;
  a.counted = cfg.loss.counts == aux_counts::top1 ? 1 : cfg.top_k;
  a.fresh_counts = cfg.loss.count_source == aux_count_source::fresh_topk;
  a.segment_tokens = plan.segment_tokens;
  a.pieces = plan.pieces;
  a.piece_tokens = plan.piece_tokens;

  status s;
  switch (p.logits_dtype) {
    case dtype::f16: s = detail::launch_gating_typed<half_bits>(plan, a, p.d_logits, stream); break;
    case dtype::bf16: s = detail::launch_gating_typed<bf16_bits>(plan, a, p.d_logits, stream); break;
    default: s = detail::launch_gating_typed<float>(plan, a, p.d_logits, stream); break;
  }
  if (!s) return s;

  kernels::gating_reduce_args r;
  r.part_scores = ws.d_partial_scores;
  r.part_counts = ws.d_partial_counts;
  r.part_z = ws.d_partial_z;
  r.part_valid = ws.d_partial_valid;
  r.part_nonfinite = ws.d_partial_nonfinite;
  r.segments = plan.segments;
  r.pieces = plan.pieces;
  r.experts = cfg.num_experts;
  r.aux_score_sum = p.d_aux_score_sum;
  r.aux_count = p.d_aux_count;
  r.z_sum = p.d_z_sum_squares;
  r.valid_tokens = p.d_valid_tokens;
  r.nonfinite = p.d_nonfinite;
  if (cfg.loss.sequence_length > 0) {
    r.seq_score_sum = p.d_seq_score_sum;
    r.seq_count = p.d_seq_count;
    r.seq_tokens = p.d_seq_tokens;
  }
  constexpr int threads = 256;
  kernels::gating_reduce_kernel<threads>
      <<<grid_for(cfg.num_experts, threads), threads, 0, stream>>>(r);
  return last_launch("gating_reduce_kernel");
}

}  // namespace moeroute::cuda
