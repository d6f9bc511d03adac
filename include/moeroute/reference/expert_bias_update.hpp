// SPDX-License-Identifier: Apache-2.0
// CPU reference: the expert-bias update of aux-loss-free load balancing (DeepSeek-V3,
// Wang et al. 2024), with load counts accumulated over the micro-batches of one step.
// Formula in docs/numerics.md ("Gradients", "Expert-bias update").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/status.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::reference {

/// @brief Per-expert load counts summed over the micro-batches of one optimiser step.
///        `add` ignores a micro_batch_id it has already seen since the last reset(), so the
///        forward that activation checkpointing recomputes during backward does not count twice.
class expert_load_accumulator {
 public:
  explicit expert_load_accumulator(std::int32_t experts)
      : counts_(experts > 0 ? static_cast<std::size_t>(experts) : 0, 0) {
    if (experts <= 0)
      throw error(status::make(status_code::invalid_argument,
                               "experts = " + std::to_string(experts) + ": must be >= 1"));
  }

  /// @brief Adds one micro-batch's loads ([E], e.g. dispatch_output::requested).
  /// @return true if added, false if micro_batch_id was already added (nothing changes).
  bool add(std::span<const std::int64_t> counts, std::int64_t micro_batch_id) {
    if (counts.size() != counts_.size())
      throw error(
          status::make(status_code::invalid_shape,
                       "counts has " + std::to_string(counts.size()) +
                           " elements, expected experts = " + std::to_string(counts_.size())));
    if (std::find(seen_.begin(), seen_.end(), micro_batch_id) != seen_.end()) return false;
    seen_.push_back(micro_batch_id);
    for (std::size_t e = 0; e < counts_.size(); ++e) counts_[e] += counts[e];
    return true;
  }

  /// @brief Adds the selection loads of a routed micro-batch: `requested` (valid assignments
  ///        per chosen expert, before any drop — what the bias steers).
  bool add(const dispatch_output& dsp, std::int64_t micro_batch_id) {
    return add(std::span<const std::int64_t>(dsp.requested), micro_batch_id);
  }

  [[nodiscard]] const std::vector<std::int64_t>& counts() const noexcept { return counts_; }
  [[nodiscard]] std::int64_t micro_batches() const noexcept {
    return static_cast<std::int64_t>(seen_.size());
  }
  /// Starts the next step: counts to 0, no micro-batch seen.
  void reset() {
    std::fill(counts_.begin(), counts_.end(), 0);
    seen_.clear();
  }

 private:
  std::vector<std::int64_t> counts_;
  std::vector<std::int64_t> seen_;
};

/// @brief bias[e] += rate * sign(mean(load) - load[e]) (sign(0) = 0), then, with recenter,
///        bias -= mean(bias); rate and recenter are cfg.gating.bias_update. Means are computed in
///        double; all-zero loads change nothing.
/// @param cfg  the routing config (validated; bias and load have cfg.num_experts entries)
/// @param bias [E] updated in place; load [E] counts (e.g. expert_load_accumulator::counts()).
inline void expert_bias_update(const routing_config& cfg, std::span<float> bias,
                               std::span<const std::int64_t> load) {
  throw_if_error(validate(cfg));
  const auto E = static_cast<std::size_t>(cfg.num_experts);
  if (bias.size() != E || load.size() != E)
    throw error(status::make(
        status_code::invalid_shape,
        "bias has " + std::to_string(bias.size()) + " and load " + std::to_string(load.size()) +
            " elements, expected num_experts = " + std::to_string(E) + " each"));
  const bias_update_config& c = cfg.gating.bias_update;
  double total = 0.0;
  for (auto v : load) total += static_cast<double>(v);
  const double mean = total / static_cast<double>(load.size());
  for (std::size_t e = 0; e < bias.size(); ++e) {
    const double off = mean - static_cast<double>(load[e]);
    const float sgn = off > 0.0 ? 1.0f : (off < 0.0 ? -1.0f : 0.0f);
    bias[e] += c.rate * sgn;
  }
  if (c.recenter) {
    double s = 0.0;
    for (float b : bias) s += b;
    const double mb = s / static_cast<double>(bias.size());
    for (auto& b : bias) b = static_cast<float>(b - mb);
  }
}

}  // namespace moeroute::reference
MOEROUTE_PRECISE_FP_END
