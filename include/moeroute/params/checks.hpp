// SPDX-License-Identifier: Apache-2.0
// The checks every backend's validate() is made of: the config, the extents, and the pointers
// a call needs. One wording for every backend and operation, so an error reads the same
// whichever raised it. Plain C++ (no CUDA types).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <moeroute/config.hpp>
#include <moeroute/status.hpp>

namespace moeroute::param_checks {

/// A pointer a call needs, with the params field an error names.
struct named_pointer {
  const void* pointer;
  const char* name;
};

/// @brief The pointer `pointer` under the name `name`, for require_pointers.
[[nodiscard]] inline named_pointer required(const void* pointer, const char* name) noexcept {
  return {pointer, name};
}

/// @return invalid_argument "NAME is null WHEN" (or "NAME is null" for an empty `when`) for the
///         first null of `pointers`, in order; success when none is.
/// @note Variadic rather than an initializer_list: nvcc 13's front end rewrites a braced list
///       argument inside a nested if of a template into a statement expression.
template <class... Named>
requires(std::is_same_v<Named, named_pointer>&&...) [[nodiscard]] status
    require_pointers(const char* when, const Named&... pointers) {
  status result = status::success();
  const auto check = [&](const named_pointer& p) {
    if (result.ok() && p.pointer == nullptr)
      result = status::make(status_code::invalid_argument,
                            std::string(p.name) + " is null" + (*when ? " " : "") + when);
  };
  (check(pointers), ...);
  return result;
}

/// @brief A valid config and T tokens (0 <= T <= max_tokens, whole sequences).
[[nodiscard]] inline status validate_extents(const routing_config& cfg, std::int64_t tokens) {
  if (auto s = validate(cfg); !s) return s;
  return validate_tokens(cfg, tokens);
}

/// @brief As above, for an operation on rows of d values: rows >= 0 and 0 <= d <= max_hidden.
[[nodiscard]] inline status validate_extents(const routing_config& cfg, std::int64_t tokens,
                                             std::int64_t rows, std::int64_t hidden) {
  if (auto s = validate_extents(cfg, tokens); !s) return s;
  if (rows < 0)
    return status::make(status_code::invalid_shape,
                        "rows = " + std::to_string(rows) + ": must be >= 0");
  return validate_hidden(hidden);
}

/// @brief A token count read on the host (dispatch's d_token_count, token_mask's d_count; the
///        device clamps instead): invalid_argument "*NAME = n: must be in [0, tokens = T]"
///        outside [0, tokens].
[[nodiscard]] inline status validate_host_count(const char* name, std::int64_t n,
                                                std::int64_t tokens) {
  if (n >= 0 && n <= tokens) return status::success();
  return status::make(status_code::invalid_argument,
                      std::string("*") + name + " = " + std::to_string(n) +
                          ": must be in [0, tokens = " + std::to_string(tokens) + "]");
}

/// @brief The caller's workspace of an op that needs `need` bytes for `tokens` tokens (`query`
///        names the size function): at least that large, and 8-byte aligned, since the arrays
///        carved from it hold 8-byte values (cudaMalloc's 256 is best on the GPU). Null is fine
///        when nothing is needed.
[[nodiscard]] inline status validate_workspace(const char* op, const char* query,
                                               std::int64_t tokens, std::size_t need,
                                               const void* d_workspace,
                                               std::size_t workspace_bytes) {
  if (workspace_bytes < need || (need > 0 && d_workspace == nullptr))
    return status::make(status_code::workspace_too_small,
                        "workspace_bytes = " + std::to_string(workspace_bytes) + ": " + op +
                            " needs " + query + "(cfg, " + std::to_string(tokens) +
                            ") = " + std::to_string(need));
  if (reinterpret_cast<std::uintptr_t>(d_workspace) % 8 != 0)
    return status::make(status_code::invalid_argument, "d_workspace is not 8-byte aligned");
  return status::success();
}

/// @brief `p` read as `To*`: a pointer to an element type of the same size and bits
///        (half_bits and __half, bf16_bits and __nv_bfloat16). What the params structs'
///        rebind<To>() use to hand a host-typed params struct to the CUDA launchers.
template <class To, class From>
[[nodiscard]] const To* rebind_elements(const From* p) noexcept {
  static_assert(sizeof(To) == sizeof(From), "rebind: the element types differ in size");
  return reinterpret_cast<const To*>(p);
}
template <class To, class From>
[[nodiscard]] To* rebind_elements(From* p) noexcept {
  static_assert(sizeof(To) == sizeof(From), "rebind: the element types differ in size");
  return reinterpret_cast<To*>(p);
}

}  // namespace moeroute::param_checks
