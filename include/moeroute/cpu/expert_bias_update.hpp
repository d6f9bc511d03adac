// SPDX-License-Identifier: Apache-2.0
// CPU backend: the expert-bias update of aux-loss-free balancing — the operation and params of
// cuda::expert_bias_update, reference::expert_bias_update's arithmetic bit for bit.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/expert_bias_update.hpp>
#include <moeroute/status.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::cpu {

using moeroute::expert_bias_update_params;

/// @brief Checks config and pointers (check_params); names the first bad field.
[[nodiscard]] inline status validate(const routing_config& cfg,
                                     const expert_bias_update_params& p) {
  return check_params(cfg, p);
}

/// @brief bias += rate * sign(mean load - load), then optionally bias -= mean(bias), with rate
///        and recenter from cfg.gating.bias_update. Synchronous, no allocation.
[[nodiscard]] inline status expert_bias_update(const routing_config& cfg,
                                               const expert_bias_update_params& p,
                                               [[maybe_unused]] const executor& ex = {}) {
  if (auto s = validate(cfg, p); !s) return s;
  const std::int32_t E = cfg.num_experts;
  const bias_update_config& c = cfg.gating.bias_update;
  double total = 0.0;
  for (std::int32_t e = 0; e < E; ++e) total += static_cast<double>(p.d_load[e]);
  const double mean = total / static_cast<double>(E);
  for (std::int32_t e = 0; e < E; ++e) {
    const double off = mean - static_cast<double>(p.d_load[e]);
    const float sgn = off > 0.0 ? 1.0f : (off < 0.0 ? -1.0f : 0.0f);
    p.d_bias[e] += c.rate * sgn;
  }
  if (c.recenter) {
    double s = 0.0;
    for (std::int32_t e = 0; e < E; ++e) s += p.d_bias[e];
    const double mb = s / static_cast<double>(E);
    for (std::int32_t e = 0; e < E; ++e)
      p.d_bias[e] = static_cast<float>(static_cast<double>(p.d_bias[e]) - mb);
  }
  return status::success();
}

}  // namespace moeroute::cpu
MOEROUTE_PRECISE_FP_END
