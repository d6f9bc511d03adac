// SPDX-License-Identifier: Apache-2.0
// CPU reference: routing statistics — what a capacity factor costs and what it loses.
#pragma once

#include <algorithm>
#include <cstdint>

#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/layout.hpp>

namespace moeroute::reference {

struct routing_stats {
  std::int64_t assignments = 0;  ///< T * k
  std::int64_t kept = 0, rerouted = 0, dropped = 0, masked = 0;
  double drop_rate = 0.0;                 ///< dropped / (assignments - masked)
  std::int64_t fully_dropped_tokens = 0;  ///< valid tokens with nothing kept or rerouted
  std::int64_t rows = 0;                  ///< rows of the layout the stats were taken on
  std::int64_t empty_rows = 0;            ///< rows no token holds (padding)
  double padding_waste = 0.0;             ///< empty_rows / rows
  std::int64_t max_load = 0;              ///< largest number of requests an expert received
  double mean_load = 0.0;                 ///< mean requests per routed expert
  std::int32_t dead_experts = 0;          ///< routed experts no valid assignment chose
};

/// @brief Statistics of one routing on one layout.
[[nodiscard]] inline routing_stats compute_stats(const dispatch_output& d, const layout_output& L) {
  routing_stats s;
  s.assignments = d.assignments();
  s.kept = d.total_kept;
  s.rerouted = d.total_rerouted;
  s.dropped = d.total_dropped;
  s.masked = d.total_masked;
  const std::int64_t live = s.assignments - s.masked;
  s.drop_rate = live > 0 ? static_cast<double>(s.dropped) / static_cast<double>(live) : 0.0;
  for (std::int64_t t = 0; t < d.tokens; ++t) {
    bool any = false, masked = false;
    for (std::int32_t j = 0; j < d.k; ++j) {
      const fate f = d.fates[t * d.k + j];
      any = any || holds_row(f);
      masked = masked || f == fate::masked;
    }
    if (!any && !masked && d.k > 0) ++s.fully_dropped_tokens;
  }
  s.rows = L.num_rows;
  s.empty_rows = L.padding_rows();
  s.padding_waste =
      s.rows > 0 ? static_cast<double>(s.empty_rows) / static_cast<double>(s.rows) : 0.0;
  std::int64_t total = 0;
  for (std::int32_t e = 0; e < d.experts; ++e) {
    s.max_load = std::max(s.max_load, d.requested[e]);
    total += d.requested[e];
    if (d.requested[e] == 0) ++s.dead_experts;
  }
  s.mean_load = d.experts > 0 ? static_cast<double>(total) / d.experts : 0.0;
  return s;
}

}  // namespace moeroute::reference
