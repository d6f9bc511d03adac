// SPDX-License-Identifier: Apache-2.0
// Parameters of the loss stage (aux, sequence-aux and z-loss values from the gating sums),
// shared by every backend: cpu::losses and cuda::losses take the same struct and start their
// validate() with the same check_params(). Pointers are named d_ (data) in both: device
// memory for the CUDA backend, host memory for the CPU backend. Plain C++.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// @brief Inputs (the gating sums) and outputs (device scalars) of losses.
///        Any output pointer may be null: that value is not computed.
struct loss_params {
  /// T the sums cover (0: nothing is written): S = T / loss.sequence_length sequences. Sums
  /// added over ranks (a sequence split by context parallelism) cover the whole batch's T.
  std::int64_t tokens = 0;
  const_gating_sums sums{};  ///< gating_params::out.sums, or such sums added over shards (d_seq_*
                             ///< used iff loss.sequence_length > 0; d_aux_* only with d_aux_loss;
                             ///< d_z_sum_squares only with d_z_loss and z_coefficient != 0)
  double* d_aux_loss = nullptr;           ///< [1] f64: coefficient * scale * sum_e f_e P_e
  double* d_sequence_aux_loss = nullptr;  ///< [1] f64: the per-sequence losses reduced by
                                          ///< loss.sequence_reduce (0 when sequence_length == 0)
  double* d_z_loss = nullptr;             ///< [1] f64: z_coefficient * sum lse^2 / T (0 when
                                          ///< z_coefficient = 0: sums.d_z_sum_squares unread)
};

/// @brief Checks config, shape and pointers of a loss call; names the first bad field. Every
/// backend's validate() runs this first.
[[nodiscard]] inline status check_params(const routing_config& cfg, const loss_params& p) {
  if (auto s = param_checks::validate_extents(cfg, p.tokens); !s) return s;
  if (p.tokens == 0) return status::success();
  if (auto s = param_checks::require_pointers(
          "with tokens > 0", param_checks::required(p.sums.d_valid_tokens, "sums.d_valid_tokens"));
      !s)
    return s;
  if (p.d_aux_loss != nullptr)
    if (auto s = param_checks::require_pointers(
            "with d_aux_loss",
            param_checks::required(p.sums.d_aux_score_sum, "sums.d_aux_score_sum"),
            param_checks::required(p.sums.d_aux_count, "sums.d_aux_count"));
        !s)
      return s;
  if (p.d_z_loss != nullptr && cfg.loss.z_coefficient != 0.0f)
    if (auto s = param_checks::require_pointers(
            "with d_z_loss and loss.z_coefficient != 0",
            param_checks::required(p.sums.d_z_sum_squares, "sums.d_z_sum_squares"));
        !s)
      return s;
  if (p.d_sequence_aux_loss == nullptr || cfg.loss.sequence_length == 0) return status::success();
  return param_checks::require_pointers(
      "with d_sequence_aux_loss and loss.sequence_length > 0",
      param_checks::required(p.sums.d_seq_score_sum, "sums.d_seq_score_sum"),
      param_checks::required(p.sums.d_seq_count, "sums.d_seq_count"),
      param_checks::required(p.sums.d_seq_tokens, "sums.d_seq_tokens"));
}

}  // namespace moeroute
