// SPDX-License-Identifier: Apache-2.0
// Launcher: aux loss, sequence-level aux loss and z-loss values from the sums cuda::gating
// writes (the same formulas as reference::losses).
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/kernels/losses.cuh>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

/// @brief Inputs (the gating sums) and outputs (device scalars) of cuda::losses.
///        Any output pointer may be null: that value is not computed.
struct loss_params {
  std::int64_t tokens = 0;  ///< T of the gating call (0: nothing is written)
  const_gating_sums
      sums{};  ///< gating_params::out.sums (d_seq_* used iff loss.sequence_length > 0)
  double* d_aux_loss = nullptr;           ///< [1] f64: coefficient * scale * sum_e f_e P_e
  double* d_sequence_aux_loss = nullptr;  ///< [1] f64: mean over sequences with a valid token
                                          ///<      (0 when loss.sequence_length == 0)
  double* d_z_loss = nullptr;             ///< [1] f64: z_coefficient * sum lse^2 / T
};

/// @brief Checks config, shape and pointers of a loss call; names the first bad field.
[[nodiscard]] inline status validate(const routing_config& cfg, const loss_params& p) {
  if (auto s = detail::validate_extents(cfg, p.tokens); !s) return s;
  if (p.tokens == 0) return status::success();
  if (auto s = detail::require_pointers(
          "with tokens > 0", detail::required(p.sums.d_valid_tokens, "sums.d_valid_tokens"));
      !s)
    return s;
  if (p.d_aux_loss != nullptr || p.d_sequence_aux_loss != nullptr)
    if (auto s = detail::require_pointers(
            "with an aux output", detail::required(p.sums.d_aux_score_sum, "sums.d_aux_score_sum"),
            detail::required(p.sums.d_aux_count, "sums.d_aux_count"));
        !s)
      return s;
  if (p.d_z_loss != nullptr)
    if (auto s = detail::require_pointers(
            "with d_z_loss", detail::required(p.sums.d_z_sum_squares, "sums.d_z_sum_squares"));
        !s)
      return s;
  if (p.d_sequence_aux_loss == nullptr || cfg.loss.sequence_length == 0) return status::success();
  return detail::require_pointers("with d_sequence_aux_loss and loss.sequence_length > 0",
                                  detail::required(p.sums.d_seq_score_sum, "sums.d_seq_score_sum"),
                                  detail::required(p.sums.d_seq_count, "sums.d_seq_count"),
                                  detail::required(p.sums.d_seq_tokens, "sums.d_seq_tokens"));
}

/// @brief Loss values from the gating sums, into device scalars (double).
/// @param cfg    the routing_config of the gating call (coefficients, scale, sequence_length)
/// @param p      sums in, scalars out
/// @param stream the stream to run on (after the gating call that wrote the sums)
/// @return success, a validation error naming the field, or cuda_error.
/// @note Asynchronous, no workspace, no allocation; graph-capturable. One block; sums in a fixed
///       order, so reruns give the same bits. Zero valid tokens give 0. T = 0: nothing written.
[[nodiscard]] inline status losses(const routing_config& cfg, const loss_params& p,
                                   cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  if (p.d_aux_loss == nullptr && p.d_sequence_aux_loss == nullptr && p.d_z_loss == nullptr)
    return status::success();
  kernels::loss_kernel_args a;
  a.sums = p.sums;
  if (cfg.loss.sequence_length > 0) a.sequences = p.tokens / cfg.loss.sequence_length;
  a.experts = cfg.num_experts;
  a.aux_coefficient = cfg.loss.aux_coefficient;
  a.aux_scale = aux_loss_scale(cfg);
  a.z_coefficient = cfg.loss.z_coefficient;
  a.aux_loss = p.d_aux_loss;
  a.sequence_aux_loss = p.d_sequence_aux_loss;
  a.z_loss = p.d_z_loss;
  constexpr int threads = 256;
  return launch("loss_kernel", kernels::loss_kernel<threads>, {1, threads, 0}, stream, a);
}

}  // namespace moeroute::cuda
