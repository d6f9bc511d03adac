// SPDX-License-Identifier: Apache-2.0
// Parameters of token_mask, shared by every backend: the padding mask of a batch whose real
// token count is held in memory rather than known on the host (an engine's CUDA graph captured
// once for the largest batch, the count written before each replay). Plain C++.
#pragma once

#include <cstdint>
#include <string>

#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>

namespace moeroute {

/// @brief The rows, the count and the masks of token_mask.
struct token_mask_params {
  std::int64_t tokens = 0;                ///< T, the rows (real tokens first, then padding)
  const std::int64_t* d_count = nullptr;  ///< [1] int64 n: the first n rows are real
  const std::uint8_t* d_valid = nullptr;  ///< [T] uint8 1 = real token, or null (all real)
  std::uint8_t* d_mask = nullptr;         ///< [T] uint8, written: 1 = routed, 0 = padding
};

/// @brief Checks the shape and the pointers; names the first bad field. Every backend's
///        validate() runs this first.
[[nodiscard]] inline status check_params(const token_mask_params& p) {
  if (p.tokens < 0)
    return status::make(status_code::invalid_shape,
                        "tokens = " + std::to_string(p.tokens) + ": must be >= 0");
  if (p.tokens == 0) return status::success();
  return param_checks::require_pointers("", param_checks::required(p.d_count, "d_count"),
                                        param_checks::required(p.d_mask, "d_mask"));
}

}  // namespace moeroute
