// SPDX-License-Identifier: Apache-2.0
// Mixtral-style MoE layer on the GPU: dropless top-2 of 8 (softmax over the two chosen), the
// compact expert-sorted layout with every expert's segment padded to a multiple of 16 rows,
// and a per-block expert id (block_expert) — exactly what a grouped GEMM (CUTLASS grouped
// GEMM, Triton/vLLM fused_moe with moe_align_block_size) consumes. The "grouped GEMM" here is
// a deliberately naive kernel that reads block_expert. Checked against the CPU reference.
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
        "mixtral_dropless: no CUDA device, nothing to run (the example builds; run it on a GPU)\n");
    return 0;
  }
  try {
    using namespace moeroute;
    const std::int64_t T = 2048, d = 128, f = 256, block = 16;
    const std::int32_t E = 8, k = 2;
    const routing_config cfg = presets::mixtral(E, k);  // dropless: capacity_mode::unbounded

    std::vector<float> logits = ex::example_values(static_cast<std::size_t>(T * E), 11, 2.0f);
    for (std::int64_t t = 0; t < T; ++t) logits[t * E + 5] += 1.0f;  // expert 5 is popular
    const auto x = ex::example_values(static_cast<std::size_t>(T * d), 12);
    const auto w1 = ex::example_values(static_cast<std::size_t>(E * d * f), 13, 0.1f);
    const auto w2 = ex::example_values(static_cast<std::size_t>(E * f * d), 14, 0.1f);

    // The router owns every routing buffer for T tokens of d columns (one cudaMalloc);
    // a dropless config gets the compact layout, segments rounded up to `block` rows.
    router_options opt;
    opt.block_size = block;
    moeroute::cuda::router<float> router(cfg, T, d, opt);
    ex::device_buffer<float> d_logits(logits), d_x(x), d_w1(w1), d_w2(w2),
        hidden(static_cast<std::size_t>(router.max_rows() * f)),
        expert_out(static_cast<std::size_t>(router.max_rows() * d));

    cudaStream_t stream;
    moeroute::cuda::throw_if_cuda_error(cudaStreamCreate(&stream), "cudaStreamCreate");

    // Route (nothing is dropped), build the compact layout, gather tokens into it.
    ex::check(router.route(d_logits.get(), T, nullptr, nullptr, stream), "route");
    ex::check(router.permute(d_x.get(), stream), "permute");

    // Grouped GEMM over 16-row blocks; blocks past the rows in use have block_expert = -1.
    // The grid covers the upper bound max_rows, so no host round trip is needed.
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
        ex::reference_moe_forward(cfg, logits, {}, x, T, d, f, w1, w2, false, block, &ref);
    const double diff = ex::max_rel_diff(y, y_ref);
    const bool counts_match =
        s.totals.kept == ref.dispatch.total_kept && s.load == ref.dispatch.load;

    std::int64_t used = 0;
    for (auto l : s.load) used += l;
    std::printf(
        "Mixtral dropless top-2 MoE layer on the GPU: T=%lld, E=%d, k=%d, d=%lld, ffn=%lld\n",
        static_cast<long long>(T), E, k, static_cast<long long>(d), static_cast<long long>(f));
    std::printf(
        "  %lld assignments, %lld dropped (dropless) -> compact layout of %lld rows in %lld-row "
        "blocks"
        " (%.1f%% alignment padding)\n",
        static_cast<long long>(T * k), static_cast<long long>(s.totals.dropped),
        static_cast<long long>(s.num_rows), static_cast<long long>(block),
        s.num_rows > 0
            ? 100.0 * static_cast<double>(s.num_rows - used) / static_cast<double>(s.num_rows)
            : 0.0);
    std::printf("  rows per expert:");
    for (std::int32_t e = 0; e < E; ++e) std::printf(" %lld", static_cast<long long>(s.load[e]));
    std::printf("\n  aux loss %.4f (%.2f = balanced), z-loss %.4f\n", s.losses.aux,
                static_cast<double>(cfg.loss.aux_coefficient) * k, s.losses.z);
    std::printf("  vs CPU reference: loads %s, max relative |y diff| = %.2e\n",
                counts_match ? "identical" : "DIFFER", diff);
    cudaStreamDestroy(stream);
    if (!counts_match || s.totals.dropped != 0 || !(diff < 1e-5)) {
      std::printf("MISMATCH\n");
      return 1;
    }
    std::printf("OK\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mixtral_dropless: %s\n", e.what());
    return 1;
  }
}
