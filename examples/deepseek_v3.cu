// SPDX-License-Identifier: Apache-2.0
// DeepSeek-V3-style MoE routing on the GPU: sigmoid scores, an expert bias that steers the
// selection only (aux-loss-free balancing), group-limited top-8 of 256 (8 groups, the best 4
// groups by the sum of their top-2), renormalised gates scaled by 2.5 — and, with a capacity
// factor of 1.0, a dedicated shared expert that takes every assignment a routed expert had no
// room for (drop_policy::fallback), so nothing is dropped. Experts run on the compact,
// 16-row-aligned layout (the shared expert is segment E). Checked against the CPU reference.
//
// Needs a GPU to run; without one it says so and exits 0.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include <moeroute/presets.hpp>

#include "gpu_moe_layer.cuh"

namespace ex = moeroute::examples;

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf(
        "deepseek_v3: no CUDA device, nothing to run (the example builds; run it on a GPU)\n");
    return 0;
  }
  try {
    using namespace moeroute;
    const std::int64_t T = 1024, d = 64, f = 64, block = 16;
    const std::int32_t E = 256, k = 8;
    routing_config cfg = presets::deepseek_v3(E, k, /*groups=*/8, /*group_topk=*/4);
    cfg.capacity.mode = capacity_mode::factor;  // the model is dropless; here: C from factor 1.0
    cfg.capacity.factor = 1.0;
    cfg.dispatch.dropped = drop_policy::fallback;
    cfg.dispatch.fallback.expert = -1;            // a dedicated shared expert, index E
    cfg.dispatch.fallback.capacity = -1;          // unbounded
    const std::int32_t ET = cfg.total_experts();  // 257

    std::vector<float> logits = ex::example_values(static_cast<std::size_t>(T * E), 21, 2.0f);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int32_t e = 0; e < 32; ++e) logits[t * E + e] += 0.8f;  // group 0 is popular
    const auto bias = ex::example_values(static_cast<std::size_t>(E), 22, 0.05f);
    const auto x = ex::example_values(static_cast<std::size_t>(T * d), 23);
    const auto w1 = ex::example_values(static_cast<std::size_t>(ET * d * f), 24, 0.1f);
    const auto w2 = ex::example_values(static_cast<std::size_t>(ET * f * d), 25, 0.1f);

    // The router owns every routing buffer; the layout is compact, segments of 16-row blocks.
    router_options opt;
    opt.layout = layout_kind::compact;
    opt.block_size = block;
    moeroute::cuda::router<float> router(cfg, T, d, opt);
    ex::device_buffer<float> d_logits(logits), d_bias(bias), d_x(x), d_w1(w1), d_w2(w2),
        hidden(static_cast<std::size_t>(router.max_rows() * f)),
        expert_out(static_cast<std::size_t>(router.max_rows() * d));

    cudaStream_t stream;
    moeroute::cuda::throw_if_cuda_error(cudaStreamCreate(&stream), "cudaStreamCreate");
    ex::check(router.route(d_logits.get(), T, d_bias.get(), nullptr, stream), "route");
    ex::check(router.permute(d_x.get(), stream), "permute");
    const unsigned blocks = static_cast<unsigned>(router.max_rows() / block);
    const std::int32_t* block_expert = router.layout().d_block_expert;
    ex::block_grouped_gemm<<<dim3(blocks, static_cast<unsigned>((f + 127) / 128)), 128, 0,
                             stream>>>(router.expert_in(), d_w1.get(), block_expert, block, d, f,
                                       true, hidden.get());
    ex::block_grouped_gemm<<<dim3(blocks, static_cast<unsigned>((d + 127) / 128)), 128, 0,
                             stream>>>(hidden.get(), d_w2.get(), block_expert, block, f, d, false,
                                       expert_out.get());
    moeroute::cuda::throw_if_cuda_error(cudaGetLastError(), "block_grouped_gemm");
    ex::check(router.combine(expert_out.get(), d_x.get(), stream), "combine");

    moeroute::cuda::router_summary s;
    ex::check(router.summary(s, stream), "summary");  // synchronises the stream
    const auto y = ex::host_floats(router.y(), static_cast<std::size_t>(T * d));
    reference::routing_result ref;
    const auto y_ref =
        ex::reference_moe_forward(cfg, logits, bias, x, T, d, f, w1, w2, false, block, &ref);
    const double diff = ex::max_rel_diff(y, y_ref);
    const bool counts_match = s.totals.kept == ref.dispatch.total_kept &&
                              s.totals.rerouted == ref.dispatch.total_rerouted &&
                              s.load == ref.dispatch.load;

    std::int32_t dead = 0;
    for (std::int32_t e = 0; e < E; ++e) dead += s.requested[e] == 0 ? 1 : 0;
    std::printf(
        "DeepSeek-V3 routing on the GPU: T=%lld, E=%d routed + 1 shared fallback expert, top-%d,"
        " 8 groups / top-4, scale 2.5\n",
        static_cast<long long>(T), E, k);
    std::printf("  capacity factor 1.0 -> C = %lld per routed expert\n",
                static_cast<long long>(s.totals.capacity));
    std::printf(
        "  %lld assignments: kept %lld, to the shared expert %lld, dropped %lld (drop rate "
        "%.1f%%)\n",
        static_cast<long long>(T * k), static_cast<long long>(s.totals.kept),
        static_cast<long long>(s.totals.rerouted), static_cast<long long>(s.totals.dropped),
        100.0 * s.drop_rate(T * k));
    std::printf(
        "  shared expert holds %lld rows; busiest routed expert asked for %lld; %d routed experts "
        "unused\n",
        static_cast<long long>(s.load[E]),
        static_cast<long long>(*std::max_element(s.requested.begin(), s.requested.end())), dead);
    std::printf("  compact layout: %lld rows (16-row blocks); aux loss %.3g\n",
                static_cast<long long>(s.num_rows), s.losses.aux);
    std::printf("  vs CPU reference: counts %s, max relative |y diff| = %.2e\n",
                counts_match ? "identical" : "DIFFER", diff);
    cudaStreamDestroy(stream);
    if (!counts_match || s.totals.dropped != 0 || !(diff < 1e-5)) {
      std::printf("MISMATCH\n");
      return 1;
    }
    std::printf("OK\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepseek_v3: %s\n", e.what());
    return 1;
  }
}
