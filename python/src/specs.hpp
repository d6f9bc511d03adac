// SPDX-License-Identifier: Apache-2.0
// The arrays each stage writes, with their shapes and dtypes for a config and a batch: the
// Python side allocates exactly these (in the caller's framework, on the caller's device)
// and the binding checks the arrays it is handed against the same list. They are the
// library's own lists (moeroute/shapes.hpp) as the binding's specs, so no shape is written
// twice.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/shapes.hpp>
#include <moeroute/types.hpp>

#include "arrays.hpp"

namespace moeroute::python {

/// gating: ids, gates, reroute_ids (R > 0), logsumexp, the loss sums, nonfinite, the sequence
/// sums (loss.sequence_length > 0), token_priority (batch_prioritized), second_skipped
/// (random second expert), with `per_token_aux` aux_scores and aux_count_ids, with `replay`
/// replay_replaced and replay_invalid.
[[nodiscard]] std::vector<spec> gating_outputs(const routing_config& cfg, std::int64_t tokens,
                                               bool per_token_aux, bool replay = false);
/// dispatch: expert, slot, weight, fate, the per-expert counts and totals.
[[nodiscard]] std::vector<spec> dispatch_outputs(const routing_config& cfg, std::int64_t tokens);
/// layout: offsets, rows_used, row_token [max_rows], assignment_row, block_expert (compact),
/// num_rows, nonlocal (with a local-expert view of `local_experts` > 0 experts).
[[nodiscard]] std::vector<spec> layout_outputs(const routing_config& cfg, std::int64_t tokens,
                                               layout_kind kind, std::int64_t block_size,
                                               std::int32_t local_experts);
/// The spec named `name` of `specs` (a bug in the binding when absent).
[[nodiscard]] const spec& find_spec(const std::vector<spec>& specs, std::string_view name);
/// True when `specs` lists `name`.
[[nodiscard]] bool lists(const std::vector<spec>& specs, std::string_view name);

/// The rows of a layout of `kind`; raises moeroute.Error naming the combination that has none.
[[nodiscard]] std::int64_t max_rows_of(const routing_config& cfg, std::int64_t tokens,
                                       layout_kind kind, std::int64_t block_size,
                                       std::int32_t local_experts);

}  // namespace moeroute::python
