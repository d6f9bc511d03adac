// SPDX-License-Identifier: Apache-2.0
// The forward's decisions a gating_backward call reads, computed by the CPU reference and
// uploaded, so the backward tests check the backward kernels alone (backward_test.cu,
// backward_grid_test.cu).
#pragma once

#include <cstdint>
#include <vector>

#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/gating_backward.cuh>
#include <moeroute/reference.hpp>

namespace moeroute::test {

/// ids, fates, the valid mask and the aux / sequence counts of a reference forward, on the
/// device.
struct device_forward {
  cuda::device_buffer<std::int32_t> ids;
  cuda::device_buffer<fate> fates;
  cuda::device_buffer<std::uint8_t> valid;
  cuda::device_buffer<std::int64_t> aux_count, valid_tokens, seq_count, seq_tokens;

  device_forward(const reference::gating_output& g, const reference::dispatch_output& d)
      : ids(g.ids),
        fates(d.fates),
        valid(g.valid),
        aux_count(g.aux_count),
        valid_tokens(std::vector<std::int64_t>{g.valid_tokens}),
        seq_count(g.seq_count),
        seq_tokens(g.seq_tokens) {}

  /// Points the forward fields of `p` (gated, dispatched, and d_valid unless `all_valid`, which
  /// leaves it null) at these buffers.
  template <class Element>
  void attach(cuda::gating_backward_params<Element>& p, bool all_valid = false) const {
    p.d_valid = all_valid ? nullptr : valid.get();
    p.gated.d_ids = ids.get();
    p.gated.sums.d_aux_count = aux_count.get();
    p.gated.sums.d_valid_tokens = valid_tokens.get();
    p.gated.sums.d_seq_count = seq_count.get();
    p.gated.sums.d_seq_tokens = seq_tokens.get();
    p.dispatched.d_fate = fates.get();
  }
};

/// A reference dispatch's weights and fates and a reference layout's rows, on the device: what
/// combine_backward and permute_backward read of the forward.
struct device_layout {
  cuda::device_buffer<float> weight;
  cuda::device_buffer<fate> fates;
  cuda::device_buffer<std::int32_t> row_token;
  cuda::device_buffer<std::int64_t> assignment_row;
  std::int64_t rows;

  device_layout(const reference::dispatch_output& d, const reference::layout_output& L)
      : weight(d.weight),
        fates(d.fates),
        row_token(L.row_token),
        assignment_row(L.assignment_row),
        rows(L.num_rows) {}

  /// Sets rows and points the layout (and, for combine_backward, the dispatch) fields of `p`
  /// at these buffers.
  template <class Params>
  void attach(Params& p) const {
    p.rows = rows;
    p.layout.d_row_token = row_token.get();
    p.layout.d_assignment_row = assignment_row.get();
    if constexpr (requires { p.dispatched; }) {
      p.dispatched.d_weight = weight.get();
      p.dispatched.d_fate = fates.get();
    }
  }
};

}  // namespace moeroute::test
