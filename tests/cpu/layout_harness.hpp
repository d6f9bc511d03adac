// SPDX-License-Identifier: Apache-2.0
// cpu::layout of a reference dispatch with host buffers pre-filled with garbage, and the
// reference dispatch as the const view the CPU stages read. Shared by the pipeline and the
// external-ids tests.
#pragma once

#include <cstdint>
#include <vector>

#include <moeroute/cpu/layout.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/views.hpp>

namespace moeroute::test {

/// The reference's dispatch as the const view the CPU stages read.
struct dispatch_view {
  reference::dispatch_output d;
  dispatch_totals totals;
  const_dispatch_result view() const { return reference::view(d, totals); }
};

/// cpu::layout of a dispatch, owning its outputs.
struct cpu_layout {
  std::vector<std::int64_t> offsets, rows_used, assignment_row;
  std::vector<std::int32_t> row_token, block_expert;
  std::int64_t num_rows = -1;
  layout_params p;
  cpu_layout(const routing_config& cfg, const const_dispatch_result& d, std::int64_t T,
             layout_kind kind, std::int64_t block)
      : offsets(static_cast<std::size_t>(cfg.total_experts()) + 1, -5),
        rows_used(static_cast<std::size_t>(cfg.total_experts()), -5),
        assignment_row(static_cast<std::size_t>(T * cfg.top_k), -5),
        row_token(static_cast<std::size_t>(layout_max_rows(cfg, T, kind, block)), -5),
        block_expert(row_token.size() / static_cast<std::size_t>(block), -5) {
    p.kind = kind;
    p.block_size = block;
    p.tokens = T;
    p.max_rows = static_cast<std::int64_t>(row_token.size());
    p.dispatched = d;
    p.out = {offsets.data(),
             rows_used.data(),
             row_token.data(),
             assignment_row.data(),
             kind == layout_kind::compact ? block_expert.data() : nullptr,
             &num_rows};
  }
  const_layout_result view() const { return p.out; }
};

}  // namespace moeroute::test
