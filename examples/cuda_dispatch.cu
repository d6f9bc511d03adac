// SPDX-License-Identifier: Apache-2.0
// The docs/api.md "cuda-dispatch" example: dispatch -> compact layout -> permute -> combine
// after a gating, with every buffer allocated here (the launchers never allocate).
// Route 1024 tokens (d = 512, bf16) after a CPU gating: dispatch -> compact layout ->
// permute -> (expert FFN goes here) -> combine. All launchers are asynchronous on `stream`.
#include <cstdio>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <moeroute/cuda/combine.cuh>
#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/cuda/permute.cuh>
#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

template <class T>
T* device_alloc(std::size_t n) {  // examples may allocate; the launchers never do
  void* p = nullptr;
  cudaMalloc(&p, n * sizeof(T));
  return static_cast<T*>(p);
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_dispatch: no CUDA device, nothing to run\n");
    return 0;
  }
  namespace mr = moeroute;
  const auto cfg = mr::presets::deepspeed_topk(/*experts=*/64, /*k=*/2, /*factor=*/1.0);
  const std::int64_t T = 1024, d = 512, block = 128;
  const std::int32_t k = cfg.top_k, E = cfg.num_experts, ET = cfg.total_experts();

  // Gating output (here from the CPU reference; cuda::gating writes the same arrays).
  std::vector<float> logits(T * E);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 7919) % 1009) / 211.0f;
  const auto g = mr::reference::gate(cfg, logits, T);

  cudaStream_t stream;
  cudaStreamCreate(&stream);
  auto* d_ids = device_alloc<std::int32_t>(T * k);
  auto* d_gates = device_alloc<float>(T * k);
  cudaMemcpy(d_ids, g.ids.data(), T * k * sizeof(std::int32_t), cudaMemcpyHostToDevice);
  cudaMemcpy(d_gates, g.gates.data(), T * k * sizeof(float), cudaMemcpyHostToDevice);

  // 1. capacity assignment
  mr::cuda::dispatch_params dp;
  dp.config = cfg;
  dp.tokens = T;
  dp.reroute_candidates = cfg.candidates_per_token() - k;  // 0 unless next_choice
  dp.d_ids = d_ids;
  dp.d_gates = d_gates;
  dp.d_expert = device_alloc<std::int32_t>(T * k);
  dp.d_slot = device_alloc<std::int32_t>(T * k);
  dp.d_weight = device_alloc<float>(T * k);
  dp.d_fate = device_alloc<std::uint8_t>(T * k);
  dp.d_requested = device_alloc<std::int64_t>(E);
  dp.d_kept = device_alloc<std::int64_t>(E);
  dp.d_rerouted = device_alloc<std::int64_t>(E);
  dp.d_dropped = device_alloc<std::int64_t>(E);
  dp.d_received = device_alloc<std::int64_t>(ET);
  dp.d_load = device_alloc<std::int64_t>(ET);
  dp.d_totals = device_alloc<mr::cuda::dispatch_totals>(1);
  const std::size_t ws_bytes = mr::cuda::dispatch_workspace_bytes(cfg, T);  // pure C++
  void* ws = device_alloc<unsigned char>(ws_bytes);
  if (auto s = mr::cuda::dispatch(dp, ws, ws_bytes, stream); !s) return std::printf("%s\n", s.message.c_str()), 1;

  // 2. compact layout, segments aligned to the grouped-GEMM tile
  mr::cuda::layout_params lp;
  lp.kind = mr::cuda::layout_kind::compact;
  lp.block_size = block;
  lp.tokens = T;
  lp.k = k;
  lp.experts = E;
  lp.total_experts = ET;
  lp.max_rows = mr::cuda::layout_max_rows(cfg, T, lp.kind, block);  // upper bound, pure C++
  lp.d_expert = dp.d_expert;
  lp.d_slot = dp.d_slot;
  lp.d_load = dp.d_load;
  lp.d_totals = dp.d_totals;
  lp.d_offsets = device_alloc<std::int64_t>(ET + 1);
  lp.d_row_token = device_alloc<std::int32_t>(lp.max_rows);
  lp.d_assignment_row = device_alloc<std::int64_t>(T * k);
  lp.d_block_expert = device_alloc<std::int32_t>(lp.max_rows / block);
  lp.d_num_rows = device_alloc<std::int64_t>(1);
  if (auto s = mr::cuda::build_layout(lp, cfg, stream); !s) return std::printf("%s\n", s.message.c_str()), 1;

  // 3. gather hidden states into the expert buffer
  auto* d_x = device_alloc<__nv_bfloat16>(T * d);
  cudaMemsetAsync(d_x, 0, T * d * sizeof(__nv_bfloat16), stream);
  auto* d_buf = device_alloc<__nv_bfloat16>(lp.max_rows * d);
  mr::cuda::permute_params<__nv_bfloat16> pp;
  pp.d_x = d_x;
  pp.tokens = T;
  pp.hidden = d;
  pp.d_row_token = lp.d_row_token;
  pp.rows = lp.max_rows;
  pp.d_num_rows = lp.d_num_rows;
  pp.d_out = d_buf;
  if (auto s = mr::cuda::permute(pp, stream); !s) return std::printf("%s\n", s.message.c_str()), 1;

  // ... grouped GEMM over d_buf using lp.d_block_expert, writing d_buf in place ...

  // 4. weighted sum back into token order
  auto* d_y = device_alloc<__nv_bfloat16>(T * d);
  mr::cuda::combine_params<__nv_bfloat16> cp;
  cp.d_expert_out = d_buf;
  cp.rows = lp.max_rows;
  cp.d_assignment_row = lp.d_assignment_row;
  cp.d_weight = dp.d_weight;
  cp.d_fate = dp.d_fate;
  cp.d_x = d_x;
  cp.tokens = T;
  cp.k = k;
  cp.hidden = d;
  cp.dropped = cfg.dispatch.dropped;
  cp.d_y = d_y;
  if (auto s = mr::cuda::combine(cp, stream); !s) return std::printf("%s\n", s.message.c_str()), 1;

  mr::cuda::dispatch_totals totals;
  cudaMemcpyAsync(&totals, dp.d_totals, sizeof totals, cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);  // the only sync: to read the totals on the host
  std::printf("C = %lld, kept %lld, dropped %lld\n", static_cast<long long>(totals.capacity),
              static_cast<long long>(totals.kept), static_cast<long long>(totals.dropped));
  return 0;
}
