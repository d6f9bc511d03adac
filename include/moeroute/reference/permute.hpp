// SPDX-License-Identifier: Apache-2.0
// CPU reference, stage 4a: permute hidden states into an expert layout (the rows the layout
// gives each expert, padding rows zero). Combine, its other half, is reference/combine.hpp.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include <moeroute/config.hpp>
#include <moeroute/reference/layout.hpp>
#include <moeroute/reference/row_checks.hpp>

namespace moeroute::reference {

/// @brief out[row] = x[row_token[row]], padding rows zero. x [T, d], out [num_rows, d].
///        cfg: the config of the routing the layout belongs to (checked with validate()).
template <class T>
void permute(const routing_config& cfg, const layout_output& L, std::span<const T> x,
             std::int64_t tokens, std::int64_t d, std::span<T> out) {
  throw_if_error(validate(cfg));
  detail::check_extents(L, tokens, d);
  detail::check_size("x", x.size(), detail::elements(tokens, d));
  detail::check_size("out", out.size(), detail::elements(L.num_rows, d));
  for (std::int64_t r = 0; r < L.num_rows; ++r)
    if (L.row_token[r] < -1 || L.row_token[r] >= tokens)
      throw error(status::make(status_code::invalid_argument,
                               "layout_output.row_token[" + std::to_string(r) +
                                   "] = " + std::to_string(L.row_token[r]) +
                                   " is outside [-1, tokens = " + std::to_string(tokens) +
                                   "): layout of another batch?"));
  for (std::int64_t r = 0; r < L.num_rows; ++r) {
    const std::int32_t t = L.row_token[r];
    for (std::int64_t c = 0; c < d; ++c) out[r * d + c] = t < 0 ? T{} : x[t * d + c];
  }
}

}  // namespace moeroute::reference
