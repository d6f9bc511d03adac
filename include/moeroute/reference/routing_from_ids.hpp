// SPDX-License-Identifier: Apache-2.0
// CPU reference: an engine's own top-k as the input of dispatch. Engines that already choose
// experts (often in a router GEMM epilogue) hand their ids and gates to capacity assignment,
// the layouts, permute and combine without moeroute's gating. The CPU and CUDA backends take
// the same arrays directly in dispatch_params::gated.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include <moeroute/config.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/status.hpp>

namespace moeroute::reference {

/// @brief What dispatch reads of a routing chosen elsewhere. T is ids.size() / k.
/// @note Which policies need more than ids and gates (the rest never read the logits):
///       priority::batch_prioritized reads token_priority (the token's top-1 score);
///       dispatch.dropped = next_choice (R > 0) reads reroute_ids (the experts ranked k + 1 ..
///       k + R); gating.second_expert.policy = random reads second_skipped. An array that the
///       config does not read must be empty.
struct given_routing {
  std::span<const std::int32_t> ids;  ///< [T, k] expert ids in [0, E), distinct per token
  std::span<const float> gates;       ///< [T, k] finite pre-drop gates (what combine weighs)
  std::span<const std::int32_t> reroute_ids{};     ///< [T, R] distinct from the token's ids
  std::span<const float> token_priority{};         ///< [T] finite
  std::span<const std::uint8_t> second_skipped{};  ///< [T] 1 = drop the second choice
  std::span<const std::uint8_t> valid{};           ///< [T] 1 = real token; empty = all valid
};

/// @brief A gating_output holding a routing chosen elsewhere, ready for reference::dispatch
///        (and the layouts, permute and combine after it), validated like one from gating.
/// @return the routing; aux_count counts the given ids as the config's loss counts them
///         (top-1 or all k, over valid tokens); the score sums, logsumexp and z sums are zero
///         (the logits were never seen: take the losses from the engine's own scores).
/// @throws moeroute::error naming the bad field: ids.size() not a multiple of top_k, an array
///         of the wrong length, an id outside [0, E) or repeated within a token, a non-finite
///         gate or priority.
inline gating_output routing_from_ids(const routing_config& cfg, const given_routing& r) {
  throw_if_error(validate(cfg));
  const std::int32_t k = cfg.top_k;
  if (r.ids.size() % static_cast<std::size_t>(k) != 0)
    throw error(status::make(status_code::invalid_shape,
                             "ids has " + std::to_string(r.ids.size()) +
                                 " elements: not a multiple of top_k = " + std::to_string(k)));
  const std::int64_t T = static_cast<std::int64_t>(r.ids.size()) / k;
  throw_if_error(validate_tokens(cfg, T));
  gating_output g;
  g.tokens = T;
  g.experts = cfg.num_experts;
  g.k = k;
  g.reroute_candidates = cfg.reroute_candidates();
  g.ids.assign(r.ids.begin(), r.ids.end());
  g.gates.assign(r.gates.begin(), r.gates.end());
  g.reroute_ids.assign(r.reroute_ids.begin(), r.reroute_ids.end());
  g.token_priority.assign(r.token_priority.begin(), r.token_priority.end());
  g.second_skipped.assign(r.second_skipped.begin(), r.second_skipped.end());
  if (r.valid.empty()) {
    g.valid.assign(static_cast<std::size_t>(T), 1);
  } else {
    g.valid.assign(r.valid.begin(), r.valid.end());
  }
  g.logsumexp.assign(static_cast<std::size_t>(T), 0.0f);
  // lengths, ranges, distinctness and finiteness, named as gating_output fields
  throw_if_error(validate_gating_output(cfg, g));
  g.aux_score_sum.assign(static_cast<std::size_t>(cfg.num_experts), 0.0);
  g.aux_count.assign(static_cast<std::size_t>(cfg.num_experts), 0);
  const std::int64_t L = cfg.loss.sequence_length, E = cfg.num_experts;
  g.sequences = L > 0 ? T / L : 0;
  g.seq_score_sum.assign(static_cast<std::size_t>(g.sequences * E), 0.0);
  g.seq_count.assign(static_cast<std::size_t>(g.sequences * E), 0);
  g.seq_tokens.assign(static_cast<std::size_t>(g.sequences), 0);
  const std::int32_t counted = cfg.aux_counts_per_token();
  for (std::int64_t t = 0; t < T; ++t) {
    if (g.valid[static_cast<std::size_t>(t)] == 0) continue;
    const std::int64_t seq = L > 0 ? t / L : -1;
    ++g.valid_tokens;
    if (seq >= 0) ++g.seq_tokens[seq];
    for (std::int32_t j = 0; j < counted; ++j) {
      ++g.aux_count[g.ids[t * k + j]];
      if (seq >= 0) ++g.seq_count[seq * E + g.ids[t * k + j]];
    }
  }
  return g;
}

}  // namespace moeroute::reference
