// SPDX-License-Identifier: Apache-2.0
// The expert-bias update of aux-loss-free balancing (reference::expert_bias_update on the GPU).
#pragma once

#include <cstdint>

namespace moeroute::kernels {

/// bias[e] += rate * sign(mean load - load[e]), then optionally bias -= mean(bias). A single
/// thread: E is at most 8192 and the result must not depend on a reduction order.
/// (A template only so that the header can be included by several translation units.)
template <int Unused = 0>
__global__ void expert_bias_update_kernel(float* __restrict__ bias,
                                          const std::int64_t* __restrict__ load,
                                          std::int32_t experts, float rate, bool recenter) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0.0;
  for (std::int32_t e = 0; e < experts; ++e) total += static_cast<double>(load[e]);
  const double mean = total / experts;
  for (std::int32_t e = 0; e < experts; ++e) {
    const double off = mean - static_cast<double>(load[e]);
    const float sgn = off > 0.0 ? 1.0f : (off < 0.0 ? -1.0f : 0.0f);
    bias[e] = __fadd_rn(bias[e], __fmul_rn(rate, sgn));
  }
  if (recenter) {
    double s = 0.0;
    for (std::int32_t e = 0; e < experts; ++e) s += bias[e];
    const double mb = s / experts;
    for (std::int32_t e = 0; e < experts; ++e)
      bias[e] = static_cast<float>(static_cast<double>(bias[e]) - mb);
  }
}

}  // namespace moeroute::kernels
