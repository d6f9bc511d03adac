// SPDX-License-Identifier: Apache-2.0
// The reference's owning outputs as the const stage views the other backends read
// (types.hpp): a test, a tool or an engine that routed with the reference hands them to
// cpu:: or cuda:: stages (host memory) without copying pointers field by field. The views point
// into the outputs' vectors and live as long as they do.
#pragma once

#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/reference/layout.hpp>
#include <moeroute/types.hpp>

namespace moeroute::reference {

/// @brief gating_output as const_gating_result (empty vectors give null pointers; the z sum,
///        which gating_output does not keep, is null).
[[nodiscard]] inline const_gating_result view(const gating_output& g) noexcept {
  const auto p = [](const auto& v) { return v.empty() ? nullptr : v.data(); };
  const_gating_result r;
  r.d_ids = p(g.ids);
  r.d_gates = p(g.gates);
  r.d_reroute_ids = p(g.reroute_ids);
  r.d_logsumexp = p(g.logsumexp);
  r.sums = {p(g.aux_score_sum),  p(g.aux_count),     &g.valid_tokens, nullptr,
            &g.nonfinite_logits, p(g.seq_score_sum), p(g.seq_count),  p(g.seq_tokens)};
  r.d_token_priority = p(g.token_priority);
  r.d_second_skipped = p(g.second_skipped);
  r.d_aux_scores = p(g.aux_scores);
  r.d_aux_count_ids = p(g.aux_count_ids);
  return r;
}

/// @brief dispatch_output as const_dispatch_result; d_totals points at `totals` (the caller
///        keeps it: dispatch_output holds its totals as fields, `d.totals()` makes one).
[[nodiscard]] inline const_dispatch_result view(const dispatch_output& d,
                                                const dispatch_totals& totals) noexcept {
  return {
      d.expert.data(), d.slot.data(),     d.weight.data(),  d.fates.data(),    d.requested.data(),
      d.kept.data(),   d.rerouted.data(), d.dropped.data(), d.received.data(), d.load.data(),
      &totals};
}

/// @brief layout_output as const_layout_result (block_expert null for a padded layout).
[[nodiscard]] inline const_layout_result view(const layout_output& L) noexcept {
  return {L.offsets.data(),
          L.rows_used.data(),
          L.row_token.data(),
          L.assignment_row.data(),
          L.block_expert.empty() ? nullptr : L.block_expert.data(),
          &L.num_rows,
          &L.nonlocal};
}

}  // namespace moeroute::reference
