// SPDX-License-Identifier: Apache-2.0
// The reference's owning outputs as the const stage views the other backends read
// (types.hpp): a test, a tool or an engine that routed with the reference hands them to
// cpu:: or cuda:: stages (host memory) without copying pointers field by field. The views point
// into the outputs' vectors and live as long as they do. And the other way: a gating_output
// sized from shapes.hpp, for a backend to write into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/reference/layout.hpp>
#include <moeroute/shapes.hpp>
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

/// @brief Sizes the vectors of a struct with gating_output's member names (gating_output, or a
///        harness's look-alike) as shapes.hpp's gating_buffers lists them for (cfg, T,
///        options): each listed buffer gets its element count, every other vector is emptied,
///        and every element is set to `fill` (a harness fills garbage, to see what a backend
///        did not write). The scalar sums (valid tokens, z sum, non-finite count) are not
///        vectors and are left alone.
template <class Outputs>
void resize_gating_outputs(Outputs& g, const routing_config& cfg, std::int64_t tokens,
                           const gating_buffer_options& options, double fill = 0.0) {
  const std::vector<buffer_shape> shapes = gating_buffers(cfg, tokens, options);
  const auto size = [&](auto& v, std::string_view name) {
    using V = typename std::remove_reference_t<decltype(v)>::value_type;
    const buffer_shape* b = find_buffer(shapes, name);
    V value{};
    if constexpr (std::is_integral_v<V>) {
      value = static_cast<V>(static_cast<long long>(fill));  // (an unsigned one wraps, defined)
    } else {
      value = static_cast<V>(fill);
    }
    v.assign(b != nullptr ? static_cast<std::size_t>(b->count()) : 0, value);
  };
  size(g.ids, "ids");
  size(g.gates, "gates");
  size(g.reroute_ids, "reroute_ids");
  size(g.logsumexp, "logsumexp");
  size(g.aux_score_sum, "aux_score_sum");
  size(g.aux_count, "aux_count");
  size(g.seq_score_sum, "seq_score_sum");
  size(g.seq_count, "seq_count");
  size(g.seq_tokens, "seq_tokens");
  size(g.token_priority, "token_priority");
  size(g.second_skipped, "second_skipped");
  size(g.aux_scores, "aux_scores");
  size(g.aux_count_ids, "aux_count_ids");
}

}  // namespace moeroute::reference
