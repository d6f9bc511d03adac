// SPDX-License-Identifier: Apache-2.0
// Parameters of the combine backward pass (permute's: params/permute_backward.hpp),
// shared by every backend: cpu::combine_backward and cuda::combine_backward take the same struct
// and start their validate() with the same check_params(). Pointers are named d_ (data) in both:
// device memory for the CUDA backend, host memory for the CPU backend. Plain C++.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// @brief Inputs and outputs of combine_backward. Element = float, __half or __nv_bfloat16.
template <class Element>
struct combine_backward_params {
  const Element* d_expert_out = nullptr;  ///< [rows, d] the experts' outputs (forward input)
  const Element* d_dy = nullptr;          ///< [T, d] dL/dy
  std::int64_t rows = 0;                  ///< rows of the layout's buffers
  std::int64_t tokens = 0;                ///< T
  std::int64_t hidden = 0;                ///< d
  /// From layout: d_row_token [rows], d_assignment_row [T, k]. Other fields not read.
  const_layout_result layout{};
  /// From dispatch: d_weight, d_fate [T, k]. Other fields not read.
  const_dispatch_result dispatched{};
  Element* d_grad_expert_out = nullptr;  ///< [rows, d] out (padding rows 0)
  float* d_grad_weight = nullptr;        ///< [T, k] f32 out (0 for dropped / masked)
  Element* d_grad_x = nullptr;           ///< [T, d] out or null: residual pass-through, else 0
};

/// @brief Checks config, shapes and pointers; names the first bad field. Every backend's validate()
/// runs this first.
template <class Element>
[[nodiscard]] status check_params(const routing_config& cfg,
                                  const combine_backward_params<Element>& p) {
  if (auto s = param_checks::validate_extents(cfg, p.tokens, p.rows, p.hidden); !s) return s;
  // d = 0 leaves the [rows, d] and [T, d] buffers empty; d_grad_weight is still written (0).
  if (p.rows > 0 && p.hidden > 0)
    if (auto s = param_checks::require_pointers(
            "with rows > 0", param_checks::required(p.d_expert_out, "d_expert_out"),
            param_checks::required(p.layout.d_row_token, "layout.d_row_token"),
            param_checks::required(p.d_grad_expert_out, "d_grad_expert_out"));
        !s)
      return s;
  // The [T, .] inputs are empty with T = 0; rows may still be E * C > 0 (min_capacity), all of
  // them padding then, and the rows kernel reads nothing but row_token for a padding row.
  if (p.tokens == 0) return status::success();
  if (p.hidden > 0)
    if (auto s = param_checks::require_pointers("with tokens > 0",
                                                param_checks::required(p.d_dy, "d_dy"));
        !s)
      return s;
  return param_checks::require_pointers(
      "with tokens > 0",
      param_checks::required(p.layout.d_assignment_row, "layout.d_assignment_row"),
      param_checks::required(p.dispatched.d_weight, "dispatched.d_weight"),
      param_checks::required(p.dispatched.d_fate, "dispatched.d_fate"),
      param_checks::required(p.d_grad_weight, "d_grad_weight"));
}

/// @brief The same call with the rows read as `To` (same size and bits).
template <class To, class From>
[[nodiscard]] combine_backward_params<To> rebind(const combine_backward_params<From>& p) noexcept {
  combine_backward_params<To> q;
  q.d_expert_out = param_checks::rebind_elements<To>(p.d_expert_out);
  q.d_dy = param_checks::rebind_elements<To>(p.d_dy);
  q.rows = p.rows;
  q.tokens = p.tokens;
  q.hidden = p.hidden;
  q.layout = p.layout;
  q.dispatched = p.dispatched;
  q.d_grad_expert_out = param_checks::rebind_elements<To>(p.d_grad_expert_out);
  q.d_grad_weight = p.d_grad_weight;
  q.d_grad_x = param_checks::rebind_elements<To>(p.d_grad_x);
  return q;
}

}  // namespace moeroute
