// SPDX-License-Identifier: Apache-2.0
// Parameters of the dispatch stage (capacity assignment: a fate, expert, slot and
// weight per assignment, per-expert counts and the batch totals),
// shared by every backend: cpu::dispatch and cuda::dispatch take the same struct and start their
// validate() with the same check_params(). Pointers are named d_ (data) in both: device
// memory for the CUDA backend, host memory for the CPU backend. Plain C++.
#pragma once

#include <cstdint>
#include <string>

#include <moeroute/config.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// @brief Inputs and outputs of dispatch. Inputs are what the gating stage wrote.
struct dispatch_params {
  std::int64_t tokens = 0;  ///< T
  /// From gating: d_ids [T, k] int32, d_gates [T, k] f32, d_reroute_ids [T, R] int32
  /// (next_choice with R > 0 only), d_token_priority [T] f32 (batch_prioritized only),
  /// d_second_skipped [T] uint8 (second_expert_policy::random only). Others are not read.
  const_gating_result gated{};
  const std::uint8_t* d_valid = nullptr;  ///< [T] uint8 1 = real token; null = all valid
  /// [1] int64 or null: the real tokens n, the first n rows; rows [n, T) are padding (masked)
  /// and C is the capacity of n tokens, so the result is dispatch of the first n tokens. For a
  /// count the caller holds only in device memory (a CUDA graph captured once for the largest
  /// batch). One capacity group only. cuda::dispatch reads n on the device and clamps it to
  /// [0, T]; cpu::dispatch reads it on the host and rejects one outside [0, T].
  const std::int64_t* d_token_count = nullptr;
  /// Outputs: d_expert, d_slot, d_weight, d_fate [T, k]; d_requested, d_kept, d_rerouted,
  /// d_dropped [E]; d_received, d_load [total_experts]; d_totals [1]. All written.
  dispatch_result out{};
};

/// @brief A token count held in memory (d_token_count, or the CUDA router's device_tokens)
///        needs one capacity group: the groups' sizes come from T on the host.
[[nodiscard]] inline status check_token_count(const routing_config& cfg, bool counted) {
  if (!counted || cfg.capacity.group_tokens <= 0) return status::success();
  return status::make(
      status_code::invalid_argument,
      "d_token_count with capacity.group_tokens = " + std::to_string(cfg.capacity.group_tokens) +
          ": capacity groups need the token count on the host (pass T)");
}

/// @brief Checks config, shapes and pointers; names the first bad field. Every backend's validate()
/// runs this first.
[[nodiscard]] inline status check_params(const routing_config& cfg, const dispatch_params& p) {
  if (auto s = param_checks::validate_extents(cfg, p.tokens); !s) return s;
  if (p.tokens == 0) return status::success();
  if (auto s = check_token_count(cfg, p.d_token_count != nullptr); !s) return s;
  if (cfg.dispatch.prio == priority::batch_prioritized)
    if (auto s = param_checks::require_pointers(
            "with dispatch.prio = batch_prioritized",
            param_checks::required(p.gated.d_token_priority, "gated.d_token_priority"));
        !s)
      return s;
  if (cfg.gating.second_expert.policy == second_expert_policy::random)
    if (auto s = param_checks::require_pointers(
            "with gating.second_expert.policy = random",
            param_checks::required(p.gated.d_second_skipped, "gated.d_second_skipped"));
        !s)
      return s;
  if (cfg.candidates_per_token() > cfg.top_k)
    if (auto s = param_checks::require_pointers(
            "with dispatch.dropped = next_choice (R > 0)",
            param_checks::required(p.gated.d_reroute_ids, "gated.d_reroute_ids"));
        !s)
      return s;
  const dispatch_result& o = p.out;
  return param_checks::require_pointers("with tokens > 0",
                                        param_checks::required(p.gated.d_ids, "gated.d_ids"),
                                        param_checks::required(p.gated.d_gates, "gated.d_gates"),
                                        param_checks::required(o.d_expert, "out.d_expert"),
                                        param_checks::required(o.d_slot, "out.d_slot"),
                                        param_checks::required(o.d_weight, "out.d_weight"),
                                        param_checks::required(o.d_fate, "out.d_fate"),
                                        param_checks::required(o.d_requested, "out.d_requested"),
                                        param_checks::required(o.d_kept, "out.d_kept"),
                                        param_checks::required(o.d_rerouted, "out.d_rerouted"),
                                        param_checks::required(o.d_dropped, "out.d_dropped"),
                                        param_checks::required(o.d_received, "out.d_received"),
                                        param_checks::required(o.d_load, "out.d_load"),
                                        param_checks::required(o.d_totals, "out.d_totals"));
}

}  // namespace moeroute
