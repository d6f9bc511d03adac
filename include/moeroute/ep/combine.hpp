// SPDX-License-Identifier: Apache-2.0
// Expert parallelism, phase 3': combine. The experts' outputs travel back to the ranks that
// sent the rows, and each token's contributions are summed there in choice order, in fp32,
// with the drop policy of one device (zero weight, residual pass-through, fallback rows) —
// the same arithmetic as reference::combine, so the result is bitwise one device's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/ep/exchange.hpp>
#include <moeroute/ep/plan.hpp>
#include <moeroute/ep/transport.hpp>
#include <moeroute/macros.hpp>

MOEROUTE_PRECISE_FP_BEGIN
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
template <class T>
void combine(transport& t, const plan& p, std::span<const T> expert_out, std::span<const T> x,
             std::span<T> returned, std::span<T> y, std::span<std::byte> workspace) {
  const bool residual = p.cfg.dispatch.dropped == drop_policy::residual;
  detail::arg_check check(p, sizeof(T), workspace.size());
  check.rows("expert_out", expert_out.size(), p.receive_rows, p.hidden);
  if (residual) check.rows("x (residual policy)", x.size(), p.tokens, p.hidden);
  check.rows("returned", returned.size(), p.send_total(), p.hidden);
  check.rows("y", y.size(), p.tokens, p.hidden);
  check.settle(t, detail::op::combine);
  const auto d = static_cast<std::size_t>(p.hidden);
  detail::to_send_order(t, p, expert_out.data(), returned.data(), d);
  const auto& dec = p.decision;
  const std::int32_t k = dec.k;
  std::vector<float> acc_buf(d);
  float* __restrict acc = acc_buf.data();
  const T* __restrict back = returned.data();
  for (std::int64_t tk = 0; tk < p.tokens; ++tk) {
    std::fill(acc, acc + d, 0.0f);
    bool any = false;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t row = p.assignment_row[tk * k + j];
      if (row < 0) continue;
      any = true;
      // the same float operations, in the same order, as reference::combine
      const float w = dec.weight[tk * k + j];
      const T* __restrict r = back + row * d;
      for (std::size_t c = 0; c < d; ++c) acc[c] += w * to_float(r[c]);
    }
    T* __restrict out = y.data() + tk * d;
    if (residual && !any && dec.fates[tk * k] != fate::masked) {
      std::memcpy(out, x.data() + tk * d, d * sizeof(T));
    } else {
      for (std::size_t c = 0; c < d; ++c) out[c] = from_float<T>(acc[c]);
    }
  }
}

}  // namespace moeroute::ep
MOEROUTE_PRECISE_FP_END
