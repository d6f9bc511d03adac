// SPDX-License-Identifier: Apache-2.0
// Routing replay (docs/replay.md): the top-k *selection* of an earlier routing (a rollout
// engine's, recorded per layer) forced on this one, the gates recomputed from the live logits so
// the gradient still reaches the router. The rule every backend follows, per token:
//   1. slot j with replay id r >= 0 keeps r, unless the score filter is on (min_score_ratio > 0)
//      and score(r) < ratio * the weakest score among the router's own top-k: then the slot is
//      given back ("replaced", counted over valid tokens);
//   2. slots with r = -1 and the given-back slots take, in slot order, the best experts not kept
//      in step 1 under the config's own rule (bias, group limit, sampling), and the R reroute
//      candidates follow them;
//   3. gates, aux and z-loss inputs, priorities and draws are computed for these ids as for the
//      router's own. Group limits and the expert bias never filter a replayed id.
// Scores of the filter are those of the clean logits: softmax probabilities (compared through
// logit differences: p_a / p_b = exp(x_a - x_b)) or the per-expert score function.
// Plain C++, shared by host and device code.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include <moeroute/config.hpp>
#include <moeroute/macros.hpp>
#include <moeroute/status.hpp>

namespace moeroute {

/// @brief The replay of one gating call (gating_params::replay). All pointers null: no replay.
///        Host pointers for the CPU backend, device pointers for the CUDA backend.
struct gating_replay {
  /// [T, k] int32 the expert slot j of token t keeps; -1 = the router chooses. Distinct per
  /// token. null = no replay.
  const std::int32_t* d_ids = nullptr;
  /// In [0, 1]. > 0: a replayed expert is kept only if its score is at least this fraction of
  /// the weakest score of the router's own top-k (prime-rl's router_replay_score_threshold_ratio);
  /// 0 keeps every replayed expert.
  float min_score_ratio = 0.0f;
  /// [1] int64 out (optional): replayed slots of valid tokens the filter gave back.
  std::int64_t* d_replaced = nullptr;
  /// [1] int64 out (optional), CUDA only: replayed ids outside [-1, E) or repeated in their
  /// token, taken as -1. A launcher cannot return a status for device data without a sync; the
  /// host backends return invalid_argument for the same input, so this is 0 there.
  std::int64_t* d_invalid = nullptr;

  [[nodiscard]] MOEROUTE_HOST_DEVICE bool active() const noexcept { return d_ids != nullptr; }
};

/// @brief Checks the replay options of a gating call (not the ids: they may be device data).
[[nodiscard]] inline status check_replay(const gating_replay& r) {
  if (!(r.min_score_ratio >= 0.0f && r.min_score_ratio <= 1.0f))
    return status::make(
        status_code::invalid_argument,
        "replay.min_score_ratio = " + std::to_string(r.min_score_ratio) + ": must be in [0, 1]");
  if (r.min_score_ratio > 0.0f && r.d_ids == nullptr)
    return status::make(status_code::invalid_argument,
                        "replay.min_score_ratio > 0 but replay.d_ids is null");
  return status::success();
}

/// @brief Checks host replay ids [T, k]: each in [-1, E), no expert twice in a token; names the
///        first bad element as `what[i]`.
[[nodiscard]] inline status check_replay_ids(const routing_config& cfg, const std::int32_t* ids,
                                             std::int64_t tokens, const char* what) {
  const std::int32_t k = cfg.top_k, E = cfg.num_experts;
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int32_t e = ids[t * k + j];
      const auto where = [&] {
        return std::string(what) + "[" + std::to_string(t * k + j) + "] = " + std::to_string(e);
      };
      if (e < -1 || e >= E)
        return status::make(status_code::invalid_argument,
                            where() + ": not an expert in [0, " + std::to_string(E) + ") nor -1");
      for (std::int32_t i = 0; i < j && e >= 0; ++i)
        if (ids[t * k + i] == e)
          return status::make(
              status_code::invalid_argument,
              where() + ": repeats slot " + std::to_string(i) + " of token " + std::to_string(t));
    }
  return status::success();
}

/// @brief log(ratio) in double, the softmax filter's threshold on a logit difference (-inf for
///        0: every replayed expert kept). Computed on the host, once per call, for every backend.
[[nodiscard]] inline double replay_log_ratio(float ratio) noexcept {
  return ratio > 0.0f ? std::log(static_cast<double>(ratio)) : -HUGE_VAL;
}

/// @brief The filter's test for a replayed expert a against the weakest w of the router's own
///        top-k. Softmax: a and w are the clean logits, kept iff x_a - x_w >= log(ratio) (the
///        difference of two floats is exact in double). Per-expert scores: a and w are the
///        scores, kept iff s_a >= ratio * s_w in double.
[[nodiscard]] MOEROUTE_HOST_DEVICE inline bool replay_keeps(bool softmax, float a, float w,
                                                            float ratio,
                                                            double log_ratio) noexcept {
  if (softmax) return static_cast<double>(a) - static_cast<double>(w) >= log_ratio;
  return static_cast<double>(a) >= static_cast<double>(ratio) * static_cast<double>(w);
}

}  // namespace moeroute
