// SPDX-License-Identifier: Apache-2.0
// Expert parallelism: dispatch backward. The gradient of the received rows travels back to the
// source ranks, and each token sums the rows it sent (each distinct row once, in the choice
// order of the assignment that first names it) — reference::permute_backward's arithmetic.
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

/// @brief d x[t] = sum over the distinct rows token t sent of d_received[row]; sums in
///        reference::grad_acc_t<T> (double for double, float otherwise). Collective.
/// @param d_received [receive_rows, d] dL/d received (padding rows are ignored)
/// @param d_x        [T, d] written, or added to when accumulate (e.g. on top of
///                   combine_backward's residual pass-through)
/// @param workspace  workspace_bytes(p) bytes
template <class T>
void dispatch_backward(transport& t, const plan& p, std::span<const T> d_received, std::span<T> d_x,
                       std::span<std::byte> workspace, bool accumulate = false) {
  using A = reference::grad_acc_t<T>;
  detail::arg_check check(p, sizeof(T), workspace.size());
  check.rows("d_received", d_received.size(), p.receive_rows, p.hidden);
  check.rows("d_x", d_x.size(), p.tokens, p.hidden);
  check.settle(t, detail::op::dispatch_backward);
  const auto d = static_cast<std::size_t>(p.hidden);
  const detail::carved ws = detail::carve(p, workspace);
  T* back = reinterpret_cast<T*>(ws.send_rows);
  detail::to_send_order(t, p, d_received.data(), back, d);
  const std::int32_t k = p.decision.k;
  for (std::int64_t tk = 0; tk < p.tokens; ++tk) {
    for (std::size_t c = 0; c < d; ++c) {
      A acc = accumulate ? reference::detail::load_acc<T>(d_x[tk * d + c]) : A{0};
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int64_t row = p.assignment_row[tk * k + j];
        if (row < 0) continue;
        bool first = true;
        for (std::int32_t i = 0; i < j; ++i) first = first && p.assignment_row[tk * k + i] != row;
        if (first) acc += reference::detail::load_acc<T>(back[row * d + c]);
      }
      d_x[tk * d + c] = reference::detail::store_acc<T>(acc);
    }
  }
}

}  // namespace moeroute::ep
MOEROUTE_PRECISE_FP_END
