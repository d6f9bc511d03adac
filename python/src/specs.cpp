// SPDX-License-Identifier: Apache-2.0
#include "specs.hpp"

#include <moeroute/layout_rows.hpp>

namespace moeroute::python {

std::vector<spec> gating_outputs(const routing_config& cfg, std::int64_t T, bool per_token_aux) {
  const std::int64_t E = cfg.num_experts, k = cfg.top_k;
  const std::int64_t R = cfg.candidates_per_token() - cfg.top_k;
  std::vector<spec> s = {
      {"ids", {T, k}, elem::i32},        {"gates", {T, k}, elem::f32},
      {"logsumexp", {T}, elem::f32},     {"aux_score_sum", {E}, elem::f64},
      {"aux_count", {E}, elem::i64},     {"valid_tokens", {1}, elem::i64},
      {"z_sum_squares", {1}, elem::f64}, {"nonfinite", {1}, elem::i64},
  };
  if (R > 0) s.push_back({"reroute_ids", {T, R}, elem::i32});
  if (cfg.loss.sequence_length > 0) {
    const std::int64_t S = T / cfg.loss.sequence_length;
    s.push_back({"seq_score_sum", {S, E}, elem::f64});
    s.push_back({"seq_count", {S, E}, elem::i64});
    s.push_back({"seq_tokens", {S}, elem::i64});
  }
  if (cfg.dispatch.prio == priority::batch_prioritized)
    s.push_back({"token_priority", {T}, elem::f32});
  if (cfg.gating.second_expert.policy == second_expert_policy::random)
    s.push_back({"second_skipped", {T}, elem::u8});
  if (per_token_aux) {
    s.push_back({"aux_scores", {T, E}, elem::f32});
    s.push_back({"aux_count_ids", {T, cfg.loss.counts == aux_counts::top1 ? 1 : k}, elem::i32});
  }
  return s;
}

std::vector<spec> dispatch_outputs(const routing_config& cfg, std::int64_t T) {
  const std::int64_t E = cfg.num_experts, k = cfg.top_k, ET = cfg.total_experts();
  return {
      {"expert", {T, k}, elem::i32}, {"slot", {T, k}, elem::i32},   {"weight", {T, k}, elem::f32},
      {"fate", {T, k}, elem::u8},    {"requested", {E}, elem::i64}, {"kept", {E}, elem::i64},
      {"rerouted", {E}, elem::i64},  {"dropped", {E}, elem::i64},   {"received", {ET}, elem::i64},
      {"load", {ET}, elem::i64},     {"totals", {8}, elem::i64},
  };
}

std::int64_t max_rows_of(const routing_config& cfg, std::int64_t T, layout_kind kind,
                         std::int64_t block_size, std::int32_t local_experts) {
  if (block_size < 1)
    throw binding_error("layout: block_size = " + std::to_string(block_size) + ": must be >= 1");
  if (local_experts > 0) return local_compact_max_rows(cfg, T, block_size, local_experts);
  const std::int64_t rows = layout_max_rows(cfg, T, kind, block_size);
  if (rows < 0)
    throw binding_error(
        "layout: the padded layout needs a bounded capacity; capacity.mode = unbounded works "
        "with the compact layout");
  return rows;
}

std::vector<spec> layout_outputs(const routing_config& cfg, std::int64_t T, layout_kind kind,
                                 std::int64_t block_size, std::int32_t local_experts) {
  const std::int64_t segments = local_experts > 0 ? local_experts : cfg.total_experts();
  const std::int64_t rows = max_rows_of(cfg, T, kind, block_size, local_experts);
  std::vector<spec> s = {
      {"offsets", {segments + 1}, elem::i64}, {"rows_used", {segments}, elem::i64},
      {"row_token", {rows}, elem::i32},       {"assignment_row", {T, cfg.top_k}, elem::i64},
      {"num_rows", {1}, elem::i64},
  };
  if (kind == layout_kind::compact) s.push_back({"block_expert", {rows / block_size}, elem::i32});
  if (local_experts > 0) s.push_back({"nonlocal", {1}, elem::i64});
  return s;
}

const spec& find_spec(const std::vector<spec>& specs, const std::string& name) {
  for (const auto& s : specs)
    if (s.name == name) return s;
  throw std::logic_error("moeroute binding: no spec named " + name);
}

bool lists(const std::vector<spec>& specs, const std::string& name) {
  for (const auto& s : specs)
    if (s.name == name) return true;
  return false;
}

}  // namespace moeroute::python
