// SPDX-License-Identifier: Apache-2.0
// Smallest CUDA program that uses moeroute from another CMake project: the launchers'
// host-side contract (validation, workspace queries, a T = 0 call that touches nothing) always,
// and with a device a real gating call checked against the CPU reference.
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include <moeroute/cuda.cuh>
#include <moeroute/reference.hpp>

namespace mr = moeroute;

int main() {
  const auto cfg = mr::presets::mixtral(/*experts=*/8, /*k=*/2);
  const std::int64_t T = 64;
  const std::size_t ws = mr::cuda::gating_workspace_bytes(cfg, T);
  mr::cuda::gating_params<float> empty;  // T = 0: success, nothing launched
  if (!mr::cuda::gating(cfg, empty, nullptr, 0).ok()) return 1;
  mr::cuda::gating_params<float> missing;
  missing.tokens = T;
  const auto st = mr::cuda::gating(cfg, missing, nullptr, ws);
  std::printf("moeroute consumer (CUDA): workspace %zu bytes; a call without buffers: %s\n", ws,
              st.message.c_str());
  if (st.code != mr::status_code::invalid_argument) return 1;

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("moeroute consumer (CUDA): no CUDA device, the launch itself not run\n");
    return 0;
  }
  std::vector<float> logits(T * cfg.num_experts);
  for (std::size_t i = 0; i < logits.size(); ++i)
    logits[i] = static_cast<float>((i * 37) % 17) - 8.0f;
  mr::cuda::device_buffer<float> d_logits(logits), gates(T * cfg.top_k), lse(T);
  mr::cuda::device_buffer<std::int32_t> ids(T * cfg.top_k);
  mr::cuda::device_buffer<double> score_sum(cfg.num_experts), z(1);
  mr::cuda::device_buffer<std::int64_t> count(cfg.num_experts), valid(1);
  mr::cuda::device_buffer<unsigned char> workspace(ws);
  mr::cuda::gating_params<float> p;
  p.d_logits = d_logits.get();
  p.tokens = T;
  p.out.d_ids = ids.get();
  p.out.d_gates = gates.get();
  p.out.d_logsumexp = lse.get();
  p.out.sums = {score_sum.get(), count.get(), valid.get(), z.get()};
  if (!mr::cuda::gating(cfg, p, workspace.get(), workspace.size()).ok()) return 1;
  const bool same = ids.download() == mr::reference::gating(cfg, logits, T).ids;
  std::printf("moeroute consumer (CUDA): ids vs CPU reference: %s\n", same ? "OK" : "MISMATCH");
  return same ? 0 : 1;
}
