// SPDX-License-Identifier: Apache-2.0
// CPU reference, backward of combine: d y -> d expert outputs, d combine weights and the
// residual pass-through (permute's backward, d expert-buffer rows -> d x, is
// reference/permute_backward.hpp; the two share reference/row_grad.hpp). Deterministic: every sum
// runs in a fixed order (a token's assignments in rank order j, columns independent).
// Formulas in docs/numerics.md ("Gradients").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/reference/combine.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating_backward.hpp>
#include <moeroute/reference/layout.hpp>
#include <moeroute/reference/row_grad.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::reference {

/// @brief Combine backward. Forward: y[t] = sum_j w[t,j] * expert_out[row(t,j)] (+ x[t] for a
///        token passed through by the residual policy).
/// @tparam T storage type of expert_out, dy, d_expert_out, d_x (float, double, half_bits,
///         bf16_bits); sums run in grad_acc_t<T> (float, or double for double).
/// @param expert_out   [num_rows, d] the experts' outputs the forward combined
/// @param dy           [T, d] dL/dy
/// @param d_expert_out [num_rows, d] written: d row r = sum over the assignments j (rank order)
///                     whose row is r of w[t,j] * dy[t]; padding rows 0. A row shared by two
///                     assignments of one token (a rerouted one landing where its token already
///                     sits) gets both weights.
/// @param d_weight     [T, k] written: dot(dy[t], expert_out[row(t,j)]) (columns in order) for a
///                     surviving assignment, 0 for dropped and masked ones. Feed it to
///                     gating_backward.
/// @param d_x          [T, d] or empty: written with the residual pass-through, dy[t] for a
///                     valid token with nothing kept under drop_policy::residual, 0 elsewhere.
///                     Add permute_backward(..., accumulate = true) on top for the full d x.
template <class T = float>
void combine_backward(const routing_config& cfg, const layout_output& L, const dispatch_output& dsp,
                      grad_cspan<T> expert_out, std::int64_t d, grad_cspan<T> dy,
                      grad_span<T> d_expert_out, grad_span<grad_acc_t<T>> d_weight,
                      grad_span<T> d_x = {}) {
  using A = grad_acc_t<T>;
  const std::int64_t Tn = dsp.tokens;
  const std::int32_t k = dsp.k;
  detail::check_backward_inputs(cfg, dsp, L, d);
  detail::grad_check_size("dispatch_output weight", dsp.weight.size(), Tn * k);
  detail::grad_check_size("dispatch_output fates", dsp.fates.size(), Tn * k);
  detail::grad_check_size("expert_out", expert_out.size(), L.num_rows * d);
  detail::grad_check_size("d_expert_out", d_expert_out.size(), L.num_rows * d);
  detail::grad_check_size("dy", dy.size(), Tn * d);
  detail::grad_check_size("d_weight", d_weight.size(), Tn * k);
  detail::grad_check_size("layout assignment_row", L.assignment_row.size(), Tn * k);
  if (!d_x.empty()) detail::grad_check_size("d_x", d_x.size(), Tn * d);
  const bool residual = cfg.dispatch.dropped == drop_policy::residual;

  // d expert_out, row by row: the assignments of the row's token that hold it, in rank order
  for (std::int64_t r = 0; r < L.num_rows; ++r) {
    const std::int32_t t = L.row_token[r];
    for (std::int64_t c = 0; c < d; ++c) {
      A acc = A{0};
      if (t >= 0) {
        for (std::int32_t j = 0; j < k; ++j) {
          if (L.assignment_row[t * k + j] != r) continue;
          acc += static_cast<A>(dsp.weight[t * k + j]) * detail::load_acc<T>(dy[t * d + c]);
        }
      }
      d_expert_out[r * d + c] = detail::store_acc<T>(acc);
    }
  }
  // d weight and the residual pass-through
  for (std::int64_t t = 0; t < Tn; ++t) {
    bool any = false;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      const std::int64_t row = L.assignment_row[a];
      A dot = A{0};
      if (row >= 0 && holds_row(dsp.fates[a])) {
        any = true;
        for (std::int64_t c = 0; c < d; ++c)
          dot += detail::load_acc<T>(dy[t * d + c]) * detail::load_acc<T>(expert_out[row * d + c]);
      }
      d_weight[a] = dot;
    }
    if (d_x.empty()) continue;
    const bool pass = residual && !any && k > 0 && dsp.fates[t * k] != fate::masked;
    for (std::int64_t c = 0; c < d; ++c) d_x[t * d + c] = pass ? dy[t * d + c] : T{};
  }
}

/// @brief combine_backward with the dispatch before the layout, the order before 0.3.
template <class T = float>
[[deprecated(
    "reference::combine_backward takes (cfg, layout, dispatch, ...), as cpu / cuda do")]] void
combine_backward(const routing_config& cfg, const dispatch_output& dsp, const layout_output& L,
                 grad_cspan<T> expert_out, std::int64_t d, grad_cspan<T> dy,
                 grad_span<T> d_expert_out, grad_span<grad_acc_t<T>> d_weight,
                 grad_span<T> d_x = {}) {
  combine_backward<T>(cfg, L, dsp, expert_out, d, dy, d_expert_out, d_weight, d_x);
}

}  // namespace moeroute::reference
MOEROUTE_PRECISE_FP_END
