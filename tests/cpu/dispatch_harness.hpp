// SPDX-License-Identifier: Apache-2.0
// One cpu::dispatch call on a reference gating output (or a routing_from_ids), with host
// buffers pre-filled with garbage so that every output must be written. Shared by the CPU
// dispatch tests and the external-ids tests.
#pragma once

#include <vector>

#include <moeroute/cpu/dispatch.hpp>
#include <moeroute/reference/gating.hpp>

#include "../common/dispatch_compare.hpp"
#include "reverse_order_run.hpp"

namespace moeroute::test {

/// Host buffers of one cpu::dispatch call on a reference gating output.
struct cpu_dispatch {
  routing_config cfg;
  const reference::gating_output& g;
  host_dispatch h;
  std::vector<unsigned char> ws;
  dispatch_params params;

  cpu_dispatch(const routing_config& c, const reference::gating_output& gating, bool pass_valid)
      : cfg(c), g(gating), ws(cpu::dispatch_workspace_bytes(c, gating.tokens), 0xCD) {
    const std::size_t n = g.ids.size();
    h.expert.assign(n, 99);
    h.slot.assign(n, 99);
    h.weight.assign(n, -1.0f);
    h.fates.assign(n, fate::kept);
    h.requested.assign(c.num_experts, -1);
    h.kept.assign(c.num_experts, -1);
    h.rerouted.assign(c.num_experts, -1);
    h.dropped.assign(c.num_experts, -1);
    h.received.assign(c.total_experts(), -1);
    h.load.assign(c.total_experts(), -1);
    params.tokens = g.tokens;
    params.gated.d_ids = g.ids.data();
    params.gated.d_gates = g.gates.data();
    params.gated.d_reroute_ids = g.reroute_ids.data();
    params.gated.d_token_priority = g.token_priority.data();
    params.gated.d_second_skipped = g.second_skipped.data();
    params.d_valid = pass_valid ? g.valid.data() : nullptr;
    params.out = {h.expert.data(),    h.slot.data(), h.weight.data(),   h.fates.data(),
                  h.requested.data(), h.kept.data(), h.rerouted.data(), h.dropped.data(),
                  h.received.data(),  h.load.data(), &h.totals};
  }

  [[nodiscard]] status run(const cpu::executor& ex = {}) {
    return cpu::dispatch(cfg, params, ws.data(), ws.size(), ex);
  }
};

}  // namespace moeroute::test
