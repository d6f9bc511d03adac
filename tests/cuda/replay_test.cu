// SPDX-License-Identifier: Apache-2.0
// Routing replay on the GPU (moeroute/replay.hpp): every preset with mixed replay ids (own,
// other, -1) and the score filter equals reference::gating, the replaced count included; the
// replay of the kernel's own ids is the identity; bad device ids are taken as -1 and counted.
// Runs on a device and on the CPU lock-step emulation.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/gating.cuh>
#include <moeroute/cuda/record.cuh>
#include <moeroute/cuda/router.cuh>
#include <moeroute/presets.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/reference/record.hpp>

#include "../common/replay_cases.hpp"
#include "gating_harness.cuh"
#include "graph_replay.cuh"

namespace moeroute::test {

namespace {

struct replay_run {
  moeroute::test::gpu_gating out;
  std::int64_t replaced = -1, invalid = -1;
};

replay_run run_replay(const routing_config& cfg, const std::vector<float>& x, std::int64_t T,
                      const std::vector<float>& bias, const std::vector<std::uint8_t>& valid,
                      const std::vector<std::int32_t>& replay, float ratio) {
  moeroute::test::gating_buffers<float> b(cfg, x, T, bias, valid);
  moeroute::cuda::device_buffer<std::int32_t> d_replay(replay);
  moeroute::cuda::device_buffer<std::int64_t> counts(2);
  b.p.replay = {d_replay.get(), ratio, counts.get(), counts.get() + 1};
  replay_run r;
  r.out = b.download(b.run(cfg));
  const auto c = counts.download();
  r.replaced = c[0];
  r.invalid = c[1];
  return r;
}

}  // namespace

TEST_CASE("cuda replay equals the reference for every preset, mixed ids and the filter",
          "[cuda][replay]") {
  std::uint32_t seed = 40;
  for (const std::int32_t E : {16, 64, 256})
    for (const auto& c : moeroute::test::replay_cases(E)) {
      for (const std::int64_t T : {1, 37}) {
        INFO(c.name << ", E = " << E << ", T = " << T);
        const auto x = replay_logits(T, E, seed++);
        const auto bias = replay_bias(c.cfg);
        const auto valid = moeroute::test::some_padding(T);
        const auto own = reference::gating<float>(c.cfg, x, T, bias, valid);
        const auto replay = moeroute::test::mixed_replay_ids(c.cfg, own.ids, T, seed++);
        for (const float ratio : {0.0f, 0.4f}) {
          INFO("min_score_ratio " << ratio);
          const auto ref = reference::gating<float>(c.cfg, x, T, bias, valid, {replay, ratio});
          const auto got = run_replay(c.cfg, x, T, bias, valid, replay, ratio);
          REQUIRE(moeroute::test::compare(ref, got.out) == "");
          REQUIRE(got.replaced == ref.replay_replaced);
          REQUIRE(got.invalid == 0);
        }
        // identity: the kernel's own ids replayed give its own outputs
        const auto first = moeroute::test::run_gpu<float>(c.cfg, x, T, bias, valid);
        const auto again = run_replay(c.cfg, x, T, bias, valid, first.ids, 0.5f);
        REQUIRE(again.out.ids == first.ids);
        REQUIRE(again.out.reroute_ids == first.reroute_ids);
        REQUIRE(again.out.gates == first.gates);
        REQUIRE(again.out.aux_count == first.aux_count);
        REQUIRE(again.out.aux_score_sum == first.aux_score_sum);
        REQUIRE(again.replaced == 0);
      }
    }
}

TEST_CASE("cuda replay: bad device ids are taken as -1 and counted", "[cuda][replay][quick]") {
  const routing_config cfg = presets::qwen_moe(8, 2);
  const std::int64_t T = 3;
  const auto x = replay_logits(T, 8, 3);
  // token 0: 9 out of range; token 1: 4 twice; token 2: fine
  const std::vector<std::int32_t> bad = {9, 1, 4, 4, 2, -1};
  const std::vector<std::int32_t> fixed = {-1, 1, 4, -1, 2, -1};
  const auto got = run_replay(cfg, x, T, {}, {}, bad, 0.0f);
  const auto ref = reference::gating<float>(cfg, x, T, {}, {}, {fixed, 0.0f});
  REQUIRE(moeroute::test::compare(ref, got.out) == "");
  CHECK(got.invalid == 2);
  CHECK(got.replaced == 0);
  // the options are checked on the host
  moeroute::test::gating_buffers<float> b(cfg, x, T, {}, {});
  b.p.replay.min_score_ratio = 0.5f;
  const status st = b.run(cfg);
  CHECK(st.code == status_code::invalid_argument);
  CHECK(st.message.find("replay.d_ids is null") != std::string::npos);
}

TEST_CASE("cuda record equals the reference, and records inside a CUDA graph",
          "[cuda][replay][record][quick]") {
  const routing_config cfg = presets::qwen_moe(64, 8);
  const std::int64_t T = 37, N = 100;
  const std::int32_t L = 3;
  const auto g = reference::gating<float>(cfg, replay_logits(T, 64, 9), T);
  moeroute::cuda::device_buffer<std::int32_t> d_ids(g.ids);
  for (const record_layout layout :
       {record_layout::tokens_layers_k, record_layout::layers_tokens_k}) {
    reference::routing_record<std::int16_t> want(N, L, 8, layout);
    reference::record(cfg, g, 2, 50, want);
    moeroute::cuda::device_buffer<std::int16_t> d_record(want.ids.size());
    cudaStream_t stream;
    moeroute::cuda::throw_if_cuda_error(cudaStreamCreate(&stream), "stream");
    record_params<std::int16_t> p = want.params(2, 50, T);
    p.d_ids = d_ids.get();
    p.d_record = d_record.get();
    const std::vector<std::int16_t> unset(want.ids.size(), -1);
    moeroute::test::capture_and_replay(
        stream, [&](cudaStream_t s) { return moeroute::cuda::record(cfg, p, s); },
        [&] { d_record.upload(unset); }, [&] { REQUIRE(d_record.download() == want.ids); });
    moeroute::cuda::throw_if_cuda_error(cudaStreamDestroy(stream), "stream");
    p.layer = 3;
    const status st = moeroute::cuda::record(cfg, p);
    CHECK(st.code == status_code::invalid_argument);
    CHECK(st.message.find("layer = 3") != std::string::npos);
  }
}

TEST_CASE("cuda::router routes with replay, as the reference", "[cuda][replay][router]") {
  routing_config cfg = presets::mixtral(8, 2);
  cfg.capacity.mode = capacity_mode::factor;
  cfg.capacity.factor = 1.0;
  const std::int64_t T = 64;
  moeroute::cuda::router<float> r(cfg, T, 16);
  const auto x = replay_logits(T, 8, 21);
  std::vector<std::int32_t> forced(static_cast<std::size_t>(T * 2), -1);
  for (std::int64_t t = 0; t < T; ++t) forced[static_cast<std::size_t>(t * 2)] = 0;
  moeroute::cuda::device_buffer<float> d_logits(x);
  moeroute::cuda::device_buffer<std::int32_t> d_forced(forced);
  moeroute::cuda::device_buffer<std::int64_t> counts(2);
  REQUIRE(r.route(d_logits.get(), T,
                  gating_replay{d_forced.get(), 0.0f, counts.get(), counts.get() + 1})
              .ok());
  moeroute::cuda::router_summary sum;
  REQUIRE(r.summary(sum).ok());
  const auto g = reference::gating<float>(cfg, x, T, {}, {}, {forced});
  const auto d = reference::dispatch(cfg, g);
  std::vector<std::int32_t> ids(g.ids.size());
  moeroute::cuda::throw_if_cuda_error(
      cudaMemcpy(ids.data(), r.gated().d_ids, ids.size() * sizeof(ids[0]), cudaMemcpyDeviceToHost),
      "download ids");
  REQUIRE(ids == g.ids);
  REQUIRE(sum.totals.dropped == d.total_dropped);
  REQUIRE(d.total_dropped > 0);
  REQUIRE(counts.download() == std::vector<std::int64_t>{0, 0});
}

}  // namespace moeroute::test
