// SPDX-License-Identifier: Apache-2.0
// CPU backend: the padding mask of a batch whose real token count is held in memory — the
// operation and params of cuda::token_mask, with the count read (and checked) on the host.
#pragma once

#include <cstdint>

#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/token_mask.hpp>
#include <moeroute/status.hpp>

namespace moeroute::cpu {

using moeroute::token_mask_params;

/// @brief Checks the shape and the pointers; names the first bad field.
[[nodiscard]] inline status validate(const token_mask_params& p) { return check_params(p); }

/// @brief d_mask[t] = 1 where t < n and d_valid[t] (when given), else 0, n = *d_count.
/// @return invalid_argument for n outside [0, tokens] (read here on the host, as
///         cpu::dispatch reads d_token_count; the device clamps instead). Synchronous.
[[nodiscard]] inline status token_mask(const token_mask_params& p,
                                       [[maybe_unused]] const executor& ex = {}) {
  if (auto s = validate(p); !s) return s;
  if (p.tokens == 0) return status::success();
  const std::int64_t n = *p.d_count;
  if (auto s = param_checks::validate_host_count("d_count", n, p.tokens); !s) return s;
  for (std::int64_t t = 0; t < p.tokens; ++t)
    p.d_mask[t] = t < n && (p.d_valid == nullptr || p.d_valid[t] != 0) ? 1 : 0;
  return status::success();
}

}  // namespace moeroute::cpu
