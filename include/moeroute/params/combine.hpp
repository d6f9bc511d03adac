// SPDX-License-Identifier: Apache-2.0
// Parameters of combine (expert rows weighted back into tokens),
// shared by every backend: cpu::combine and cuda::combine take the same struct and start their
// validate() with the same check_params(). Pointers are named d_ (data) in both: device
// memory for the CUDA backend, host memory for the CPU backend. Plain C++.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// @brief Inputs and outputs of combine. Element = float, __half or __nv_bfloat16.
template <class Element>
struct combine_params {
  const Element* d_expert_out = nullptr;  ///< [rows, d] expert outputs in layout order
  std::int64_t rows = 0;                  ///< rows of d_expert_out
  std::int64_t tokens = 0;                ///< T
  std::int64_t hidden = 0;                ///< d
  /// From layout: d_assignment_row [T, k] int64 (-1 = none). Other fields not read.
  const_layout_result layout{};
  /// From dispatch: d_weight [T, k] f32; d_fate [T, k] (residual policy only).
  const_dispatch_result dispatched{};
  const Element* d_x = nullptr;  ///< [T, d] layer input (drop_policy::residual only)
  Element* d_y = nullptr;        ///< [T, d] out
};

/// @brief Checks config, shapes and pointers; names the first bad field. Every backend's validate()
/// runs this first.
template <class Element>
[[nodiscard]] status check_params(const routing_config& cfg, const combine_params<Element>& p) {
  if (auto s = param_checks::validate_extents(cfg, p.tokens, p.rows, p.hidden); !s) return s;
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  if (p.rows > 0)
    if (auto s = param_checks::require_pointers(
            "with rows > 0", param_checks::required(p.d_expert_out, "d_expert_out"));
        !s)
      return s;
  if (auto s = param_checks::require_pointers(
          "with tokens > 0",
          param_checks::required(p.layout.d_assignment_row, "layout.d_assignment_row"),
          param_checks::required(p.dispatched.d_weight, "dispatched.d_weight"),
          param_checks::required(p.d_y, "d_y"));
      !s)
    return s;
  if (cfg.dispatch.dropped != drop_policy::residual) return status::success();
  return param_checks::require_pointers(
      "with the residual policy", param_checks::required(p.dispatched.d_fate, "dispatched.d_fate"),
      param_checks::required(p.d_x, "d_x"));
}

/// @brief The same call with the rows read as `To` (same size and bits).
template <class To, class From>
[[nodiscard]] combine_params<To> rebind(const combine_params<From>& p) noexcept {
  return {param_checks::rebind_elements<To>(p.d_expert_out),
          p.rows,
          p.tokens,
          p.hidden,
          p.layout,
          p.dispatched,
          param_checks::rebind_elements<To>(p.d_x),
          param_checks::rebind_elements<To>(p.d_y)};
}

}  // namespace moeroute
