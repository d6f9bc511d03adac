// SPDX-License-Identifier: Apache-2.0
// Parameters of the permute backward pass (d expert-buffer rows -> d x),
// shared by every backend: cpu::permute_backward and cuda::permute_backward take the same struct
// and start their validate() with the same check_params(). Pointers are named d_ (data) in both:
// device memory for the CUDA backend, host memory for the CPU backend. Plain C++.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// @brief Inputs and outputs of permute_backward.
template <class Element>
struct permute_backward_params {
  const Element* d_grad_buf = nullptr;  ///< [rows, d] dL/d expert-buffer rows
  std::int64_t rows = 0;                ///< rows of d_grad_buf
  std::int64_t tokens = 0;              ///< T
  std::int64_t hidden = 0;              ///< d
  /// From layout: d_assignment_row [T, k] (-1 = none). Other fields not read.
  const_layout_result layout{};
  bool accumulate = false;      ///< add into d_grad_x (e.g. on the residual part)
  Element* d_grad_x = nullptr;  ///< [T, d] out
};

/// @brief Checks config, shapes and pointers; names the first bad field. Every backend's validate()
/// runs this first.
template <class Element>
[[nodiscard]] status check_params(const routing_config& cfg,
                                  const permute_backward_params<Element>& p) {
  if (auto s = param_checks::validate_extents(cfg, p.tokens, p.rows, p.hidden); !s) return s;
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  if (p.rows > 0)
    if (auto s = param_checks::require_pointers("with rows > 0",
                                                param_checks::required(p.d_grad_buf, "d_grad_buf"));
        !s)
      return s;
  return param_checks::require_pointers(
      "with tokens > 0",
      param_checks::required(p.layout.d_assignment_row, "layout.d_assignment_row"),
      param_checks::required(p.d_grad_x, "d_grad_x"));
}

/// @brief The same call with the rows read as `To` (same size and bits).
template <class To, class From>
[[nodiscard]] permute_backward_params<To> rebind(const permute_backward_params<From>& p) noexcept {
  permute_backward_params<To> q;
  q.d_grad_buf = param_checks::rebind_elements<To>(p.d_grad_buf);
  q.rows = p.rows;
  q.tokens = p.tokens;
  q.hidden = p.hidden;
  q.layout = p.layout;
  q.accumulate = p.accumulate;
  q.d_grad_x = param_checks::rebind_elements<To>(p.d_grad_x);
  return q;
}

}  // namespace moeroute
