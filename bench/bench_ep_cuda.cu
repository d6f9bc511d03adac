// SPDX-License-Identifier: Apache-2.0
// Google Benchmark of the device expert-parallel launchers on the one-GPU loopback (R = 1 and
// 2 ranks as threads on one device): dispatch (pack, the device-to-device exchange, unpack into
// the receive layout) and combine (gather, exchange, the fp32 choice-order reduce), bf16, for
// Mixtral- and DeepSeek-V3-sized layers. CUDA events around each call (UseManualTime), bytes
// moved and `pct_of_peak` against the H200's 4.8 TB/s, and `host_syncs_per_layer`: the plan's
// one (dispatch, combine and the backward add none). Cases are registered only with a device.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>

#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/ep.hpp>
#include <moeroute/ep/cuda.cuh>
#include <moeroute/reference.hpp>

#include "shapes.hpp"

namespace {

namespace ep = moeroute::ep;
using moeroute::bench::h200_peak_bytes_per_s;
using moeroute::bench::model_shape;
using moeroute::cuda::device_buffer;

/// One rank's layer: plan, device plan, buffers. Bytes: what dispatch and combine read + write.
void run_case(benchmark::State& st, const model_shape& m, std::int64_t T, std::int32_t R,
              bool combine) {
  ep::cuda::loopback_group(R).run([&](ep::cuda::loopback_transport& t, cudaStream_t stream) {
    moeroute::routing_config cfg = m.capacity_config(1.25);
    cfg.gating.group_limit = {};
    cfg.gating.expert_bias = false;
    ep::options opt;
    opt.scope = ep::capacity_scope::global;
    const auto place = ep::placement::contiguous(m.experts, R);
    std::vector<float> logits(T * m.experts);
    std::uint64_t s = 12345u + static_cast<std::uint64_t>(t.rank());
    for (auto& v : logits) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>((s >> 40) % 2000) / 500.0f;
    }
    const auto g = moeroute::reference::gating(cfg, logits, T);
    const ep::plan p =
        ep::make_plan(t, cfg, place, opt, ep::local_dispatch(cfg, place, opt, t.rank(), g),
                      m.hidden, sizeof(__nv_bfloat16));
    device_buffer<std::byte> plan_mem(std::max<std::size_t>(ep::cuda::device_plan_bytes(p), 1));
    ep::cuda::device_plan dp;
    moeroute::throw_if_error(
        ep::cuda::upload(p, plan_mem.get(), ep::cuda::device_plan_bytes(p), dp, stream));
    const std::size_t wsb = ep::cuda::workspace_bytes(p);
    device_buffer<std::byte> ws(std::max<std::size_t>(wsb, 1));
    const auto d = m.hidden;
    device_buffer<__nv_bfloat16> x(T * d), recv(p.receive_rows * d), ret(p.send_total() * d),
        y(T * d);
    cudaMemsetAsync(x.get(), 0, T * d * 2, stream);
    const auto launch = [&] {
      if (!combine)
        return ep::cuda::dispatch<__nv_bfloat16>(t, p, dp, {x.get(), recv.get()}, ws.get(), wsb,
                                                 stream);
      return ep::cuda::combine<__nv_bfloat16>(t, p, dp, {recv.get(), x.get(), ret.get(), y.get()},
                                              ws.get(), wsb, stream);
    };
    moeroute::throw_if_error(
        ep::cuda::dispatch<__nv_bfloat16>(t, p, dp, {x.get(), recv.get()}, ws.get(), wsb, stream));
    moeroute::throw_if_error(launch());  // warm-up
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    double total = 0;
    std::int64_t iters = 0;
    // Every rank runs the same number of iterations (they are collective): a fixed count.
    for (int i = 0; i < 20; ++i) {
      cudaEventRecord(a, stream);
      moeroute::throw_if_error(launch());
      cudaEventRecord(b, stream);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      total += ms / 1e3;
      ++iters;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (t.rank() != 0) return;
    // rows: send_total on the source side, recv_total and receive_rows on the expert side.
    const double row = static_cast<double>(d) * 2;
    const double moved =
        combine ? row * (2.0 * p.recv_total() + 2.0 * p.send_total() + p.send_total() + 2.0 * T)
                : row * (T + 2.0 * p.send_total() + 2.0 * p.recv_total() + p.receive_rows);
    for (auto _ : st) st.SetIterationTime(total / static_cast<double>(iters));
    st.SetBytesProcessed(static_cast<std::int64_t>(moved * static_cast<double>(st.iterations())));
    st.counters["pct_of_peak"] = benchmark::Counter(
        100.0 * moved * static_cast<double>(st.iterations()) / h200_peak_bytes_per_s,
        benchmark::Counter::kIsRate);
    st.counters["host_syncs_per_layer"] = 1;  // make_plan's counts exchange; launches add none
    st.counters["rows_sent"] = static_cast<double>(p.send_total());
  });
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e == cudaSuccess && devices > 0) {
    for (const model_shape& m : moeroute::bench::model_shapes) {
      if (m.name != "mixtral_8x7b" && m.name != "deepseek_v3") continue;
      for (std::int32_t R : {1, 2})
        for (bool combine : {false, true}) {
          const std::int64_t T = 4096;
          const std::string name = std::string(combine ? "ep_cuda_combine/" : "ep_cuda_dispatch/") +
                                   std::string(m.name) + "/T=" + std::to_string(T) +
                                   "/R=" + std::to_string(R) + "_loopback";
          benchmark::RegisterBenchmark(
              name.c_str(),
              [m, T, R, combine](benchmark::State& st) { run_case(st, m, T, R, combine); })
              ->UseManualTime()
              ->Iterations(1)
              ->Unit(benchmark::kMicrosecond);
        }
    }
  } else {
    std::fprintf(stderr, "bench_ep_cuda: no CUDA device: no GPU benchmark registered\n");
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  // Host syncs per layer, by scope: make_plan's counts exchange (and upload) is the only one;
  // dispatch, combine and both backward launchers enqueue and return.
  for (auto scope : {ep::capacity_scope::dropless, ep::capacity_scope::dropless_worst_case,
                     ep::capacity_scope::per_source, ep::capacity_scope::global,
                     ep::capacity_scope::destination_budget})
    std::printf("host syncs per layer, %s: 1 (make_plan); dispatch / combine / backward: 0\n",
                ep::to_string(scope));
  benchmark::Shutdown();
  return 0;
}
