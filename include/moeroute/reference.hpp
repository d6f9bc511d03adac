// SPDX-License-Identifier: Apache-2.0
// The whole CPU reference pipeline, plus a one-call `route` for the common case.
#pragma once

#include <cstdint>
#include <span>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/reference/combine.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/reference/layout.hpp>
#include <moeroute/reference/losses.hpp>
#include <moeroute/reference/stats.hpp>

namespace moeroute::reference {

/// Everything one routing call produces on the CPU.
struct routing_result {
  gating_output gating;
  dispatch_output dispatch;
  aux_loss_result aux;
  double sequence_aux = 0.0;
  z_loss_result z;
};

/// @brief Gating, capacity assignment and both losses in one call.
/// @param logits [T, E] row-major; bias [E] when cfg.gating.expert_bias; valid [T] or empty.
template <class In = float>
routing_result route(const routing_config& cfg, std::span<const In> logits, std::int64_t tokens,
                     std::span<const float> bias = {}, std::span<const std::uint8_t> valid = {}) {
  routing_result r;
  r.gating = gate<In>(cfg, logits, tokens, bias, valid);
  r.dispatch = dispatch(cfg, r.gating);
  r.aux = aux_loss(cfg, r.gating);
  r.sequence_aux = sequence_aux_loss(cfg, r.gating);
  r.z = z_loss(cfg, r.gating);
  return r;
}

}  // namespace moeroute::reference
