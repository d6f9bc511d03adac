// SPDX-License-Identifier: Apache-2.0
// CPU reference: the extent checks the row operations (permute, combine) share.
#pragma once

#include <cstdint>
#include <string>

#include <moeroute/config.hpp>
#include <moeroute/reference/layout.hpp>
#include <moeroute/status.hpp>

namespace moeroute::reference {

namespace detail {
/// rows * d, or -1 when that product overflows (no buffer has that many elements).
inline std::int64_t elements(std::int64_t rows, std::int64_t d) {
  std::int64_t n = 0;
  return __builtin_mul_overflow(rows, d, &n) ? -1 : n;
}

/// Extents every permute/combine call shares: 0 <= tokens <= max_tokens, 0 <= d <= max_hidden,
/// and a layout whose arrays have their documented lengths.
inline void check_extents(const layout_output& L, std::int64_t tokens, std::int64_t d) {
  if (tokens < 0 || tokens > max_tokens)
    throw error(
        status::make(status_code::invalid_shape,
                     moeroute::detail::field_msg("tokens", tokens, "must be in [0, max_tokens]")));
  throw_if_error(validate_hidden(d));
  if (L.num_rows < 0 || static_cast<std::int64_t>(L.row_token.size()) != L.num_rows)
    throw error(status::make(status_code::invalid_argument,
                             "layout_output.row_token has " + std::to_string(L.row_token.size()) +
                                 " elements, expected num_rows = " + std::to_string(L.num_rows)));
}

inline void check_size(const char* what, std::size_t got, std::int64_t want) {
  if (want < 0 || static_cast<std::int64_t>(got) != want)
    throw error(status::make(status_code::invalid_shape,
                             std::string(what) + " has " + std::to_string(got) +
                                 " elements, expected " + std::to_string(want)));
}
}  // namespace detail

}  // namespace moeroute::reference
