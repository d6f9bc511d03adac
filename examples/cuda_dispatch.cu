// SPDX-License-Identifier: Apache-2.0
// The GPU routing stages after gating, each feeding the next through the view it wrote:
// dispatch -> compact layout -> permute -> (the experts) -> combine, on 1024 bf16 tokens of
// d = 512. Every buffer is allocated here (the launchers never allocate). The "experts" scale
// their rows by (expert + 1), and the output is checked bit for bit against the CPU reference
// of the same routing: it prints OK, or MISMATCH and the first difference.
// Without a CUDA device it says so and exits 0.
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <moeroute/cuda/combine.cuh>
#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/cuda/permute.cuh>
#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

namespace mr = moeroute;
using mr::cuda::device_buffer;

/// The experts of this example: row r of expert e's segment becomes (e + 1) * row r.
__global__ void scale_rows(__nv_bfloat16* rows, const std::int32_t* block_expert,
                           std::int64_t block, std::int64_t d) {
  const std::int32_t e = block_expert[blockIdx.x];
  if (e < 0) return;
  const float s = static_cast<float>(e + 1);
  for (std::int64_t r = blockIdx.x * block; r < (blockIdx.x + 1) * block; ++r)
    for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x)
      rows[r * d + c] = __float2bfloat16_rn(__bfloat162float(rows[r * d + c]) * s);
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_dispatch: no CUDA device, nothing to run\n");
    return 0;
  }
  try {
    // [snippet:cuda-dispatch]
    const mr::routing_config cfg =
        mr::presets::deepspeed_topk(/*experts=*/64, /*k=*/2, /*factor=*/1.0);
    const std::int64_t T = 1024, d = 512, block = 128;
    const std::int32_t k = cfg.top_k, E = cfg.num_experts, ET = cfg.total_experts();

    // The gating outputs (here from the CPU reference; cuda::gating writes the same arrays).
    std::vector<float> logits(T * E);
    for (std::size_t i = 0; i < logits.size(); ++i)
      logits[i] = static_cast<float>((i * 7919) % 1009) / 211.0f;
    const auto g = mr::reference::gating(cfg, logits, T);
    device_buffer<std::int32_t> ids(g.ids);
    device_buffer<float> gates(g.gates);
    cudaStream_t stream;
    mr::cuda::throw_if_cuda_error(cudaStreamCreate(&stream), "cudaStreamCreate");

    // 1. capacity assignment: every output of dispatch in one view
    device_buffer<std::int32_t> expert(T * k), slot(T * k);
    device_buffer<float> weight(T * k);
    device_buffer<mr::fate> fates(T * k);
    device_buffer<std::int64_t> requested(E), kept(E), rerouted(E), dropped(E), received(ET),
        load(ET);
    device_buffer<mr::dispatch_totals> totals(1);
    device_buffer<unsigned char> workspace(
        mr::cuda::dispatch_workspace_bytes(cfg, T));  // pure C++ size
    mr::cuda::dispatch_params dp;
    dp.tokens = T;
    dp.gated.d_ids = ids.get();
    dp.gated.d_gates = gates.get();
    dp.out = {expert.get(),    slot.get(), weight.get(),   fates.get(),
              requested.get(), kept.get(), rerouted.get(), dropped.get(),
              received.get(),  load.get(), totals.get()};
    if (auto s = mr::cuda::dispatch(cfg, dp, workspace.get(), workspace.size(), stream); !s)
      throw mr::error(s);

    // 2. compact layout, segments aligned to the grouped-GEMM tile
    const std::int64_t max_rows =
        mr::cuda::layout_max_rows(cfg, T, mr::layout_kind::compact, block);
    device_buffer<std::int64_t> offsets(ET + 1), assignment_row(T * k), num_rows(1);
    device_buffer<std::int32_t> row_token(max_rows), block_expert(max_rows / block);
    mr::cuda::layout_params lp;
    lp.kind = mr::layout_kind::compact;
    lp.block_size = block;
    lp.tokens = T;
    lp.max_rows = max_rows;
    lp.dispatched = dp.out;  // what dispatch wrote is what layout reads
    lp.out.d_offsets = offsets.get();
    lp.out.d_row_token = row_token.get();
    lp.out.d_assignment_row = assignment_row.get();
    lp.out.d_block_expert = block_expert.get();
    lp.out.d_num_rows = num_rows.get();
    if (auto s = mr::cuda::layout(cfg, lp, stream); !s) throw mr::error(s);

    // 3. gather the hidden states into the expert buffer
    std::vector<__nv_bfloat16> hx(T * d);
    for (std::size_t i = 0; i < hx.size(); ++i)
      hx[i] = __float2bfloat16_rn(static_cast<float>(i % 97) / 32.0f - 1.5f);
    device_buffer<__nv_bfloat16> x(hx), buf(max_rows * d), y(T * d);
    mr::cuda::permute_params<__nv_bfloat16> pp;
    pp.d_x = x.get();
    pp.tokens = T;
    pp.hidden = d;
    pp.layout = lp.out;
    pp.rows = max_rows;
    pp.d_out = buf.get();
    if (auto s = mr::cuda::permute(cfg, pp, stream); !s) throw mr::error(s);

    // 4. the experts, on the rows of their blocks (a grouped GEMM in a real model)
    scale_rows<<<static_cast<unsigned>(max_rows / block), 128, 0, stream>>>(
        buf.get(), block_expert.get(), block, d);

    // 5. weighted sum back into token order
    mr::cuda::combine_params<__nv_bfloat16> cp;
    cp.d_expert_out = buf.get();
    cp.rows = max_rows;
    cp.tokens = T;
    cp.hidden = d;
    cp.layout = lp.out;
    cp.dispatched = dp.out;
    cp.d_x = x.get();
    cp.d_y = y.get();
    if (auto s = mr::cuda::combine(cfg, cp, stream); !s) throw mr::error(s);
    mr::cuda::throw_if_cuda_error(cudaStreamSynchronize(stream),
                                  "sync");  // the only sync: to read y
    // [/snippet]

    // The same routing and experts on the CPU reference.
    const auto rd = mr::reference::dispatch(cfg, g);
    const auto rl = mr::reference::layout(cfg, rd, mr::layout_kind::compact, block);
    std::vector<mr::bf16_bits> rx(hx.size()), rbuf(rl.num_rows * d), ry(T * d);
    std::memcpy(rx.data(), hx.data(), hx.size() * sizeof(hx[0]));
    mr::reference::permute<mr::bf16_bits>(cfg, rl, rx, T, d, rbuf);
    for (std::int64_t r = 0; r < rl.num_rows; ++r) {
      const float s = static_cast<float>(rl.block_expert[r / block] + 1);
      for (std::int64_t c = 0; c < d; ++c)
        rbuf[r * d + c] = mr::to_bf16(mr::to_float(rbuf[r * d + c]) * s);
    }
    mr::reference::combine<mr::bf16_bits>(cfg, rl, rd, rbuf, d, rx, ry);

    const auto gy = y.download();
    const auto t = totals.download()[0];
    std::printf("C = %lld, kept %lld, dropped %lld of %lld assignments\n",
                static_cast<long long>(t.capacity), static_cast<long long>(t.kept),
                static_cast<long long>(t.dropped), static_cast<long long>(T * k));
    for (std::int64_t i = 0; i < T * d; ++i) {
      std::uint16_t a, b;
      std::memcpy(&a, &gy[i], 2);
      std::memcpy(&b, &ry[i], 2);
      if (a != b) {
        std::printf("MISMATCH at y[%lld]: gpu %g, cpu %g\n", static_cast<long long>(i),
                    static_cast<double>(__bfloat162float(gy[i])),
                    static_cast<double>(mr::to_float(ry[i])));
        return 1;
      }
    }
    const bool routed = t.kept > 0 && t.kept + t.dropped == T * k;
    std::printf("%s: y (%lld x %lld bf16) equals the CPU reference bit for bit\n",
                routed ? "OK" : "MISMATCH", static_cast<long long>(T), static_cast<long long>(d));
    cudaStreamDestroy(stream);
    return routed ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("MISMATCH: %s\n", e.what());
    return 1;
  }
}
