// SPDX-License-Identifier: Apache-2.0
// GPU gating and losses for a DeepSeek-V3 router: logits [T, 256] -> top-8 ids and gates, the
// aux-loss sums, then the aux and z losses. Checks the ids against the CPU reference and prints
// OK. Without a CUDA device it says so and exits 0. (An example may allocate; launchers never do.)
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include <moeroute/cuda/gating.cuh>
#include <moeroute/cuda/gating_workspace.hpp>
#include <moeroute/cuda/losses.cuh>
#include <moeroute/presets.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/reference/losses.hpp>

#define CHECK(call)                                                  \
  do {                                                               \
    const cudaError_t e_ = (call);                                   \
    if (e_ != cudaSuccess) {                                         \
      std::printf("%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                      \
    }                                                                \
  } while (0)

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_gating: no CUDA device, nothing to run\n");
    return 0;
  }
  using namespace moeroute;
  const routing_config cfg = presets::deepseek_v3();  // E = 256, k = 8, 8 groups, bias
  const std::int64_t T = 4096;
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;

  std::vector<float> logits(T * E), bias(E);
  for (std::size_t i = 0; i < logits.size(); ++i)
    logits[i] = static_cast<float>(static_cast<int>((i * 2654435761u) % 1024u) - 512) / 64.0f;
  for (std::int32_t e = 0; e < E; ++e) bias[e] = 0.001f * static_cast<float>(e % 7);

  float *d_logits, *d_bias, *d_gates, *d_lse;
  std::int32_t* d_ids;
  double *d_score_sum, *d_z_sum, *d_losses;
  std::int64_t *d_count, *d_valid;
  CHECK(cudaMalloc(&d_logits, sizeof(float) * T * E));
  CHECK(cudaMalloc(&d_bias, sizeof(float) * E));
  CHECK(cudaMalloc(&d_ids, sizeof(std::int32_t) * T * k));
  CHECK(cudaMalloc(&d_gates, sizeof(float) * T * k));
  CHECK(cudaMalloc(&d_lse, sizeof(float) * T));
  CHECK(cudaMalloc(&d_score_sum, sizeof(double) * E));
  CHECK(cudaMalloc(&d_count, sizeof(std::int64_t) * E));
  CHECK(cudaMalloc(&d_valid, sizeof(std::int64_t)));
  CHECK(cudaMalloc(&d_z_sum, sizeof(double)));
  CHECK(cudaMalloc(&d_losses, sizeof(double) * 3));
  CHECK(cudaMemcpy(d_logits, logits.data(), sizeof(float) * T * E, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_bias, bias.data(), sizeof(float) * E, cudaMemcpyHostToDevice));

  // [snippet:cuda-gating]
  // The workspace size is a pure C++ query; allocate once and reuse it every step.
  const std::size_t ws_bytes = cuda::gating_workspace_bytes(cfg, T);
  void* d_ws = nullptr;
  CHECK(cudaMalloc(&d_ws, ws_bytes));

  cuda::gating_params<float> p;
  p.d_logits = d_logits;
  p.tokens = T;
  p.d_bias = d_bias;
  p.out.d_ids = d_ids;
  p.out.d_gates = d_gates;
  p.out.d_logsumexp = d_lse;
  p.out.sums.d_aux_score_sum = d_score_sum;
  p.out.sums.d_aux_count = d_count;
  p.out.sums.d_valid_tokens = d_valid;
  p.out.sums.d_z_sum_squares = d_z_sum;
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  if (auto s = cuda::gating(cfg, p, d_ws, ws_bytes, stream); !s) {
    std::printf("gating: %s\n", s.message.c_str());
    return 1;
  }

  cuda::loss_params lp;
  lp.tokens = T;
  lp.sums = p.out.sums;  // what gating wrote is what the losses read
  lp.d_aux_loss = d_losses;
  lp.d_sequence_aux_loss = d_losses + 1;
  lp.d_z_loss = d_losses + 2;
  if (auto s = cuda::losses(cfg, lp, stream); !s) {
    std::printf("losses: %s\n", s.message.c_str());
    return 1;
  }
  CHECK(cudaStreamSynchronize(stream));  // the launchers never synchronise; the caller does
  // [/snippet]

  std::vector<std::int32_t> ids(T * k);
  std::vector<float> gates(T * k);
  double losses[3];
  CHECK(cudaMemcpy(ids.data(), d_ids, sizeof(std::int32_t) * T * k, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(gates.data(), d_gates, sizeof(float) * T * k, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(losses, d_losses, sizeof losses, cudaMemcpyDeviceToHost));

  std::printf("token 0:");
  for (std::int32_t j = 0; j < k; ++j) std::printf(" %d:%.4f", ids[j], gates[j]);
  std::printf("\naux loss %.6g, z-loss %.6g (workspace %zu bytes)\n", losses[0], losses[2],
              ws_bytes);

  const auto ref = reference::gating(cfg, logits, T, bias);
  const bool same = ref.ids == ids;
  std::printf("ids vs CPU reference: %s\n", same ? "OK" : "MISMATCH");

  cudaFree(d_ws);
  cudaFree(d_losses);
  cudaFree(d_z_sum);
  cudaFree(d_valid);
  cudaFree(d_count);
  cudaFree(d_score_sum);
  cudaFree(d_lse);
  cudaFree(d_gates);
  cudaFree(d_ids);
  cudaFree(d_bias);
  cudaFree(d_logits);
  cudaStreamDestroy(stream);
  return same ? 0 : 1;
}
