// SPDX-License-Identifier: Apache-2.0
// Launcher: fused gating on the GPU. Router logits [T, E] (float, __half or __nv_bfloat16) ->
// top-k expert ids and gates, reroute candidates, logsumexp, and the sums the aux / sequence /
// z losses need. Same semantics as reference::gating; formulas in docs/numerics.md ("Gating").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/gating_workspace.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/gating_plan.hpp>
#include <moeroute/kernels/gating.cuh>
#include <moeroute/kernels/gating_reduce.cuh>
#include <moeroute/params/gating.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cuda {

using moeroute::gating_params;

/// @brief Checks config, shapes and pointers; names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const gating_params<Element>& p) {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");
  return check_params(cfg, p);
}

namespace detail {

/// The gating kernel for one (Lanes, Slots, Warps) shape: the generic kernel's slot count and
/// the 16-byte loads are decided here, from E and the logits' alignment.
template <class Element, int Lanes, int Slots, int Warps, bool Generic>
[[nodiscard]] status launch_gating_kernel(kernels::gating_kernel_args<Element> a,
                                          cudaStream_t stream) {
  constexpr int Vec = kernels::gating_vec<Element, Slots>;
  const int E = a.sem.experts;
  a.vector_loads = Vec > 1 && E % Vec == 0 && reinterpret_cast<std::uintptr_t>(a.logits) % 16 == 0;
  if constexpr (Generic) {
    const int per_pass = 32 * Vec;
    a.slots = (E + per_pass - 1) / per_pass * Vec;
  } else {
    a.slots = Slots;
  }
  const launch_shape shape{static_cast<unsigned>(a.plan.chunks), Warps * 32,
                           kernels::gating_kernel_smem(Lanes, Slots, Warps, Generic, E)};
  return launch("gating_kernel", kernels::gating_kernel<Element, Lanes, Slots, Warps, Generic>,
                shape, stream, a);
}

/// Picks the kernel shape the plan asks for.
template <class Element>
[[nodiscard]] status launch_gating(const kernels::gating_kernel_args<Element>& a,
                                   cudaStream_t stream) {
  const gating_plan& p = a.plan;
  if (p.generic) return launch_gating_kernel<Element, 32, max_experts / 32, 1, true>(a, stream);
  if (p.lanes == 8) return launch_gating_kernel<Element, 8, 1, 8, false>(a, stream);
  if (p.lanes == 16) return launch_gating_kernel<Element, 16, 1, 8, false>(a, stream);
  switch (p.values_per_lane) {
    case 1:
      return launch_gating_kernel<Element, 32, 1, 8, false>(a, stream);
    case 2:
      return launch_gating_kernel<Element, 32, 2, 8, false>(a, stream);
    case 4:
      return launch_gating_kernel<Element, 32, 4, 8, false>(a, stream);
    case 8:
      return launch_gating_kernel<Element, 32, 8, 8, false>(a, stream);
    default:
      return launch_gating_kernel<Element, 32, 16, 8, false>(a, stream);
  }
}

}  // namespace detail

/// @brief Fused gating of T tokens: sanitise, noise, scores, bias, group limit, top-k (+ R
///        reroute candidates), renormalisation and scaling, logsumexp, and the aux / z-loss sums.
/// @param cfg             a routing_config (checked with validate())
/// @param p               pointers and shapes, see gating_params
/// @param d_workspace     caller-owned device memory of at least gating_workspace_bytes(cfg, T)
///                        bytes, 8-byte aligned (cudaMalloc's 256 is best); may be null when 0
/// @param workspace_bytes its size
/// @param stream          the stream to run on
/// @return success; invalid_config / invalid_shape / invalid_argument (the message names the
///         field); workspace_too_small; cuda_error for a failed launch.
/// @note Asynchronous: no synchronisation, no allocation; capturable in a CUDA graph. Two
///       kernels (gating, then a fixed-order reduction of per-chunk partials; the inference
///       path without any sum, one); no float atomics, so the same inputs give the same bits
///       on every run. Null sums (cfg.training = false only, see gating_params) are not
///       computed; with no sum, d_aux_scores or d_aux_count_ids the kernel makes no P row.
///       Ties go to the lower expert index (groups: the lower group index). NaN logits count
///       as -FLT_MAX, +-Inf as +-FLT_MAX. Padding tokens (d_valid[t] = 0) are routed (their ids
///       and gates are defined) but count in no sum. T = 0: success, nothing is written.
///       exp and log1p are evaluated in double and rounded once to float (correctly rounded);
///       the CPU reference's glibc expf / log1pf are not always, so a score can differ from
///       the reference's by 1 ulp (~0.06% of exps, ~1% of log1ps; docs/numerics.md).
///       Replay (p.replay): replay ids are device data, so a bad one (outside [-1, E), or
///       repeated in its token) is taken as -1 and counted in replay.d_invalid, where the host
///       backends return invalid_argument.
template <class Element>
[[nodiscard]] status gating(const routing_config& cfg, const gating_params<Element>& p,
                            void* d_workspace, std::size_t workspace_bytes,
                            cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  if (auto s = detail::validate_workspace("gating", "gating_workspace_bytes", p.tokens,
                                          gating_workspace_bytes(cfg, p.tokens), d_workspace,
                                          workspace_bytes);
      !s)
    return s;
  const gating_plan plan = make_gating_plan(cfg, p.tokens);
  if (plan.chunks > 0x7fffffffLL)
    return status::make(status_code::unsupported,
                        "gating: " + std::to_string(plan.chunks) +
                            " chunks exceed the grid limit (use a longer loss.sequence_length)");
  workspace_carver carver(d_workspace, workspace_bytes);
  kernels::gating_kernel_args<Element> a;
  a.logits = p.d_logits;
  a.bias = cfg.gating.expert_bias ? p.d_bias : nullptr;
  a.valid = p.d_valid;
  a.tokens = p.tokens;
  a.out = p.out;
  a.part = carve_gating_workspace(carver, plan, cfg.num_experts);
  a.sem = kernels::make_gating_semantics(cfg);
  a.plan = plan;
  a.replay = p.replay;
  a.replay_log_ratio = replay_log_ratio(p.replay.min_score_ratio);
  gating_sums sums = p.out.sums;
  if (cfg.loss.sequence_length == 0) {  // the reduce kernel writes sequence sums iff non-null
    sums.d_seq_score_sum = nullptr;
    sums.d_seq_count = nullptr;
    sums.d_seq_tokens = nullptr;
  }
  a.aux = wants_aux_inputs(cfg, p.out);  // false: the inference path, selection and gates only
  std::int64_t* const counts[] = {p.replay.d_replaced, p.replay.d_invalid};  // the kernel adds
  for (std::int64_t* count : counts)
    if (count != nullptr)
      if (auto s = from_cuda(cudaMemsetAsync(count, 0, sizeof(std::int64_t), stream),
                             "cudaMemsetAsync(replay counts)");
          !s)
        return s;
  if (auto s = detail::launch_gating(a, stream); !s) return s;

  if (!a.aux && sums.d_valid_tokens == nullptr && sums.d_z_sum_squares == nullptr &&
      sums.d_nonfinite == nullptr)
    return status::success();  // no sum to reduce: one kernel
  constexpr int threads = 256;
  return launch("gating_reduce_kernel", kernels::gating_reduce_kernel<threads>,
                {kernels::gating_reduce_blocks<threads>(cfg.num_experts), threads, 0}, stream,
                a.part, plan.segments, plan.pieces, cfg.num_experts, sums);
}

}  // namespace moeroute::cuda
