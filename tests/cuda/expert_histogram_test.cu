// SPDX-License-Identifier: Apache-2.0
// GPU smoke test: the histogram launcher against the CPU reference's requested counts.
#include <catch2/catch.hpp>

#include <vector>

#include <moeroute/cuda/expert_histogram.cuh>
#include <moeroute/reference.hpp>

#include "device_buffer.cuh"

using namespace moeroute;

TEST_CASE("expert_histogram matches reference requested counts", "[cuda][smoke]") {
  for (std::int64_t T : {0, 1, 7, 1000}) {
    auto cfg = presets::deepspeed_topk(60, 4);
    std::vector<float> logits(T * 60);
    for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 7919) % 1013) / 97.0f;
    const auto r = reference::route<float>(cfg, logits, T);
    test::device_buffer<std::int32_t> ids(r.gating.ids);
    test::device_buffer<unsigned long long> counts(60), bad(1);
    cuda::expert_histogram_params p{ids.get(), T, 4, 60, counts.get(), bad.get()};
    REQUIRE(cuda::expert_histogram(p).ok());
    const auto h = counts.download();
    for (int e = 0; e < 60; ++e) REQUIRE(static_cast<std::int64_t>(h[e]) == r.dispatch.requested[e]);
    REQUIRE(bad.download()[0] == 0);
  }
}

TEST_CASE("expert_histogram rejects bad params", "[cuda][smoke]") {
  cuda::expert_histogram_params p{};
  p.tokens = 4;
  p.k = 1;
  p.experts = 4;
  const auto s = cuda::expert_histogram(p);
  REQUIRE(s.code == status_code::invalid_argument);
  REQUIRE(s.message.find("d_ids") != std::string::npos);
}
