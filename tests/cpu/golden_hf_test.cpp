// SPDX-License-Identifier: Apache-2.0
// HuggingFace parity on the CPU backend: every case of tests/data/golden-hf (or
// $MOEROUTE_GOLDEN_HF_DIR) through cpu::gating, cpu::dispatch on what it wrote, and
// cpu::losses, compared with what transformers produced, by the same rules as the reference's
// golden-hf test and the GPU path's (check_hf_case).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <moeroute/cpu.hpp>

#include "../common/golden.hpp"
#include "../common/golden_hf_check.hpp"
#include "gating_harness.hpp"

namespace moeroute::test {
namespace {

struct cpu_losses {
  double aux = 0.0, sequence_aux = 0.0, z = 0.0;
};

cpu_losses run_losses(const routing_config& cfg, const gating_params<float>& p) {
  cpu_losses l;
  loss_params lp;
  lp.tokens = p.tokens;
  lp.sums = p.out.sums;
  lp.d_aux_loss = &l.aux;
  lp.d_sequence_aux_loss = cfg.loss.sequence_length > 0 ? &l.sequence_aux : nullptr;
  lp.d_z_loss = &l.z;
  const auto st = cpu::losses(cfg, lp);
  INFO(st.message);
  REQUIRE(st.ok());
  return l;
}

hf_routed route_on_cpu(const json& cs, std::int64_t T, std::int32_t E,
                       const std::vector<float>& logits) {
  const hf_inputs in = hf_inputs_for(cs, T, E);
  const routing_config& cfg = in.cfg;
  cpu_gating_buffers<float> gb(cfg, logits, T, in.bias, in.routing_mask, 0);
  const gating_outputs g = gb.run(cfg, cpu::executor{});
  INFO(g.st.message);
  REQUIRE(g.st.ok());
  const std::size_t n = static_cast<std::size_t>(T * cfg.top_k);
  hf_routed out;
  out.tokens = T;
  out.k = cfg.top_k;
  out.ids = g.ids;
  out.gates = g.gates;
  std::vector<std::int32_t> expert(n), slot(n);
  out.weight.resize(n);
  out.fates.resize(n);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(6 * cfg.total_experts()));
  dispatch_totals totals{};
  dispatch_params dp;
  dp.tokens = T;
  dp.gated = gb.p.out;
  dp.d_valid = gb.p.d_valid;
  const std::int64_t ET = cfg.total_experts();
  dp.out = {expert.data(),
            slot.data(),
            out.weight.data(),
            out.fates.data(),
            counts.data(),
            counts.data() + ET,
            counts.data() + 2 * ET,
            counts.data() + 3 * ET,
            counts.data() + 4 * ET,
            counts.data() + 5 * ET,
            &totals};
  std::vector<std::byte> ws(cpu::dispatch_workspace_bytes(cfg, T));
  const auto st = cpu::dispatch(cfg, dp, ws.data(), ws.size());
  INFO(st.message);
  REQUIRE(st.ok());
  out.capacity = totals.capacity;
  const cpu_losses l = run_losses(cfg, gb.p);
  out.aux = l.aux;
  out.sequence_aux = l.sequence_aux;
  out.z = l.z;
  if (!in.aux_mask.empty()) {
    cpu_gating_buffers<float> masked(cfg, logits, T, in.bias, in.aux_mask, 0);
    const auto mg = masked.run(cfg, cpu::executor{});
    INFO(mg.st.message);
    REQUIRE(mg.st.ok());
    out.aux_masked = run_losses(cfg, masked.p).aux;
  }
  return out;
}

}  // namespace

TEST_CASE("golden-hf: every HuggingFace case through the CPU backend", "[cpu][golden][golden-hf]") {
  check_every_hf_case(route_on_cpu);
}

}  // namespace moeroute::test
