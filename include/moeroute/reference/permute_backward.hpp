// SPDX-License-Identifier: Apache-2.0
// CPU reference, backward of permute: d expert-buffer rows -> d x, each token's distinct rows
// summed in rank order. Deterministic. Formulas in docs/numerics.md ("Gradients").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/layout.hpp>
#include <moeroute/reference/row_grad.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::reference {

/// @brief Permute backward. Forward: buf[row] = x[row_token[row]]. Backward: d x[t] = sum of
///        d_buf over the distinct rows token t holds, in rank order j of the assignment that
///        first names each row (a row shared by rerouted assignments counts once, as the forward
///        wrote x[t] there once). Padding rows contribute nothing.
/// @param cfg        the config of the routing (its top_k must match dsp)
/// @param d_buf      [num_rows, d]
/// @param d_x        [T, d]: written, or added to when accumulate (e.g. on top of the residual
///                   pass-through from combine_backward); the existing value is the first term.
template <class T = float>
void permute_backward(const routing_config& cfg, const layout_output& L, const dispatch_output& dsp,
                      grad_cspan<T> d_buf, std::int64_t d, grad_span<T> d_x,
                      bool accumulate = false) {
  using A = grad_acc_t<T>;
  const std::int64_t Tn = dsp.tokens;
  const std::int32_t k = dsp.k;
  detail::check_backward_inputs(cfg, dsp, L, d);
  detail::grad_check_size("d_buf", d_buf.size(), L.num_rows * d);
  detail::grad_check_size("d_x", d_x.size(), Tn * d);
  detail::grad_check_size("layout assignment_row", L.assignment_row.size(), Tn * k);
  std::vector<std::int64_t> rows;
  for (std::int64_t t = 0; t < Tn; ++t) {
    rows.clear();
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t row = L.assignment_row[t * k + j];
      if (row < 0) continue;
      bool seen = false;
      for (std::int64_t r : rows) seen = seen || r == row;
      if (!seen) rows.push_back(row);
    }
    for (std::int64_t c = 0; c < d; ++c) {
      A acc = accumulate ? detail::load_acc<T>(d_x[t * d + c]) : A{0};
      for (std::int64_t r : rows) acc += detail::load_acc<T>(d_buf[r * d + c]);
      d_x[t * d + c] = detail::store_acc<T>(acc);
    }
  }
}

/// @brief permute_backward with the dispatch before the layout, the order before 0.3.
template <class T = float>
[[deprecated(
    "reference::permute_backward takes (cfg, layout, dispatch, ...), as cpu / cuda do")]] void
permute_backward(const routing_config& cfg, const dispatch_output& dsp, const layout_output& L,
                 grad_cspan<T> d_buf, std::int64_t d, grad_span<T> d_x, bool accumulate = false) {
  permute_backward<T>(cfg, L, dsp, d_buf, d, d_x, accumulate);
}

}  // namespace moeroute::reference
MOEROUTE_PRECISE_FP_END
