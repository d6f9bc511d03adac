// SPDX-License-Identifier: Apache-2.0
// Expert parallelism: the row work around the exchange, on the fast CPU backend's row kernels.
// Gathering a rank's rows in send order is cpu::permute (send_token is a row -> token map, like
// a layout's row_token); summing the returned rows into tokens is cpu::combine (the plan's
// assignment_row names each assignment's row in send order). Both give reference::permute's
// and reference::combine's bits, so an expert-parallel layer stays bitwise one device's.
// Elements the CPU backend does not read (double, which the tests use for adjointness) take a
// plain loop with the same operations in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <moeroute/cpu/combine.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/cpu/permute.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/ep/plan.hpp>
#include <moeroute/ep/transport.hpp>
#include <moeroute/macros.hpp>
#include <moeroute/status.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::ep::detail {

/// A backend status that cannot fail for a consistent plan; thrown if it does.
inline void require(const status& s, const char* op) {
  if (!s) throw error(status::make(s.code, std::string("moeroute::ep::") + op + ": " + s.message));
}

/// @brief out[i] = x[send_token[first + i]] for i < rows (out: [rows, d]).
template <class T>
void gather_rows(const plan& p, const T* x, std::int64_t first, std::int64_t rows, T* out,
                 const cpu::executor& ex) {
  if (rows == 0) return;
  const auto d = static_cast<std::size_t>(p.hidden);
  if constexpr (cpu::is_element_v<T>) {
    permute_params<T> pp;
    pp.d_x = x;
    pp.tokens = p.tokens;
    pp.hidden = p.hidden;
    pp.layout.d_row_token = p.send_token.data() + first;
    pp.rows = rows;
    pp.d_out = out;
    require(cpu::permute(p.cfg, pp, ex), "dispatch");
  } else {
    for (std::int64_t r = 0; r < rows; ++r)
      std::memcpy(out + r * d, x + p.send_token[first + r] * d, d * sizeof(T));
  }
}

/// @brief The rows dispatch sends: those for other ranks into `send` in send order (the rows
///        for this rank's own slot of it are left as they are), and this rank's rows to itself
///        straight into their receive-layout rows of `received` (its own blocks pair up, as
///        the exchange's do: the copy the exchange would make, saved).
template <class T>
void gather_send_rows(const plan& p, const T* x, T* send, T* received, const cpu::executor& ex) {
  const std::int64_t own_begin = p.send_offsets[p.rank], own_end = p.send_offsets[p.rank + 1];
  gather_rows(p, x, 0, own_begin, send, ex);
  gather_rows(p, x, own_end, p.send_total() - own_end, send + own_end * p.hidden, ex);
  std::size_t j = 0;
  for (const auto& b : p.send_blocks) {
    if (b.peer != p.rank) continue;
    while (p.receive_blocks[j].peer != p.rank) ++j;
    const row_block& into = p.receive_blocks[j++];
    gather_rows(p, x, b.offset, b.rows, received + into.offset * p.hidden, ex);
  }
}

/// @brief y[t] = sum_j weight[t, j] * returned[assignment_row(t, j)] in fp32, in choice order;
///        with drop_policy::residual a valid token with nothing kept gets x[t].
template <class T>
void combine_returned_rows(const plan& p, const T* returned, const T* x, T* y,
                           const cpu::executor& ex) {
  const auto& dec = p.decision;
  if constexpr (cpu::is_element_v<T>) {
    combine_params<T> cp;
    cp.d_expert_out = returned;
    cp.rows = p.send_total();
    cp.tokens = p.tokens;
    cp.hidden = p.hidden;
    cp.layout.d_assignment_row = p.assignment_row.data();
    cp.dispatched.d_weight = dec.weight.data();
    cp.dispatched.d_fate = dec.fates.data();
    cp.d_x = x;
    cp.d_y = y;
    require(cpu::combine(p.cfg, cp, ex), "combine");
  } else {
    const bool residual = p.cfg.dispatch.dropped == drop_policy::residual;
    const auto d = static_cast<std::size_t>(p.hidden);
    const std::int32_t k = dec.k;
    for (std::int64_t tk = 0; tk < p.tokens; ++tk) {
      bool any = false;
      for (std::int32_t j = 0; j < k; ++j) any = any || p.assignment_row[tk * k + j] >= 0;
      T* out = y + tk * d;
      if (residual && !any && dec.fates[tk * k] != fate::masked) {
        std::memcpy(out, x + tk * d, d * sizeof(T));
        continue;
      }
      for (std::size_t c = 0; c < d; ++c) {  // each column on its own: the same sums
        float acc = 0.0f;
        for (std::int32_t j = 0; j < k; ++j)
          if (const std::int64_t row = p.assignment_row[tk * k + j]; row >= 0)
            acc += dec.weight[tk * k + j] * to_float(returned[row * d + c]);
        out[c] = from_float<T>(acc);
      }
    }
  }
}

}  // namespace moeroute::ep::detail
MOEROUTE_PRECISE_FP_END
