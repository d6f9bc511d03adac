// SPDX-License-Identifier: Apache-2.0
// CPU reference: what the backward row operations (combine_backward, permute_backward) share —
// the accumulation type, loads and stores through it, and the checks of their inputs.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include <moeroute/config.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating_backward.hpp>
#include <moeroute/reference/layout.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::reference {

/// Accumulation type of the combine/permute backward for storage type T: double for double,
/// float for float, half_bits and bf16_bits.
template <class T>
using grad_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

namespace detail {
template <class T>
grad_acc_t<T> load_acc(T v) {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
    return v;
  } else {
    return to_float(v);
  }
}
template <class T>
T store_acc(grad_acc_t<T> v) {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
    return v;
  } else {
    return from_float<T>(v);
  }
}

/// Throws unless cfg is valid and dsp has its extents, d is a hidden size, and the layout's
/// rows and tokens fit dsp (sizes and ranges): what both backward passes read before they start.
inline void check_backward_inputs(const routing_config& cfg, const dispatch_output& dsp,
                                  const layout_output& L, std::int64_t d) {
  check_dispatch_of(cfg, dsp);
  throw_if_error(validate_hidden(d));
  if (dsp.tokens < 0 || dsp.k < 0 || L.num_rows < 0)
    throw error(status::make(status_code::invalid_shape,
                             "dispatch_output tokens / k or layout num_rows is negative"));
  grad_check_size("layout row_token", L.row_token.size(), L.num_rows);
  grad_check_size("layout assignment_row", L.assignment_row.size(), dsp.tokens * dsp.k);
  for (std::int64_t r = 0; r < L.num_rows; ++r)
    if (L.row_token[r] < -1 || L.row_token[r] >= dsp.tokens)
      throw error(
          status::make(status_code::invalid_argument, "layout row_token[" + std::to_string(r) +
                                                          "] = " + std::to_string(L.row_token[r]) +
                                                          ": not a token of dispatch_output"));
  for (std::size_t a = 0; a < L.assignment_row.size(); ++a)
    if (L.assignment_row[a] < -1 || L.assignment_row[a] >= L.num_rows)
      throw error(status::make(status_code::invalid_argument,
                               "layout assignment_row[" + std::to_string(a) +
                                   "] = " + std::to_string(L.assignment_row[a]) +
                                   ": not a row of the layout"));
}
}  // namespace detail

}  // namespace moeroute::reference
MOEROUTE_PRECISE_FP_END
