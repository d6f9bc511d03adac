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

/// The workspace split: the rows this rank sends (send order), then their provenance records.
struct carved {
  std::byte* send_rows;      // [send_total, d]
  row_source* send_sources;  // [send_total]
};
inline carved carve(const plan& p, std::span<std::byte> ws) {
  const std::size_t row_bytes = static_cast<std::size_t>(p.hidden) * p.element_bytes;
  const auto up = [](std::size_t n) { return (n + 255) / 256 * 256; };
  std::byte* base = ws.data();
  return {base, reinterpret_cast<row_source*>(
                    base + up(static_cast<std::size_t>(p.send_total()) * row_bytes))};
}

/// Source side -> receive layout: rows in send order go to every destination and land in
/// their (source, segment) blocks of the receive layout; padding rows get `pad`. With
/// `own_in_place`, the rows this rank sends itself are in `out` already (dispatch gathered
/// them there) and only the other ranks' move.
template <class Row>
void to_receive_layout(transport& t, const plan& p, const Row* send, Row* out, std::size_t per_row,
                       const Row& pad, bool own_in_place = false) {
  t.alltoallv_paired_blocks(send, own_in_place ? p.peer_send_blocks : p.send_blocks, out,
                            own_in_place ? p.peer_receive_blocks : p.receive_blocks,
                            per_row * sizeof(Row));
  for (std::int32_t l = 0; l < p.segments(); ++l)
    for (std::int64_t r = p.segment_offsets[l] + p.segment_used[l]; r < p.segment_offsets[l + 1];
         ++r)
      std::fill(out + r * per_row, out + (r + 1) * per_row, pad);
}

/// Receive layout -> source side: each receive row back to the rank that sent it, landing in
/// send order.
template <class Row>
void to_send_order(transport& t, const plan& p, const Row* in, Row* back, std::size_t per_row) {
  t.alltoallv_paired_blocks(in, p.receive_blocks, back, p.send_blocks, per_row * sizeof(Row));
}

}  // namespace moeroute::ep::detail
