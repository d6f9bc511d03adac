// SPDX-License-Identifier: Apache-2.0
// Expert parallelism, phase 3: dispatch. Every kept row of this rank's tokens travels to the
// rank that owns its expert and lands in that rank's expert-major receive layout, ordered by
// (source rank, token) within each local expert — the order is fixed by the plan, never by
// arrival, so reruns are bitwise identical.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include <moeroute/cpu/parallel.hpp>
#include <moeroute/ep/exchange.hpp>
#include <moeroute/ep/plan.hpp>
#include <moeroute/ep/row_ops.hpp>
#include <moeroute/ep/transport.hpp>

namespace moeroute::ep {

/// @brief Sends hidden states to the experts' ranks. Collective.
/// @tparam T row element: float, double, moeroute::half_bits or bf16_bits (sizeof must equal
///         the plan's element_bytes)
/// @param x          [T, d] this rank's hidden states
/// @param received   [receive_rows, d] written: segment l (local expert, see
///                   plan::segment_offsets) holds the rows sent to it, in (source rank, token)
///                   order; padding rows are zero
/// @param workspace  workspace_bytes(p) bytes, caller-owned
/// @param ex         the threads that gather the rows (cpu::permute's); OpenMP by default
/// @note Bad arguments on any rank throw moeroute::error on every rank (validation mode).
template <class T>
void dispatch(transport& t, const plan& p, std::span<const T> x, std::span<T> received,
              std::span<std::byte> workspace, const cpu::executor& ex = {}) {
  detail::arg_check check(p, sizeof(T), workspace.size());
  check.rows("x", x.size(), p.tokens, p.hidden);
  check.rows("received", received.size(), p.receive_rows, p.hidden);
  check.settle(t, detail::op::dispatch);
  const auto d = static_cast<std::size_t>(p.hidden);
  const detail::carved ws = detail::carve(p, workspace);
  T* send = reinterpret_cast<T*>(ws.send_rows);
  detail::gather_send_rows(p, x.data(), send, received.data(), ex);
  detail::to_receive_layout(t, p, send, received.data(), d, T{}, /*own_in_place=*/true);
}

/// @brief The provenance of every received row: source rank, source token, the first choice
///        naming the row and its combine weight (the sum over the token's assignments holding
///        it), in the receive layout of dispatch. Collective; one small exchange (16 bytes a
///        row). Engines that apply the gate inside the expert, or that need token ids on the
///        expert side, call it once per plan.
/// @param sources    [receive_rows] written; padding rows get rank -1
/// @param workspace  workspace_bytes(p) bytes
inline void dispatch_sources(transport& t, const plan& p, std::span<row_source> sources,
                             std::span<std::byte> workspace) {
  detail::arg_check check(p, p.element_bytes, workspace.size());
  check.rows("sources", sources.size(), p.receive_rows, 1);
  check.settle(t, detail::op::dispatch_sources);
  const detail::carved ws = detail::carve(p, workspace);
  const std::int32_t k = p.decision.k;
  for (std::int64_t r = 0; r < p.send_total(); ++r) ws.send_sources[r] = {};
  for (std::int64_t a = p.tokens * k - 1; a >= 0; --a) {  // last to first: ends at the first
    const std::int64_t row = p.assignment_row[a];
    if (row < 0) continue;
    auto& s = ws.send_sources[row];
    s.rank = p.rank;
    s.token = static_cast<std::int32_t>(a / k);
    s.choice = static_cast<std::int32_t>(a % k);
  }
  for (std::int64_t a = 0; a < p.tokens * k; ++a)
    if (p.assignment_row[a] >= 0)
      ws.send_sources[p.assignment_row[a]].weight += p.decision.weight[a];
  detail::to_receive_layout(t, p, ws.send_sources, sources.data(), 1, row_source{});
}

}  // namespace moeroute::ep
