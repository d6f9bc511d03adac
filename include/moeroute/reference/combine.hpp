// SPDX-License-Identifier: Apache-2.0
// CPU reference, stage 4b: combine the experts' outputs back into token order by combine weight
// (docs/numerics.md, "Combine"). Permute, its other half, is reference/permute.hpp.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/layout.hpp>
#include <moeroute/reference/row_checks.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::reference {

/// @brief y[t] = sum_j weight[t, j] * expert_out[row(t, j)], the k terms added in rank order
///        in float. With drop_policy::residual a token with nothing kept or rerouted gets
///        y[t] = x[t]. expert_out [num_rows, d]; x [T, d] (needed for residual only); y [T, d].
template <class T>
void combine(const routing_config& cfg, const layout_output& L, const dispatch_output& dsp,
             std::span<const T> expert_out, std::int64_t d, std::span<const T> x, std::span<T> y) {
  const std::int64_t Tn = dsp.tokens;
  const std::int32_t k = dsp.k;
  detail::check_dispatch_of(cfg, dsp);
  detail::check_extents(L, Tn, d);
  detail::check_dispatch_output(dsp);
  detail::check_size("layout_output.assignment_row", L.assignment_row.size(), Tn * k);
  for (std::int64_t a = 0; a < Tn * k; ++a)
    if (L.assignment_row[a] < -1 || L.assignment_row[a] >= L.num_rows)
      throw error(status::make(status_code::invalid_argument,
                               "layout_output.assignment_row[" + std::to_string(a) +
                                   "] = " + std::to_string(L.assignment_row[a]) +
                                   " is outside [-1, num_rows = " + std::to_string(L.num_rows) +
                                   ")"));
  detail::check_size("expert_out", expert_out.size(), detail::elements(L.num_rows, d));
  detail::check_size("y", y.size(), detail::elements(Tn, d));
  const bool residual = cfg.dispatch.dropped == drop_policy::residual;
  if (residual) detail::check_size("x (residual policy)", x.size(), detail::elements(Tn, d));
  std::vector<float> acc(d);
  for (std::int64_t t = 0; t < Tn; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    bool any = false;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t row = L.assignment_row[t * k + j];
      if (row < 0) continue;
      any = true;
      const float w = dsp.weight[t * k + j];
      for (std::int64_t c = 0; c < d; ++c) acc[c] += w * to_float(expert_out[row * d + c]);
    }
    if (residual && !any && dsp.fates[t * k] != fate::masked) {
      for (std::int64_t c = 0; c < d; ++c) y[t * d + c] = x[t * d + c];
    } else {
      for (std::int64_t c = 0; c < d; ++c) y[t * d + c] = from_float<T>(acc[c]);
    }
  }
}

/// @brief combine with the dispatch before the layout, the order before 0.3.
template <class T>
[[deprecated("reference::combine takes (cfg, layout, dispatch, ...), as cpu / cuda do")]] void
combine(const routing_config& cfg, const dispatch_output& dsp, const layout_output& L,
        std::span<const T> expert_out, std::int64_t d, std::span<const T> x, std::span<T> y) {
  combine<T>(cfg, L, dsp, expert_out, d, x, y);
}

}  // namespace moeroute::reference
MOEROUTE_PRECISE_FP_END
