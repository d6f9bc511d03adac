// SPDX-License-Identifier: Apache-2.0
// HuggingFace parity on the GPU path: every case of tests/data/golden-hf (or
// $MOEROUTE_GOLDEN_HF_DIR) through cuda::gating, cuda::dispatch on what the GPU gating wrote,
// and cuda::losses, compared with what transformers produced by the same rules as the CPU
// reference's golden-hf test (check_hf_case). Runs on a device and on the CPU emulation.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/gating.cuh>
#include <moeroute/cuda/losses.cuh>
#include <moeroute/reference.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "../common/golden.hpp"
#include "../common/golden_hf_check.hpp"
#include "dispatch_test_util.cuh"
#include "gating_harness.cuh"

// Inside moeroute::test: a global `using namespace moeroute` makes `cuda::` ambiguous with the
// CUDA runtime's own namespace.
namespace moeroute::test {
namespace {

/// The GPU gating's output as the gating_output the dispatch helper uploads.
reference::gating_output as_gating_output(const routing_config& cfg, std::int64_t T,
                                          const gpu_gating& g,
                                          const std::vector<std::uint8_t>& valid) {
  reference::gating_output o;
  o.tokens = T;
  o.experts = cfg.num_experts;
  o.k = cfg.top_k;
  o.reroute_candidates = cfg.reroute_candidates();
  o.ids = g.ids;
  o.gates = g.gates;
  o.reroute_ids = g.reroute_ids;
  o.logsumexp = g.logsumexp;
  o.token_priority = g.token_priority;
  o.second_skipped = g.second_skipped;
  o.valid = valid.empty() ? std::vector<std::uint8_t>(static_cast<std::size_t>(T), 1) : valid;
  return o;
}

/// The three loss values of a gating call's sums, on the device.
struct device_losses {
  double aux = 0.0, sequence_aux = 0.0, z = 0.0;
};

template <class In>
device_losses run_losses(const routing_config& cfg, const gating_buffers<In>& b, std::int64_t T) {
  cuda::device_buffer<double> out(3);
  cuda::loss_params lp;
  lp.tokens = T;
  lp.sums = b.p.out.sums;
  lp.d_aux_loss = out.get();
  lp.d_sequence_aux_loss = cfg.loss.sequence_length > 0 ? out.get() + 1 : nullptr;
  lp.d_z_loss = out.get() + 2;
  const auto st = cuda::losses(cfg, lp);
  INFO(st.message);
  REQUIRE(st.ok());
  cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto v = out.download();
  return {v[0], v[1], v[2]};
}

hf_routed route_on_gpu(const json& cs, std::int64_t T, std::int32_t E,
                       const std::vector<float>& logits) {
  const hf_inputs in = hf_inputs_for(cs, T, E);
  const routing_config& cfg = in.cfg;
  gating_buffers<float> gb(cfg, logits, T, in.bias, in.routing_mask);
  const gpu_gating g = gb.download(gb.run(cfg));
  INFO(g.st.message);
  REQUIRE(g.st.ok());
  gpu_dispatch dsp(cfg, as_gating_output(cfg, T, g, in.routing_mask), !in.routing_mask.empty());
  const auto st = dsp.run();
  INFO(st.message);
  REQUIRE(st.ok());
  const host_dispatch d = dsp.download();
  const device_losses l = run_losses(cfg, gb, T);

  hf_routed out;
  out.tokens = T;
  out.k = cfg.top_k;
  out.ids = g.ids;
  out.gates = g.gates;
  out.fates = d.fates;
  out.weight = d.weight;
  out.capacity = d.totals.capacity;
  out.aux = l.aux;
  out.sequence_aux = l.sequence_aux;
  out.z = l.z;
  if (!in.aux_mask.empty()) {
    gating_buffers<float> masked(cfg, logits, T, in.bias, in.aux_mask);
    const auto st2 = masked.run(cfg);
    INFO(st2.message);
    REQUIRE(st2.ok());
    out.aux_masked = run_losses(cfg, masked, T).aux;
  }
  return out;
}

}  // namespace

TEST_CASE("golden-hf: every HuggingFace case through the GPU path", "[cuda][golden][golden-hf]") {
  check_every_hf_case(route_on_gpu);
}

}  // namespace moeroute::test
