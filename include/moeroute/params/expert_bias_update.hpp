// SPDX-License-Identifier: Apache-2.0
// Parameters of the expert-bias update (aux-loss-free balancing),
// shared by every backend: cpu::expert_bias_update and cuda::expert_bias_update take the same
// struct and start their validate() with the same check_params(). Pointers are named d_ (data) in
// both: device memory for the CUDA backend, host memory for the CPU backend. Plain C++.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>

namespace moeroute {

/// @brief The bias and the loads of expert_bias_update (E = cfg.num_experts).
struct expert_bias_update_params {
  float* d_bias = nullptr;               ///< [E] f32, updated in place
  const std::int64_t* d_load = nullptr;  ///< [E] int64 loads summed over the step's micro-batches
};

/// @brief Checks config and pointers; names the first bad field. Every backend's validate() runs
/// this first.
[[nodiscard]] inline status check_params(const routing_config& cfg,
                                         const expert_bias_update_params& p) {
  if (auto s = validate(cfg); !s) return s;
  return param_checks::require_pointers("", param_checks::required(p.d_bias, "d_bias"),
                                        param_checks::required(p.d_load, "d_load"));
}

}  // namespace moeroute
