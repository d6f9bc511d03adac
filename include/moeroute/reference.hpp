// SPDX-License-Identifier: Apache-2.0
// The whole CPU reference: every op (gating, dispatch, layout, permute, combine, losses and
// their backward passes, the expert-bias update, routing statistics), plus a one-call `route`
// for the forward of the common case.
#pragma once

#include <cstdint>
#include <span>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/reference/combine.hpp>
#include <moeroute/reference/combine_backward.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/expert_bias_update.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/reference/gating_backward.hpp>
#include <moeroute/reference/layout.hpp>
#include <moeroute/reference/losses.hpp>
#include <moeroute/reference/permute.hpp>
#include <moeroute/reference/permute_backward.hpp>
#include <moeroute/reference/record.hpp>
#include <moeroute/reference/routing_from_ids.hpp>
#include <moeroute/reference/stats.hpp>
#include <moeroute/reference/views.hpp>

namespace moeroute::reference {

/// Everything the forward of one routing produces on the CPU.
struct routing_result {
  gating_output gating;
  dispatch_output dispatch;
  loss_output losses;
};

/// @brief Gating, capacity assignment and the losses in one call.
/// @param logits [T, E] row-major; bias [E] when cfg.gating.expert_bias; valid [T] or empty.
template <class In = float>
routing_result route(const routing_config& cfg, std::span<const In> logits, std::int64_t tokens,
                     std::span<const float> bias = {}, std::span<const std::uint8_t> valid = {}) {
  routing_result r;
  r.gating = reference::gating<In>(cfg, logits, tokens, bias, valid);
  r.dispatch = reference::dispatch(cfg, r.gating);
  r.losses = reference::losses(cfg, r.gating);
  return r;
}

}  // namespace moeroute::reference
