// SPDX-License-Identifier: Apache-2.0
// cuda::router, the owning GPU router, against the reference (on a device, and on the CPU
// emulation): ids, experts, slots, fates, counts, offsets and layout rows exactly; the layer
// output, the losses and every gradient (d expert_out, d x, d logits) within float rounding;
// batches smaller than the router's maximum on the same buffers; one device allocation through
// the allocator parameter; and the errors of a misuse.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <moeroute/cuda/router.cuh>
#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "dispatch_test_util.cuh"

namespace moeroute::test {

namespace {

bool near(double got, double want, double rel, double abs) {
  return std::fabs(got - want) <= abs + rel * std::fabs(want);
}

/// One batch of T tokens through `r` and through the reference; every output compared.
void check_router_batch(cuda::router<float>& r, const routing_config& cfg, std::int64_t T,
                        std::uint64_t seed) {
  const std::int64_t D = r.hidden();
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;
  const auto logits = random_host<float>(static_cast<std::size_t>(T * E), seed, -3.0f, 3.0f);
  const auto x = random_host<float>(static_cast<std::size_t>(T * D), seed + 1);
  std::vector<float> bias;
  if (cfg.gating.expert_bias) bias = random_host<float>(static_cast<std::size_t>(E), seed + 2);
  device_buffer<float> d_logits(logits), d_x(x), d_bias(bias);

  REQUIRE(r.route(d_logits.get(), T, bias.empty() ? nullptr : d_bias.get()).ok());
  const auto want = reference::route<float>(cfg, logits, T, bias);
  const auto& dsp = want.dispatch;
  const auto L = reference::layout(cfg, dsp, r.layout_kind_used());
  cuda::router_summary sum;
  REQUIRE(r.summary(sum).ok());
  REQUIRE(sum.num_rows == L.num_rows);
  REQUIRE(sum.offsets == L.offsets);
  REQUIRE(sum.totals.kept == dsp.total_kept);
  REQUIRE(sum.totals.dropped == dsp.total_dropped);
  REQUIRE(near(sum.losses.aux, want.losses.aux.value, 1e-6, 1e-9));
  REQUIRE(near(sum.losses.z, want.losses.z.value, 1e-5, 1e-9));
  const std::size_t n = static_cast<std::size_t>(T * k);
  REQUIRE(download_bits<std::int32_t>(r.gated().d_ids, n) == want.gating.ids);
  REQUIRE(download_bits<std::int32_t>(r.dispatched().d_expert, n) == dsp.expert);
  REQUIRE(download_bits<std::int32_t>(r.dispatched().d_slot, n) == dsp.slot);
  REQUIRE(download_bits<fate>(r.dispatched().d_fate, n) == dsp.fates);
  REQUIRE(download_bits<std::int64_t>(r.layout().d_assignment_row, n) == L.assignment_row);

  // forward: permute -> identity experts scaled by 1 + expert / 8 (on the host) -> combine
  REQUIRE(r.permute(d_x.get()).ok());
  auto rows = download_bits<float>(r.expert_in(), static_cast<std::size_t>(L.num_rows * D));
  const auto scale_rows = [&](std::vector<float>& v) {
    for (std::int32_t e = 0; e < cfg.total_experts(); ++e)
      for (std::int64_t i = L.offsets[e] * D; i < L.offsets[e + 1] * D; ++i)
        v[static_cast<std::size_t>(i)] *= 1.0f + float(e) / 8.0f;
  };
  scale_rows(rows);
  device_buffer<float> d_expert_out(rows);
  REQUIRE(r.combine(d_expert_out.get(), d_x.get()).ok());
  std::vector<float> rbuf(rows.size()), ry(static_cast<std::size_t>(T * D));
  reference::permute<float>(cfg, L, x, T, D, rbuf);
  scale_rows(rbuf);
  reference::combine<float>(cfg, L, dsp, rbuf, D, x, ry);
  const auto y = download_bits<float>(r.y(), ry.size());
  for (std::size_t i = 0; i < ry.size(); ++i) {
    INFO("y[" << i << "]");
    REQUIRE(near(y[i], ry[i], 1e-5, 1e-6));
  }

  // backward: combine, the experts (on the host), permute; then the router's logits
  const auto dy = random_host<float>(ry.size(), seed + 3);
  device_buffer<float> d_dy(dy);
  REQUIRE(r.combine_backward(d_dy.get(), d_expert_out.get()).ok());
  auto d_out = download_bits<float>(r.grad_expert_out(), rows.size());
  std::vector<float> rd_out(rows.size()), rd_w(n), rd_x(ry.size());
  reference::combine_backward<float>(cfg, L, dsp, rbuf, D, dy, rd_out, rd_w, rd_x);
  for (std::size_t i = 0; i < rd_out.size(); ++i) REQUIRE(near(d_out[i], rd_out[i], 1e-5, 1e-6));
  scale_rows(d_out);
  scale_rows(rd_out);
  device_buffer<float> d_grad_in(d_out);
  REQUIRE(r.permute_backward(d_grad_in.get()).ok());
  reference::permute_backward<float>(cfg, L, dsp, rd_out, D, rd_x, /*accumulate=*/true);
  const auto dx = download_bits<float>(r.grad_x(), rd_x.size());
  for (std::size_t i = 0; i < rd_x.size(); ++i) REQUIRE(near(dx[i], rd_x[i], 1e-5, 1e-6));
  REQUIRE(r.gating_backward(d_logits.get()).ok());
  std::vector<float> rd_logits(logits.size(), 0.0f);
  reference::gating_backward<float>(cfg, logits, want.gating, dsp, rd_w, rd_logits);
  const auto dl = download_bits<float>(r.grad_logits(), rd_logits.size());
  for (std::size_t i = 0; i < rd_logits.size(); ++i) {
    INFO("d logits[" << i << "]");
    REQUIRE(near(dl[i], rd_logits[i], 1e-4, 1e-5));
  }
}

/// Counts device allocations, passing them to cudaMalloc.
struct counting_device_allocator : cuda::device_allocator<std::byte> {
  int* allocations;
  explicit counting_device_allocator(int* a) : allocations(a) {}
  std::byte* allocate(std::size_t n) {
    ++*allocations;
    return cuda::device_allocator<std::byte>::allocate(n);
  }
};

}  // namespace

TEST_CASE("cuda::router equals the reference, batch after batch", "[cuda][router][quick]") {
  for (const char* name : {"deepspeed_top2", "megatron", "deepseek_v3", "switch_transformers"}) {
    const presets::preset_info* p = presets::find(name);
    REQUIRE(p != nullptr);
    routing_config cfg =
        presets::by_name(p->name, p->default_experts > 32 ? 32 : p->default_experts,
                         p->default_k > 4 ? 4 : p->default_k);
    if (cfg.capacity.mode == capacity_mode::unbounded) {
      cfg.capacity.mode = capacity_mode::factor;
      cfg.capacity.factor = 1.0;
    }
    REQUIRE(validate(cfg).ok());
    DYNAMIC_SECTION(name) {
      cuda::router<float> r(cfg, /*max_tokens=*/48, /*hidden=*/8);
      for (const std::int64_t T : {48, 13, 1}) check_router_batch(r, cfg, T, 31 + T);
    }
  }
}

TEST_CASE("cuda::router: one device allocation, misuse named", "[cuda][router][quick]") {
  const routing_config cfg = presets::deepspeed_top2(8, 1.0);
  int allocations = 0;
  {
    cuda::router<float, counting_device_allocator> r(cfg, 32, 8, {},
                                                     counting_device_allocator(&allocations));
    REQUIRE(allocations == 1);
    const status s = r.permute(nullptr);
    REQUIRE(!s.ok());
    REQUIRE_THAT(s.message, Catch::Contains("route first"));
    device_buffer<float> logits(std::vector<float>(33 * 8, 0.5f));
    const status too_many = r.route(logits.get(), 33);
    REQUIRE(too_many.code == status_code::invalid_shape);
    REQUIRE_THAT(too_many.message, Catch::Contains("max_tokens"));
    REQUIRE(r.route(logits.get(), 32).ok());
    REQUIRE(allocations == 1);
  }
  routing_config bad = cfg;
  bad.top_k = 0;
  REQUIRE_THROWS_WITH(cuda::router<float>(bad, 16, 8), Catch::Contains("top_k"));
}

TEST_CASE("cuda::router: a device token count, one graph for every batch size",
          "[cuda][router][quick]") {
  // the inference engine's pattern: buffers and one captured graph for the largest batch, the
  // real count written before each replay; each replay equals route() of those tokens alone
  for (const char* name : {"deepspeed_top2", "deepseek_v3", "megatron"}) {
    const presets::preset_info* p = presets::find(name);
    REQUIRE(p != nullptr);
    const routing_config cfg =
        presets::by_name(p->name, p->default_experts > 32 ? 32 : p->default_experts,
                         p->default_k > 4 ? 4 : p->default_k);
    DYNAMIC_SECTION(name) {
      const std::int64_t rows = 48;
      const std::int32_t E = cfg.num_experts, k = cfg.top_k;
      const auto logits = random_host<float>(static_cast<std::size_t>(rows * E), 7, -3.0f, 3.0f);
      const auto bias = random_host<float>(static_cast<std::size_t>(E), 8);
      device_buffer<float> d_logits(logits), d_bias(bias);
      const float* b = cfg.gating.expert_bias ? d_bias.get() : nullptr;
      device_buffer<std::int64_t> d_n(std::vector<std::int64_t>{rows});
      cuda::router<float> counted(cfg, rows, 8), alone(cfg, rows, 8);
      cudaStream_t stream;
      cuda::throw_if_cuda_error(cudaStreamCreate(&stream), "stream");
      cudaGraph_t graph;
      cuda::throw_if_cuda_error(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal),
                                "begin capture");
      const status st =
          counted.route(d_logits.get(), cuda::device_tokens{rows, d_n.get()}, b, nullptr, stream);
      cuda::throw_if_cuda_error(cudaStreamEndCapture(stream, &graph), "end capture");
      INFO(st.message);
      REQUIRE(st.ok());
      cudaGraphExec_t exec;
      cuda::throw_if_cuda_error(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
      for (const std::int64_t n : {rows, std::int64_t{13}, std::int64_t{1}, std::int64_t{0}}) {
        INFO("n = " << n);
        cuda::throw_if_cuda_error(cudaMemcpy(d_n.get(), &n, sizeof n, cudaMemcpyHostToDevice),
                                  "count");
        cuda::throw_if_cuda_error(cudaGraphLaunch(exec, stream), "graph launch");
        cuda::throw_if_cuda_error(cudaStreamSynchronize(stream), "sync");
        const auto all = static_cast<std::size_t>(rows * k), real = static_cast<std::size_t>(n * k);
        cuda::router_summary got, want;
        REQUIRE(counted.summary(got).ok());
        if (n == 0) {  // (route() of no tokens writes nothing to compare with)
          REQUIRE(got.totals.kept + got.totals.dropped + got.totals.rerouted == 0);
          REQUIRE(got.totals.masked == rows * k);
          continue;
        }
        REQUIRE(alone.route(d_logits.get(), n, b).ok());
        const auto head = [real]<class V>(V v) {
          v.resize(real);
          return v;
        };
        REQUIRE(head(download_bits<std::int32_t>(counted.gated().d_ids, all)) ==
                download_bits<std::int32_t>(alone.gated().d_ids, real));
        REQUIRE(head(download_bits<std::uint32_t>(counted.gated().d_gates, all)) ==
                download_bits<std::uint32_t>(alone.gated().d_gates, real));
        REQUIRE(head(download_bits<std::int32_t>(counted.dispatched().d_slot, all)) ==
                download_bits<std::int32_t>(alone.dispatched().d_slot, real));
        REQUIRE(head(download_bits<std::uint32_t>(counted.dispatched().d_weight, all)) ==
                download_bits<std::uint32_t>(alone.dispatched().d_weight, real));
        REQUIRE(head(download_bits<std::int64_t>(counted.layout().d_assignment_row, all)) ==
                download_bits<std::int64_t>(alone.layout().d_assignment_row, real));
        const auto fates = download_bits<fate>(counted.dispatched().d_fate, all);
        for (std::size_t a = real; a < all; ++a) REQUIRE(fates[a] == fate::masked);
        REQUIRE(alone.summary(want).ok());
        REQUIRE(got.totals.capacity == want.totals.capacity);
        REQUIRE(got.totals.kept == want.totals.kept);
        REQUIRE(got.totals.dropped == want.totals.dropped);
        REQUIRE(got.totals.masked == want.totals.masked + (rows - n) * k);
        REQUIRE(got.num_rows == want.num_rows);
        REQUIRE(got.offsets == want.offsets);
        REQUIRE(got.losses.aux == want.losses.aux);
        REQUIRE(got.losses.z == want.losses.z);
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
      REQUIRE_THAT(counted.route(d_logits.get(), cuda::device_tokens{rows, nullptr}).message,
                   Catch::Contains("d_count"));
    }
  }
}

TEST_CASE("cuda::router: options.losses = false routes as the loss-keeping router, with no sums",
          "[cuda][router][quick]") {
  routing_config cfg = serving_router_config();
  const std::int64_t T = 96;
  const auto logits = random_host<float>(static_cast<std::size_t>(T * 64), 21, -3.0f, 3.0f);
  device_buffer<float> d_logits(logits), d_bias(std::vector<float>(64, 0.0f));
  cuda::router<float> kept(cfg, 128, 8);
  cuda::router_options inference;
  inference.losses = false;
  cuda::router<float> serving(cfg, 128, 8, inference);
  REQUIRE(kept.route(d_logits.get(), T, d_bias.get()).ok());
  REQUIRE(serving.route(d_logits.get(), T, d_bias.get()).ok());
  const std::size_t n = static_cast<std::size_t>(T * 4);
  REQUIRE(download_bits<std::int32_t>(kept.gated().d_ids, n) ==
          download_bits<std::int32_t>(serving.gated().d_ids, n));
  REQUIRE(download_bits<float>(kept.gated().d_gates, n) ==
          download_bits<float>(serving.gated().d_gates, n));
  REQUIRE(download_bits<float>(kept.dispatched().d_weight, n) ==
          download_bits<float>(serving.dispatched().d_weight, n));
  REQUIRE(download_bits<std::int64_t>(kept.layout().d_assignment_row, n) ==
          download_bits<std::int64_t>(serving.layout().d_assignment_row, n));
  cuda::router_summary with, without;
  REQUIRE(kept.summary(with).ok());
  REQUIRE(serving.summary(without).ok());
  REQUIRE(with.losses.aux > 0.0);
  REQUIRE(without.losses.aux == 0.0);
  REQUIRE(without.losses.z == 0.0);
  REQUIRE(without.offsets == with.offsets);
  REQUIRE(serving.gated().sums.d_aux_count == nullptr);
  REQUIRE_THAT(serving.gating_backward(d_logits.get()).message, Catch::Contains("options.losses"));
  cfg.training = true;
  REQUIRE_THROWS_WITH(cuda::router<float>(cfg, 16, 8, inference),
                      Catch::Contains("options.losses = false"));
}

}  // namespace moeroute::test
