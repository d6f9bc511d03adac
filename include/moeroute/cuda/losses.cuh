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
#include <moeroute/params/losses.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

using moeroute::loss_params;

/// @brief Checks config, shapes and pointers; names the first bad field.
[[nodiscard]] inline status validate(const routing_config& cfg, const loss_params& p) {
  return check_params(cfg, p);
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
  a.sequence_sum = cfg.loss.sequence_reduce == sequence_reduction::sum;
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
