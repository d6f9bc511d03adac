// SPDX-License-Identifier: Apache-2.0
// Switch Transformer MoE layer on the GPU: top-1 routing with capacity factor 1.25, residual
// pass-through of dropped tokens, the padded [E, C, d] layout, and the experts as two
// batched cuBLAS GEMMs (one per FFN matrix, batched over experts) with a ReLU in between.
// Checked against the CPU reference; prints what the router did.
//
// Needs a GPU to run; without one it says so and exits 0.
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <moeroute/presets.hpp>

#include "gpu_moe_layer.cuh"

namespace ex = moeroute::examples;

namespace {

__global__ void relu_inplace(float* v, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    v[i] = fmaxf(v[i], 0.0f);
}

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: cuBLAS status " +
                             std::to_string(static_cast<int>(s)));
}

// Row-major C[b] (M x N) = A[b] (M x K) @ B[b] (K x N) for b < batch, via column-major cuBLAS
// (C^T = B^T A^T).
void batched_gemm(cublasHandle_t h, const float* A, const float* B, float* C, int M, int N, int K,
                  long long strideA, long long strideB, long long strideC, int batch) {
  const float one = 1.0f, zero = 0.0f;
  cublas_check(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, N, strideB,
                                         A, K, strideA, &zero, C, N, strideC, batch),
               "cublasSgemmStridedBatched");
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf(
        "switch_top1: no CUDA device, nothing to run (the example builds; run it on a GPU)\n");
    return 0;
  }
  try {
    using namespace moeroute;
    const std::int64_t T = 1024, d = 128, f = 256;
    const std::int32_t E = 16;
    routing_config cfg = presets::switch_top1(E, /*factor=*/1.25);  // top-1, residual, min C 4

    // Router logits skewed towards a few experts, hidden states and expert weights.
    std::vector<float> logits = ex::example_values(static_cast<std::size_t>(T * E), 1, 2.0f);
    for (std::int64_t t = 0; t < T; ++t) logits[t * E + (t % 3)] += 1.5f;  // experts 0-2 popular
    const auto x = ex::example_values(static_cast<std::size_t>(T * d), 2);
    const auto w1 = ex::example_values(static_cast<std::size_t>(E * d * f), 3, 0.1f);
    const auto w2 = ex::example_values(static_cast<std::size_t>(E * f * d), 4, 0.1f);

    // The router owns every routing buffer for T tokens of d columns (one cudaMalloc); with a
    // capacity its layout is padded: [E, C] rows.
    moeroute::cuda::router<float> router(cfg, T, d);
    ex::device_buffer<float> d_logits(logits), d_x(x), d_w1(w1), d_w2(w2),
        expert_out(static_cast<std::size_t>(router.max_rows() * d));

    cudaStream_t stream;
    moeroute::cuda::throw_if_cuda_error(cudaStreamCreate(&stream), "cudaStreamCreate");
    cublasHandle_t blas;
    cublas_check(cublasCreate(&blas), "cublasCreate");
    cublas_check(cublasSetStream(blas, stream), "cublasSetStream");

    // Routing: gating, losses, capacity assignment, padded layout; then gather the tokens.
    ex::check(router.route(d_logits.get(), T, nullptr, nullptr, stream), "route");
    ex::check(router.permute(d_x.get(), stream), "permute");

    // Experts: the padded layout is [E, C, d], so expert e's rows are contiguous and every
    // expert has exactly C rows: one strided batched GEMM per FFN matrix.
    const std::int64_t C = expert_capacity(cfg, T);
    ex::device_buffer<float> hidden(static_cast<std::size_t>(E * C * f));
    batched_gemm(blas, router.expert_in(), d_w1.get(), hidden.get(), static_cast<int>(C),
                 static_cast<int>(f), static_cast<int>(d), C * d, d * f, C * f, E);
    relu_inplace<<<256, 256, 0, stream>>>(hidden.get(), static_cast<std::int64_t>(hidden.size()));
    batched_gemm(blas, hidden.get(), d_w2.get(), expert_out.get(), static_cast<int>(C),
                 static_cast<int>(d), static_cast<int>(f), C * f, f * d, C * d, E);

    // Combine (residual: tokens with no slot get x back).
    ex::check(router.combine(expert_out.get(), d_x.get(), stream), "combine");
    moeroute::cuda::router_summary s;
    ex::check(router.summary(s, stream), "summary");  // synchronises the stream
    const auto y = ex::host_floats(router.y(), static_cast<std::size_t>(T * d));

    // The CPU reference of the same layer.
    reference::routing_result ref;
    const auto y_ref =
        ex::reference_moe_forward(cfg, logits, {}, x, T, d, f, w1, w2, true, 1, &ref);
    const double diff = ex::max_rel_diff(y, y_ref);
    const bool counts_match =
        s.totals.kept == ref.dispatch.total_kept && s.totals.dropped == ref.dispatch.total_dropped;

    std::printf(
        "Switch top-1 MoE layer on the GPU: T=%lld tokens, E=%d experts, d=%lld, ffn=%lld\n",
        static_cast<long long>(T), E, static_cast<long long>(d), static_cast<long long>(f));
    std::printf("  capacity factor 1.25 -> C = %lld slots per expert; padded buffer %lld rows\n",
                static_cast<long long>(s.totals.capacity), static_cast<long long>(s.num_rows));
    std::printf(
        "  kept %lld, dropped %lld of %lld tokens (drop rate %.1f%%); dropped tokens pass through "
        "(residual)\n",
        static_cast<long long>(s.totals.kept), static_cast<long long>(s.totals.dropped),
        static_cast<long long>(T), 100.0 * s.drop_rate(T));
    std::printf("  busiest expert asked for %lld slots; aux loss %.4f, z-loss %.4f\n",
                static_cast<long long>(*std::max_element(s.requested.begin(), s.requested.end())),
                s.losses.aux, s.losses.z);
    std::printf(
        "  vs CPU reference: counts %s, max relative |y diff| = %.2e (cuBLAS sums in its own "
        "order)\n",
        counts_match ? "identical" : "DIFFER", diff);
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
    if (!counts_match || !(diff < 1e-4)) {
      std::printf("MISMATCH\n");
      return 1;
    }
    std::printf("OK\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "switch_top1: %s\n", e.what());
    return 1;
  }
}
