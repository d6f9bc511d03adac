// SPDX-License-Identifier: Apache-2.0
// CPU reference of the record stage (routing replay, docs/replay.md): a routing's ids as one
// layer of a record, in plain loops; the definition cpu::record and cuda::record are checked
// against.
#pragma once

#include <cstdint>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/params/record.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/status.hpp>

namespace moeroute::reference {

/// @brief A record of every layer's ids, owning its storage.
template <class Id = std::int32_t>
struct routing_record {
  std::int64_t tokens = 0;  ///< N
  std::int32_t layers = 0;  ///< L
  std::int32_t k = 0;
  record_layout layout = record_layout::tokens_layers_k;
  std::vector<Id> ids;  ///< [N, L, k] or [L, N, k]; -1 where nothing was recorded

  routing_record(std::int64_t n, std::int32_t l, std::int32_t top_k, record_layout lay)
      : tokens(n),
        layers(l),
        k(top_k),
        layout(lay),
        ids(static_cast<std::size_t>(n * l * top_k), Id{-1}) {}

  /// record_params for rows [first_token, first_token + T) of layer `layer` of this record's
  /// shape and layout; the caller sets d_ids and d_record (this record's ids, or a backend's
  /// buffer of the same shape).
  [[nodiscard]] record_params<Id> params(std::int32_t layer, std::int64_t first_token,
                                         std::int64_t T) const noexcept {
    record_params<Id> p;
    p.tokens = T;
    p.record_tokens = tokens;
    p.layers = layers;
    p.layer = layer;
    p.first_token = first_token;
    p.layout = layout;
    return p;
  }
};

/// @brief Writes g's ids as layer `layer` of `rec`, rows [first_token, first_token + T).
/// @throws moeroute::error naming the bad argument (check_params of record_params).
template <class Id>
void record(const routing_config& cfg, const gating_output& g, std::int32_t layer,
            std::int64_t first_token, routing_record<Id>& rec) {
  record_params<Id> p = rec.params(layer, first_token, g.tokens);
  p.d_ids = g.ids.data();
  p.d_record = rec.ids.data();
  throw_if_error(check_params(cfg, p));
  if (rec.k != cfg.top_k)
    throw error(status::make(status_code::invalid_argument, "record k does not match top_k"));
  const std::int32_t k = cfg.top_k;
  for (std::int64_t t = 0; t < g.tokens; ++t)
    for (std::int32_t j = 0; j < k; ++j)
      rec.ids[static_cast<std::size_t>(record_offset(p, k, first_token + t, j))] =
          static_cast<Id>(g.ids[static_cast<std::size_t>(t * k + j)]);
}

/// @brief Layer `layer`'s ids of record rows [first_token, first_token + T) as [T, k] int32:
///        the replay_ids of the replaying routing.
template <class Id>
[[nodiscard]] std::vector<std::int32_t> replay_ids(const routing_record<Id>& rec,
                                                   std::int32_t layer, std::int64_t first_token,
                                                   std::int64_t tokens) {
  const record_params<Id> p = rec.params(layer, first_token, tokens);
  if (layer < 0 || layer >= rec.layers || first_token < 0 || first_token + tokens > rec.tokens)
    throw error(status::make(status_code::invalid_argument,
                             "replay_ids: layer or token range outside the record"));
  std::vector<std::int32_t> out(static_cast<std::size_t>(tokens * rec.k));
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int32_t j = 0; j < rec.k; ++j)
      out[static_cast<std::size_t>(t * rec.k + j)] =
          rec.ids[static_cast<std::size_t>(record_offset(p, rec.k, first_token + t, j))];
  return out;
}

}  // namespace moeroute::reference
