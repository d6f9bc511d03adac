// SPDX-License-Identifier: Apache-2.0
// An expert-parallel MoE layer on GPUs over NCCL: one rank per visible GPU, driven by one host
// thread each in this process (ncclCommInitAll; across nodes, create the communicators with
// ncclCommInitRank and an MPI-broadcast ncclUniqueId instead — nothing else changes).
// 8 experts, top-2, global capacity 1.25; each expert is a learned per-channel scale
// (out = s_e * x), small enough to write as one kernel. Routing on the host, the plan over NCCL
// (the layer's one host sync), then dispatch -> experts -> combine -> backward -> one SGD step
// on the device with no further sync. Checks the output against a dense host computation and
// that the loss falls; prints per-rank counts and the hotspot factor. Copy it as a template.
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/ep.hpp>
#include <moeroute/ep/cuda.cuh>
#include <moeroute/ep/nccl.cuh>
#include <moeroute/reference.hpp>

namespace ep = moeroute::ep;
using moeroute::cuda::device_buffer;
using moeroute::cuda::throw_if_cuda_error;

constexpr int E = 8, K = 2, D = 64;

// out[r] = scale[segment of r] * in[r], for the rows of every segment in use.
__global__ void experts_forward(const float* in, const float* scale, const std::int64_t* offsets,
                                const std::int64_t* used, int segments, float* out) {
  for (int l = 0; l < segments; ++l)
    for (std::int64_t r = offsets[l] + blockIdx.x; r < offsets[l] + used[l]; r += gridDim.x)
      for (int c = threadIdx.x; c < D; c += blockDim.x)
        out[r * D + c] = scale[l * D + c] * in[r * D + c];
}
// d in = scale * d out; d scale[l, c] = sum over the segment's rows of d out * in (one thread
// per (segment, channel), rows in order: deterministic, no atomics).
__global__ void experts_backward(const float* in, const float* d_out, const float* scale,
                                 const std::int64_t* offsets, const std::int64_t* used,
                                 int segments, float* d_in, float* d_scale) {
  const int l = blockIdx.x, c = threadIdx.x;
  if (l >= segments || c >= D) return;
  float acc = 0.0f;
  for (std::int64_t r = offsets[l]; r < offsets[l] + used[l]; ++r) {
    acc += d_out[r * D + c] * in[r * D + c];
    d_in[r * D + c] = scale[l * D + c] * d_out[r * D + c];
  }
  d_scale[l * D + c] = acc;
}
__global__ void sgd(float* w, const float* g, int n, float lr) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) w[i] -= lr * g[i];
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to run (this example needs at least one GPU)\n");
    return 0;
  }
  std::vector<ncclComm_t> comms(devices);
  std::vector<int> ids(devices);
  for (int i = 0; i < devices; ++i) ids[i] = i;
  if (ncclCommInitAll(comms.data(), devices, ids.data()) != ncclSuccess) {
    std::printf("MISMATCH: ncclCommInitAll failed\n");
    return 1;
  }
  std::mutex print;
  std::vector<int> bad(devices, 0);
  std::vector<std::thread> ranks;
  for (int me = 0; me < devices; ++me) {
    ranks.emplace_back([&, me] {
      try {
        throw_if_cuda_error(cudaSetDevice(me), "cudaSetDevice");
        cudaStream_t stream;
        throw_if_cuda_error(cudaStreamCreate(&stream), "cudaStreamCreate");
        ep::nccl_transport t(comms[me], stream);
        const int R = t.ranks();
        const std::int64_t T = 256 + 64 * me;

        moeroute::routing_config cfg;
        cfg.num_experts = E;
        cfg.top_k = K;
        cfg.capacity.factor = 1.25;
        ep::options opt;
        opt.scope = ep::capacity_scope::global;
        const auto place = ep::placement::contiguous(E, R);

        std::vector<float> logits(T * E), x(T * D);
        unsigned s = 7u + 31u * static_cast<unsigned>(me);
        auto rnd = [&] {
          s = s * 1664525u + 1013904223u;
          return float((s >> 8) & 0xffff) / 65536.0f - 0.5f;
        };
        for (std::int64_t i = 0; i < T * E; ++i)
          logits[i] = 4.0f * rnd() + (i % E == 7 ? 1.0f : 0.0f);
        for (auto& v : x) v = rnd();

        // Routing (host), layout (local), plan: the one counts exchange and host sync.
        const auto g = moeroute::reference::gating(cfg, logits, T);
        const auto L = ep::local_dispatch(cfg, place, opt, me, g);
        const ep::plan p = ep::make_plan(t, cfg, place, opt, L, D, sizeof(float));
        device_buffer<std::byte> plan_mem(std::max<std::size_t>(ep::cuda::device_plan_bytes(p), 1));
        ep::cuda::device_plan dp;
        moeroute::throw_if_error(
            ep::cuda::upload(p, plan_mem.get(), ep::cuda::device_plan_bytes(p), dp, stream));
        const std::size_t wsb = ep::cuda::workspace_bytes(p);
        device_buffer<std::byte> ws(std::max<std::size_t>(wsb, 1));

        const int S = p.segments();
        std::vector<float> scale(S * D);
        for (int l = 0; l < S; ++l)
          for (int c = 0; c < D; ++c) scale[l * D + c] = 1.0f + 0.05f * p.segment_expert[l];
        device_buffer<float> d_x(x), d_scale(scale), d_recv(p.receive_rows * D),
            d_out(p.receive_rows * D), d_ret(p.send_total() * D), d_y(T * D),
            d_gout(p.receive_rows * D), d_gin(p.receive_rows * D), d_gx(T * D), d_gw(T * K),
            d_gscale(S * D);
        device_buffer<std::int64_t> d_off(p.segment_offsets), d_used(p.segment_used);

        const auto forward = [&] {
          moeroute::throw_if_error(ep::cuda::dispatch<float>(t, p, dp, {d_x.get(), d_recv.get()},
                                                             ws.get(), wsb, stream));
          experts_forward<<<64, 64, 0, stream>>>(d_recv.get(), d_scale.get(), d_off.get(),
                                                 d_used.get(), S, d_out.get());
          moeroute::throw_if_error(ep::cuda::combine<float>(
              t, p, dp, {d_out.get(), d_x.get(), d_ret.get(), d_y.get()}, ws.get(), wsb, stream));
          throw_if_cuda_error(cudaStreamSynchronize(stream), "sync");  // to print the loss
          const auto y = d_y.download();
          double loss = 0;
          for (float v : y) loss += 0.5 * double(v) * v;
          return std::pair{loss, y};
        };
        const auto [loss0, y] = forward();

        // Check: each token against a dense computation of the same routing.
        for (std::int64_t tk = 0; tk < T; ++tk)
          for (int c = 0; c < D; ++c) {
            float acc = 0.0f;
            for (int j = 0; j < K; ++j) {
              const std::int64_t a = tk * K + j;
              const int e = p.decision.expert[a];
              if (e >= 0) acc += p.decision.weight[a] * ((1.0f + 0.05f * e) * x[tk * D + c]);
            }
            bad[me] += acc != y[tk * D + c];
          }

        // Backward (dL/dy = y) and one SGD step on the expert scales, all on the stream.
        moeroute::throw_if_error(ep::cuda::combine_backward<float>(
            t, p, dp, {d_ret.get(), d_y.get(), d_gout.get(), d_gw.get(), d_gx.get()}, ws.get(), wsb,
            stream));
        experts_backward<<<S, D, 0, stream>>>(d_recv.get(), d_gout.get(), d_scale.get(),
                                              d_off.get(), d_used.get(), S, d_gin.get(),
                                              d_gscale.get());
        moeroute::throw_if_error(ep::cuda::dispatch_backward<float>(
            t, p, dp, {d_gin.get(), d_gx.get(), true}, ws.get(), wsb, stream));
        sgd<<<(S * D + 255) / 256, 256, 0, stream>>>(d_scale.get(), d_gscale.get(), S * D, 0.01f);
        const auto [loss1, y1] = forward();  // the same plan, reused
        (void)y1;
        if (!(loss1 < loss0)) bad[me] += 1;

        std::lock_guard lock(print);
        std::printf(
            "rank %d: tokens %lld, sent %lld rows, received %lld, dropped %lld; local loss "
            "%.4f -> %.4f\n",
            me, static_cast<long long>(T), static_cast<long long>(p.send_total()),
            static_cast<long long>(p.recv_total()), static_cast<long long>(p.dropped_by_rank[me]),
            loss0, loss1);
        if (me == 0)
          std::printf("global C = %lld over %lld tokens; hotspot factor %.2f\n",
                      static_cast<long long>(p.capacity), static_cast<long long>(p.global_tokens),
                      p.hotspot());
        cudaStreamDestroy(stream);
      } catch (const std::exception& e) {
        std::lock_guard lock(print);
        std::printf("rank %d: error: %s\n", me, e.what());
        bad[me] += 1;
      }
    });
  }
  for (auto& th : ranks) th.join();
  for (auto c : comms) ncclCommDestroy(c);
  int any = 0;
  for (int b : bad) any += b;
  std::printf(any ? "MISMATCH: %d checks failed\n" : "OK\n", any);
  return any ? 1 : 0;
}
