// SPDX-License-Identifier: Apache-2.0
// Expert parallelism: combine backward. On the source rank: the gradient of each sent row
// (w * dy summed over the token's assignments holding it, in choice order), of each combine
// weight (dot(dy, returned row)) and the residual pass-through; then the row gradients travel
// to the experts' ranks, into the receive layout — reference::combine_backward's arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <moeroute/ep/exchange.hpp>
#include <moeroute/ep/plan.hpp>
#include <moeroute/ep/transport.hpp>
#include <moeroute/macros.hpp>
#include <moeroute/reference/row_grad.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::ep {

/// @brief Combine backward. Collective.
/// @param returned     [send_total, d] what combine wrote to `returned` in the forward
/// @param dy           [T, d] dL/dy
/// @param d_expert_out [receive_rows, d] written: dL/d expert_out in the receive layout
///                     (padding rows zero)
/// @param d_weight     [T, k] written: dot(dy[t], output of row(t, j)) for a surviving
///                     assignment, 0 otherwise (feed it to gating_backward)
/// @param d_x          [T, d] or empty: written with the residual pass-through (dy[t] for a
///                     valid token with nothing kept under drop_policy::residual, 0 elsewhere);
///                     add dispatch_backward(..., accumulate = true) for the full d x
/// @param workspace    workspace_bytes(p) bytes
template <class T>
void combine_backward(transport& t, const plan& p, std::span<const T> returned,
                      std::span<const T> dy, std::span<T> d_expert_out,
                      std::span<reference::grad_acc_t<T>> d_weight, std::span<T> d_x,
                      std::span<std::byte> workspace) {
  using A = reference::grad_acc_t<T>;
  using reference::detail::load_acc;
  using reference::detail::store_acc;
  const std::int32_t k = p.decision.k;
  detail::arg_check check(p, sizeof(T), workspace.size());
  check.rows("returned", returned.size(), p.send_total(), p.hidden);
  check.rows("dy", dy.size(), p.tokens, p.hidden);
  check.rows("d_expert_out", d_expert_out.size(), p.receive_rows, p.hidden);
  check.rows("d_weight", d_weight.size(), p.tokens, k);
  if (!d_x.empty()) check.rows("d_x", d_x.size(), p.tokens, p.hidden);
  check.settle(t, detail::op::combine_backward);
  const auto d = static_cast<std::size_t>(p.hidden);
  const auto& dec = p.decision;
  const bool residual = p.cfg.dispatch.dropped == drop_policy::residual;
  const detail::carved ws = detail::carve(p, workspace);
  T* d_send = reinterpret_cast<T*>(ws.send_rows);
  for (std::int64_t tk = 0; tk < p.tokens; ++tk) {
    bool any = false;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = tk * k + j;
      const std::int64_t row = p.assignment_row[a];
      A dot = A{0};
      if (row >= 0 && holds_row(dec.fates[a])) {
        any = true;
        for (std::size_t c = 0; c < d; ++c)
          dot += load_acc<T>(dy[tk * d + c]) * load_acc<T>(returned[row * d + c]);
      }
      d_weight[a] = dot;
      bool first = row >= 0;
      for (std::int32_t i = 0; i < j && first; ++i) first = p.assignment_row[tk * k + i] != row;
      if (!first) continue;
      // the row's gradient: every assignment of this token holding it, in choice order
      for (std::size_t c = 0; c < d; ++c) {
        A acc = A{0};
        for (std::int32_t i = 0; i < k; ++i)
          if (p.assignment_row[tk * k + i] == row)
            acc += static_cast<A>(dec.weight[tk * k + i]) * load_acc<T>(dy[tk * d + c]);
        d_send[row * d + c] = store_acc<T>(acc);
      }
    }
    if (d_x.empty()) continue;
    const bool pass = residual && !any && k > 0 && dec.fates[tk * k] != fate::masked;
    for (std::size_t c = 0; c < d; ++c) d_x[tk * d + c] = pass ? dy[tk * d + c] : T{};
  }
  detail::to_receive_layout(t, p, d_send, d_expert_out.data(), d, T{});
}

}  // namespace moeroute::ep
MOEROUTE_PRECISE_FP_END
