// SPDX-License-Identifier: Apache-2.0
// Parameters of permute (hidden states [T, d] gathered into expert rows),
// shared by every backend: cpu::permute and cuda::permute take the same struct and start their
// validate() with the same check_params(). Pointers are named d_ (data) in both: device
// memory for the CUDA backend, host memory for the CPU backend. Plain C++.
#pragma once

#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// @brief Inputs and outputs of permute. Element = float, __half or __nv_bfloat16.
template <class Element>
struct permute_params {
  const Element* d_x = nullptr;  ///< [T, d] hidden states
  std::int64_t tokens = 0;       ///< T
  std::int64_t hidden = 0;       ///< d
  /// From layout: d_row_token [rows] int32 (-1 = padding), d_num_rows [1] int64 rows in
  /// use (null = all `rows`). The other fields are not read.
  const_layout_result layout{};
  std::int64_t rows = 0;     ///< rows of layout.d_row_token and d_out (the layout's max_rows)
  Element* d_out = nullptr;  ///< [rows, d] out: expert input buffer
};

/// @brief Checks config, shapes and pointers; names the first bad field. Every backend's validate()
/// runs this first.
template <class Element>
[[nodiscard]] status check_params(const routing_config& cfg, const permute_params<Element>& p) {
  if (auto s = param_checks::validate_extents(cfg, p.tokens, p.rows, p.hidden); !s) return s;
  if (p.tokens == 0 || p.rows == 0 || p.hidden == 0) return status::success();
  if (auto s =
          param_checks::require_pointers("with tokens > 0", param_checks::required(p.d_x, "d_x"));
      !s)
    return s;
  return param_checks::require_pointers(
      "with rows > 0", param_checks::required(p.layout.d_row_token, "layout.d_row_token"),
      param_checks::required(p.d_out, "d_out"));
}

/// @brief The same call with the rows read as `To` (same size and bits).
template <class To, class From>
[[nodiscard]] permute_params<To> rebind(const permute_params<From>& p) noexcept {
  return {param_checks::rebind_elements<To>(p.d_x),  p.tokens, p.hidden, p.layout, p.rows,
          param_checks::rebind_elements<To>(p.d_out)};
}

}  // namespace moeroute
