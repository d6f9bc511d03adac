// SPDX-License-Identifier: Apache-2.0
// Expert parallelism, phase 3': combine. The experts' outputs travel back to the ranks that
// sent the rows, and each token's contributions are summed there in choice order, in fp32,
// with the drop policy of one device (zero weight, residual pass-through, fallback rows) —
// cpu::combine over the returned rows (row_ops.hpp), so the result is bitwise one device's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/ep/exchange.hpp>
#include <moeroute/ep/plan.hpp>
#include <moeroute/ep/row_ops.hpp>
#include <moeroute/ep/transport.hpp>

namespace moeroute::ep {

/// @brief y[t] = sum_j weight[t, j] * expert_out[row(t, j)], the k terms added in choice order
///        in float; with drop_policy::residual a valid token with nothing kept gets x[t].
///        Collective.
/// @param expert_out [receive_rows, d] the experts' outputs, in the receive layout
/// @param x          [T, d] this rank's inputs (read with drop_policy::residual only; may be
///                   empty otherwise)
/// @param returned   [send_total, d] written: the outputs of this rank's rows, in send order;
///                   keep it for combine_backward (it needs them for d weight)
/// @param y          [T, d] written
/// @param workspace  workspace_bytes(p) bytes, caller-owned (checked; combine itself needs
///                   none today, the argument keeps every data call's shape)
/// @param ex         the threads that sum the rows (cpu::combine's); OpenMP by default
template <class T>
void combine(transport& t, const plan& p, std::span<const T> expert_out, std::span<const T> x,
             std::span<T> returned, std::span<T> y, std::span<std::byte> workspace,
             const cpu::executor& ex = {}) {
  const bool residual = p.cfg.dispatch.dropped == drop_policy::residual;
  detail::arg_check check(p, sizeof(T), workspace.size());
  check.rows("expert_out", expert_out.size(), p.receive_rows, p.hidden);
  if (residual) check.rows("x (residual policy)", x.size(), p.tokens, p.hidden);
  check.rows("returned", returned.size(), p.send_total(), p.hidden);
  check.rows("y", y.size(), p.tokens, p.hidden);
  check.settle(t, detail::op::combine);
  detail::to_send_order(t, p, expert_out.data(), returned.data(),
                        static_cast<std::size_t>(p.hidden));
  detail::combine_returned_rows(p, returned.data(), residual ? x.data() : nullptr, y.data(), ex);
}

}  // namespace moeroute::ep
