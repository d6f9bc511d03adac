// SPDX-License-Identifier: Apache-2.0
// Launcher: the expert-bias update of aux-loss-free balancing on the GPU (the CUDA twin of
// reference::expert_bias_update).
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/validate_params.hpp>
#include <moeroute/kernels/expert_bias_update.cuh>
#include <moeroute/params/expert_bias_update.hpp>
#include <moeroute/status.hpp>

namespace moeroute::cuda {

using moeroute::expert_bias_update_params;

/// @brief Checks config, shapes and pointers; names the first bad field.
[[nodiscard]] inline status validate(const routing_config& cfg,
                                     const expert_bias_update_params& p) {
  return check_params(cfg, p);
}

/// @brief bias += rate * sign(mean load - load), then optionally bias -= mean(bias), with rate
///        and recenter from cfg.gating.bias_update; the same arithmetic as
///        reference::expert_bias_update (bitwise). Loads accumulate on the device by adding each
///        micro-batch's dispatch counts (requested) once per micro-batch.
/// @note Asynchronous, one block (E <= 8192), no allocation, no synchronisation.
[[nodiscard]] inline status expert_bias_update(const routing_config& cfg,
                                               const expert_bias_update_params& p,
                                               cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  constexpr int threads = 256;
  return launch("expert_bias_update_kernel", kernels::expert_bias_update_kernel<threads>,
                {1, threads, 0}, stream, p.d_bias, p.d_load, cfg.num_experts,
                cfg.gating.bias_update.rate, cfg.gating.bias_update.recenter);
}

}  // namespace moeroute::cuda
