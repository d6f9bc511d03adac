// SPDX-License-Identifier: Apache-2.0
// Parameters of the record stage (routing replay, docs/replay.md): the expert ids one layer's
// routing chose, copied into a caller-owned record of every layer in one of the layouts
// engines exchange — so a rollout can hand them to training, and a captured CUDA graph can
// record into a static buffer. Plain C++.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <moeroute/config.hpp>
#include <moeroute/macros.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>

namespace moeroute {

/// @brief How a record orders its extents (N record tokens, L layers, k choices).
enum class record_layout : std::uint8_t {
  tokens_layers_k,  ///< [N, L, k]: vLLM's routed_experts (enable_return_routed_experts)
  layers_tokens_k,  ///< [L, N, k]: one [N, k] per layer, Megatron's router replay
};

/// @brief Inputs and outputs of one record call: layer `layer`'s ids [T, k] into rows
///        [first_token, first_token + T) of the record.
/// @tparam Id the record's element: std::int32_t, or std::int16_t (every E up to max_experts)
template <class Id>
struct record_params {
  const std::int32_t* d_ids = nullptr;  ///< [T, k] int32 the routing's ids (gating_result::d_ids)
  std::int64_t tokens = 0;              ///< T
  Id* d_record = nullptr;               ///< [N, L, k] or [L, N, k] (layout), written
  std::int64_t record_tokens = 0;       ///< N, the record's token extent
  std::int32_t layers = 0;              ///< L
  std::int32_t layer = 0;               ///< the layer this call writes, in [0, L)
  std::int64_t first_token = 0;         ///< the record row of token 0 (batches appended)
  record_layout layout = record_layout::tokens_layers_k;
};

/// @brief Checks config, extents and pointers of a record call; names the first bad field.
template <class Id>
[[nodiscard]] status check_params(const routing_config& cfg, const record_params<Id>& p) {
  static_assert(std::is_same_v<Id, std::int32_t> || std::is_same_v<Id, std::int16_t>,
                "a record holds int32 or int16 ids");
  static_assert(max_experts <= std::numeric_limits<std::int16_t>::max(),
                "an int16 record holds every expert id validate() allows");
  if (auto s = param_checks::validate_extents(cfg, p.tokens); !s) return s;
  const auto bad = [](const std::string& m) {
    return status::make(status_code::invalid_argument, m);
  };
  if (p.layers <= 0) return bad("layers = " + std::to_string(p.layers) + ": must be > 0");
  if (p.layer < 0 || p.layer >= p.layers)
    return bad("layer = " + std::to_string(p.layer) +
               ": must be in [0, layers = " + std::to_string(p.layers) + ")");
  if (p.first_token < 0 || p.record_tokens < 0 || p.first_token + p.tokens > p.record_tokens)
    return bad("first_token + tokens = " + std::to_string(p.first_token) + " + " +
               std::to_string(p.tokens) +
               " exceeds record_tokens = " + std::to_string(p.record_tokens));
  if (p.tokens == 0) return status::success();
  return param_checks::require_pointers("with tokens > 0", param_checks::required(p.d_ids, "d_ids"),
                                        param_checks::required(p.d_record, "d_record"));
}

/// @brief Where element (record row n, slot j) of layer p.layer lives in the record.
template <class Id>
[[nodiscard]] MOEROUTE_HOST_DEVICE constexpr std::int64_t record_offset(const record_params<Id>& p,
                                                                        std::int32_t k,
                                                                        std::int64_t n,
                                                                        std::int32_t j) noexcept {
  return p.layout == record_layout::tokens_layers_k
             ? (n * p.layers + p.layer) * k + j
             : (static_cast<std::int64_t>(p.layer) * p.record_tokens + n) * k + j;
}

}  // namespace moeroute
