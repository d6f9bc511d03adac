// SPDX-License-Identifier: Apache-2.0
// CPU backend: aux loss, sequence-level aux loss and z-loss values from the sums cpu::gating
// writes — the operation and params of cuda::losses, the reference's arithmetic bit for bit
// (every product and quotient rounded on its own, sequences added in order).
#pragma once

#include <cstdint>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/losses.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::cpu {

using moeroute::loss_params;

/// @brief Checks config, shape and pointers (check_params); names the first bad field.
[[nodiscard]] inline status validate(const routing_config& cfg, const loss_params& p) {
  return check_params(cfg, p);
}

/// @brief Loss values from the gating sums (any output pointer may be null: not computed).
///        aux = (coefficient * scale) * sum_e (count_e / T) (score_sum_e / T); the sequence
///        aux loss the sum of the per-sequence losses, or their mean over the sequences with a
///        valid token (loss.sequence_reduce); z = (z_coefficient * sum) / T.
/// @note Synchronous, no allocation; equal to reference::losses bit for bit given the same
///       sums. T = 0: success, nothing written.
[[nodiscard]] inline status losses(const routing_config& cfg, const loss_params& p,
                                   [[maybe_unused]] const executor& ex = {}) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  const std::int32_t E = cfg.num_experts;
  const std::int64_t n = *p.sums.d_valid_tokens;
  const double T = static_cast<double>(n);
  const double scale = aux_loss_scale(cfg);
  if (p.d_aux_loss != nullptr) {
    double s = 0.0;
    if (n > 0)
      for (std::int32_t e = 0; e < E; ++e)
        s += (static_cast<double>(p.sums.d_aux_count[e]) / T) * (p.sums.d_aux_score_sum[e] / T);
    *p.d_aux_loss = n > 0 ? cfg.loss.aux_coefficient * scale * s : 0.0;
  }
  if (p.d_z_loss != nullptr)
    *p.d_z_loss = n > 0 && cfg.loss.z_coefficient != 0.0f
                      ? cfg.loss.z_coefficient * *p.sums.d_z_sum_squares / T
                      : 0.0;
  if (p.d_sequence_aux_loss != nullptr) {
    const std::int64_t L = cfg.loss.sequence_length;
    const std::int64_t S = L > 0 ? p.tokens / L : 0;
    double total = 0.0;
    std::int64_t used = 0;
    for (std::int64_t q = 0; q < S; ++q) {
      const double len = static_cast<double>(p.sums.d_seq_tokens[q]);
      if (len == 0) continue;
      double acc = 0.0;
      for (std::int32_t e = 0; e < E; ++e)
        acc += (static_cast<double>(p.sums.d_seq_count[q * E + e]) / len) *
               (p.sums.d_seq_score_sum[q * E + e] / len);
      total += scale * acc;
      ++used;
    }
    const bool sum = cfg.loss.sequence_reduce == sequence_reduction::sum;
    *p.d_sequence_aux_loss = used == 0 ? 0.0
                             : sum     ? cfg.loss.aux_coefficient * total
                                   : cfg.loss.aux_coefficient * total / static_cast<double>(used);
  }
  return status::success();
}

}  // namespace moeroute::cpu
MOEROUTE_PRECISE_FP_END
