// SPDX-License-Identifier: Apache-2.0
// CPU backend of the record stage (routing replay, docs/replay.md): one layer's ids [T, k]
// into a caller-owned record [N, L, k] or [L, N, k] (int32 or int16), the params of
// cuda::record. A copy: memory speed, no workspace.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/record.hpp>
#include <moeroute/status.hpp>

namespace moeroute::cpu {

using moeroute::record_params;

/// @brief Writes p.d_ids as layer p.layer of the record, rows [first_token, first_token + T).
/// @return success; invalid_config / invalid_argument naming the field (an int16 record for
///         E > 32767 included). Never allocates or throws.
template <class Id>
[[nodiscard]] status record(const routing_config& cfg, const record_params<Id>& p,
                            const executor& ex = {}) {
  if (auto s = check_params(cfg, p); !s) return s;
  const std::int32_t k = cfg.top_k;
  constexpr std::int64_t chunk = 1 << 14;  // tokens per task: a copy needs few
  parallel_for(ex, (p.tokens + chunk - 1) / chunk, [&](std::int64_t c) {
    const std::int64_t end = p.tokens < (c + 1) * chunk ? p.tokens : (c + 1) * chunk;
    for (std::int64_t t = c * chunk; t < end; ++t) {
      Id* out = p.d_record + record_offset(p, k, p.first_token + t, 0);
      for (std::int32_t j = 0; j < k; ++j) out[j] = static_cast<Id>(p.d_ids[t * k + j]);
    }
  });
  return status::success();
}

}  // namespace moeroute::cpu
