// SPDX-License-Identifier: Apache-2.0
// What the four data phases share: the argument check (and its agreement across ranks in the
// validation mode), the workspace carve, and the two directions of the row exchange between
// the source side's send order and the receive layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <moeroute/ep/agree.hpp>
#include <moeroute/ep/plan.hpp>
#include <moeroute/ep/transport.hpp>
#include <moeroute/status.hpp>

namespace moeroute::ep::detail {

/// Collects the first bad argument of a call; then agree() (validation mode) or throw.
class arg_check {
 public:
  arg_check(const plan& p, std::size_t element_bytes, std::size_t workspace) : p_(p) {
    if (element_bytes != p.element_bytes)
      fail(status_code::invalid_argument, "element type of " + std::to_string(element_bytes) +
                                              " bytes; the plan was made for " +
                                              std::to_string(p.element_bytes));
    if (workspace < workspace_bytes(p))
      fail(status_code::workspace_too_small,
           "workspace has " + std::to_string(workspace) +
               " bytes; workspace_bytes(plan) = " + std::to_string(workspace_bytes(p)));
  }
  /// A span that must hold rows * hidden (or rows * hidden when `per_row` is hidden) elements.
  void rows(const char* name, std::size_t got, std::int64_t rows, std::int64_t per_row) {
    const std::int64_t want = rows * per_row;
    if (static_cast<std::int64_t>(got) != want)
      fail(status_code::invalid_shape, std::string(name) + " has " + std::to_string(got) +
                                           " elements, expected " + std::to_string(want) + " (" +
                                           std::to_string(rows) + " x " + std::to_string(per_row) +
                                           ")");
  }
  void fail(status_code c, std::string m) {
    if (s_) s_ = status::make(c, std::move(m));
  }
  /// Collective in the validation mode: every rank throws when any rank's arguments are bad.
  void settle(transport& t, op what) const {
    if (p_.opt.check_ranks) {
      agree(t, s_, what);
    } else if (!s_) {
      throw error(status::make(s_.code, std::string("moeroute::ep::") +
                                            op_name(static_cast<std::int32_t>(what)) + ": " +
                                            s_.message));
    }
  }

 private:
  const plan& p_;
  status s_;
};

/// The workspace split: row staging for the rows sent and received, then provenance records.
struct carved {
  std::byte* send_rows;      // [send_total, d]
  std::byte* recv_rows;      // [recv_total, d]
  row_source* send_sources;  // [send_total]
  row_source* recv_sources;  // [recv_total]
};
inline carved carve(const plan& p, std::span<std::byte> ws) {
  const std::size_t row_bytes = static_cast<std::size_t>(p.hidden) * p.element_bytes;
  const auto up = [](std::size_t n) { return (n + 255) / 256 * 256; };
  std::byte* base = ws.data();
  carved c{};
  c.send_rows = base;
  c.recv_rows = base + static_cast<std::size_t>(p.send_total()) * row_bytes;
  const std::size_t rows = static_cast<std::size_t>(p.send_total() + p.recv_total());
  auto* src = reinterpret_cast<row_source*>(base + up(rows * row_bytes));
  c.send_sources = src;
  c.recv_sources = src + p.send_total();
  return c;
}

/// Visits the exchanged rows as blocks: fn(staging row, receive row, rows) for every (source,
/// segment) pair with rows — each is contiguous on both sides, so moving them is one memcpy.
template <class F>
void for_each_block(const plan& p, F&& fn) {
  const std::int32_t S = p.segments();
  std::vector<std::int64_t> next(p.segment_offsets.begin(), p.segment_offsets.end() - 1);
  std::int64_t i = 0;
  for (std::int32_t s = 0; s < p.ranks; ++s)
    for (std::int32_t l = 0; l < S; ++l) {
      const std::int64_t n = p.segment_from[static_cast<std::size_t>(s) * S + l];
      if (n == 0) continue;
      fn(i, next[l], n);
      i += n;
      next[l] += n;
    }
}

/// Source side -> receive layout: send (rows in send order) to every destination, then each
/// exchanged block to its place in the receive layout. `staging` holds recv_total rows;
/// padding rows get `pad`.
template <class Row>
void to_receive_layout(transport& t, const plan& p, const Row* send, Row* staging, Row* out,
                       std::size_t per_row, const Row& pad) {
  t.alltoallv(send, p.send_rows, p.send_offsets, staging, p.recv_rows, p.recv_offsets,
              per_row * sizeof(Row));
  for_each_block(p, [&](std::int64_t from, std::int64_t to, std::int64_t n) {
    std::memcpy(out + to * per_row, staging + from * per_row, n * per_row * sizeof(Row));
  });
  for (std::int32_t l = 0; l < p.segments(); ++l)
    for (std::int64_t r = p.segment_offsets[l] + p.segment_used[l]; r < p.segment_offsets[l + 1];
         ++r)
      std::fill(out + r * per_row, out + (r + 1) * per_row, pad);
}

/// Receive layout -> source side: each receive row back to the rank that sent it, landing in
/// send order. `staging` holds recv_total rows.
template <class Row>
void to_send_order(transport& t, const plan& p, const Row* in, Row* staging, Row* back,
                   std::size_t per_row) {
  for_each_block(p, [&](std::int64_t to, std::int64_t from, std::int64_t n) {
    std::memcpy(staging + to * per_row, in + from * per_row, n * per_row * sizeof(Row));
  });
  t.alltoallv(staging, p.recv_rows, p.recv_offsets, back, p.send_rows, p.send_offsets,
              per_row * sizeof(Row));
}

}  // namespace moeroute::ep::detail
