// SPDX-License-Identifier: Apache-2.0
// Google Benchmark of the CUDA launchers over the model shapes of bench/shapes.hpp: gating,
// losses, dispatch (capacity factor 1.25), compact layout, permute, combine and the backward
// launchers (gating backward, combine and permute backward, expert-bias update), bf16 logits
// and hidden states; gating and the routing decision also replayed from a CUDA graph. Each case is
// timed with CUDA events around the launch (UseManualTime) after one warm-up call, and reports
// bytes and items (tokens) per second plus `pct_of_peak`: achieved bytes/s against the H200's 4.8
// TB/s HBM3e. Cases are registered only when a CUDA device exists; without one the binary says so
// and exits 0. JSON with --benchmark_out=FILE --benchmark_out_format=json. The time per case is
// --benchmark_min_time's (gpu_check.sh passes 0.02 s: each iteration syncs, so a microsecond
// kernel's case costs about ten times its timed part in wall time).
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <moeroute/cuda/combine_backward.cuh>
#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/expert_bias_update.cuh>
#include <moeroute/cuda/gating_backward.cuh>
#include <moeroute/cuda/permute_backward.cuh>

#include <moeroute/planner/scenarios.hpp>

#include "cuda_stages.cuh"
#include "shapes.hpp"

namespace {

// No `using namespace moeroute`: nvcc's generated stubs name ::cuda::std, which a using-directive
// at namespace scope would make ambiguous with moeroute::cuda.
using moeroute::status;
using moeroute::bench::bench_values;
using moeroute::bench::cuda_stages;
using moeroute::bench::device_bf16;
using moeroute::bench::h200_peak_bytes_per_s;
using moeroute::bench::model_shape;
using moeroute::bench::model_shapes;
using moeroute::bench::token_counts;
using moeroute::cuda::device_buffer;
using moeroute::planner::make_logits;
using moeroute::planner::scenario_kind;
using moeroute::planner::scenario_params;

/// Times `launch` with CUDA events, one iteration per event pair, after a warm-up.
void time_launch(benchmark::State& st, cudaStream_t stream, const std::function<status()>& launch,
                 double bytes_per_iter, std::int64_t tokens) {
  if (auto s = launch(); !s) {
    st.SkipWithError(s.message.c_str());
    return;
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (auto _ : st) {
    cudaEventRecord(a, stream);
    const status s = launch();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    if (!s) {
      st.SkipWithError(s.message.c_str());
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a, b);
    st.SetIterationTime(static_cast<double>(ms) / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  st.SetItemsProcessed(st.iterations() * tokens);
  st.SetBytesProcessed(
      static_cast<std::int64_t>(bytes_per_iter * static_cast<double>(st.iterations())));
  st.counters["pct_of_peak"] = benchmark::Counter(
      100.0 * bytes_per_iter * static_cast<double>(st.iterations()) / h200_peak_bytes_per_s,
      benchmark::Counter::kIsRate);
}

/// Times `launch` captured once into a CUDA graph: each iteration replays the graph
/// `replays` times between one event pair and reports the time per replay (the decode path,
/// where an engine replays its captured step and launch overhead is what is left).
void time_graph(benchmark::State& st, cudaStream_t stream, const std::function<status()>& launch,
                std::int64_t tokens, int replays = 20) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  status captured;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess) {
    captured = launch();
    if (cudaStreamEndCapture(stream, &graph) != cudaSuccess) graph = nullptr;
  }
  if (!captured || graph == nullptr || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    st.SkipWithError(captured ? "graph capture failed" : captured.message.c_str());
    if (graph) cudaGraphDestroy(graph);
    return;
  }
  cudaGraphLaunch(exec, stream);  // warm-up
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (auto _ : st) {
    cudaEventRecord(a, stream);
    for (int r = 0; r < replays; ++r) cudaGraphLaunch(exec, stream);
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a, b);
    st.SetIterationTime(static_cast<double>(ms) / 1e3 / replays);
  }
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    st.SkipWithError(cudaGetErrorString(e));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  st.SetItemsProcessed(st.iterations() * tokens);
}

/// One routed batch per (model, T), built once and shared by the stage benchmarks.
struct fixture {
  std::unique_ptr<cuda_stages> p;
  cudaStream_t stream = nullptr;
  std::int64_t rows_used = 0;
  std::int64_t live_rows = 0;  ///< rows holding an assignment (kept + rerouted)
  // backward: upstream gradients in, gradients out
  device_buffer<float> grad_weight_in, grad_logits, grad_weight;  // [T,k], [T,E], [T,k]
  device_buffer<__nv_bfloat16> dy, grad_ye, grad_x;               // [T,d], [rows,d], [T,d]
  fixture() = default;
  fixture(const fixture&) = delete;
  fixture& operator=(const fixture&) = delete;
  ~fixture() {
    if (stream) cudaStreamDestroy(stream);
  }
};

fixture& get_fixture(const model_shape& m, std::int64_t T) {
  static std::vector<std::pair<std::string, std::unique_ptr<fixture>>> cache;
  const std::string key = std::string(m.name) + "/" + std::to_string(T);
  for (auto& [k, f] : cache)
    if (k == key) return *f;
  // Only one batch lives at a time (the largest ones hold a few GB).
  cache.clear();
  auto f = std::make_unique<fixture>();
  cudaStreamCreate(&f->stream);
  moeroute::router_options opt;
  opt.layout = moeroute::layout_kind::compact;
  opt.block_size = 16;
  opt.logsumexp = true;  // as the runs in docs/gpu-results.md: gating writes the logsumexp
  f->p = std::make_unique<cuda_stages>(m.capacity_config(1.25), T, m.hidden, opt);
  f->p->logits.upload(
      device_bf16(make_logits(scenario_kind::uniform, T, m.experts, scenario_params{})));
  f->p->x.upload(device_bf16(bench_values(static_cast<std::size_t>(T * m.hidden), 5)));
  moeroute::throw_if_error(f->p->route(f->stream));
  moeroute::throw_if_error(f->p->permute(f->stream));
  const auto totals = f->p->totals();
  f->rows_used = f->p->rows_used();
  f->live_rows = totals.kept + totals.rerouted;
  const auto n = static_cast<std::size_t>(T * m.top_k);
  f->grad_weight_in = device_buffer<float>(bench_values(n, 7, 0.5f));
  f->grad_logits = device_buffer<float>(static_cast<std::size_t>(T * m.experts));
  f->grad_weight = device_buffer<float>(n);
  f->dy = device_buffer<__nv_bfloat16>(
      device_bf16(bench_values(static_cast<std::size_t>(T * m.hidden), 9)));
  f->grad_ye =
      device_buffer<__nv_bfloat16>(static_cast<std::size_t>(f->p->b.max_rows() * m.hidden));
  f->grad_x = device_buffer<__nv_bfloat16>(static_cast<std::size_t>(T * m.hidden));
  cache.emplace_back(key, std::move(f));
  return *cache.back().second;
}

/// Registers body under name/<model>/T=<T>, timed by the case itself (CUDA events).
template <class Body>
void register_case(const std::string& name, const model_shape& m, std::int64_t T, Body body) {
  const std::string full = name + "/" + std::string(m.name) + "/T=" + std::to_string(T);
  benchmark::RegisterBenchmark(full.c_str(), body)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

/// The gating cases of one shape: bf16 logits in; ids + gates + logsumexp out (+ per-chunk
/// partial sums); the inference path (no sums, no logsumexp: the bytes are the logits and the
/// ids / gates), alone and under graph replay; gating under graph replay (the decode cost).
void register_gating(const model_shape& m, std::int64_t T) {
  const double E = m.experts, k = m.top_k, t = static_cast<double>(T);
  register_case("cuda_gating_bf16", m, T, [m, T, E, k, t](benchmark::State& st) {
    auto& f = get_fixture(m, T);
    time_launch(
        st, f.stream, [&] { return f.p->gate(f.stream); }, t * (E * 2 + k * 8 + 4), T);
  });
  register_case("cuda_gating_infer_bf16", m, T, [m, T, E, k, t](benchmark::State& st) {
    auto& f = get_fixture(m, T);
    time_launch(
        st, f.stream, [&] { return f.p->gate_inference(f.stream); }, t * (E * 2 + k * 8), T);
  });
  register_case("cuda_gating_infer_graph", m, T, [m, T](benchmark::State& st) {
    auto& f = get_fixture(m, T);
    time_graph(
        st, f.stream, [&] { return f.p->gate_inference(f.stream); }, T);
  });
  register_case("cuda_gating_graph", m, T, [m, T](benchmark::State& st) {
    auto& f = get_fixture(m, T);
    time_graph(
        st, f.stream, [&] { return f.p->gate(f.stream); }, T);
  });
}

void register_all() {
  // the wide rows (E = 384, 512): the gating cases alone
  for (const model_shape& m : moeroute::bench::wide_gating_shapes)
    for (std::int64_t T : moeroute::bench::wide_gating_token_counts) register_gating(m, T);
  for (const model_shape& m : model_shapes) {
    for (std::int64_t T : token_counts) {
      const double E = m.experts, k = m.top_k, d = static_cast<double>(m.hidden),
                   t = static_cast<double>(T);
      auto reg = [&](const std::string& name, auto body) { register_case(name, m, T, body); };
      register_gating(m, T);
      // gating + losses + dispatch (the routing decision) captured in a CUDA graph and
      // replayed: the decode-time cost per call
      reg("cuda_route_graph", [m, T](benchmark::State& st) {
        auto& f = get_fixture(m, T);
        time_graph(
            st, f.stream,
            [&] {
              if (auto s = f.p->gate(f.stream); !s) return s;
              if (auto s = f.p->losses(f.stream); !s) return s;
              return f.p->dispatch(f.stream);
            },
            T);
      });
      reg("cuda_losses", [m, T, E](benchmark::State& st) {
        auto& f = get_fixture(m, T);
        time_launch(
            st, f.stream, [&] { return f.p->losses(f.stream); }, E * 16 + 32, T);
      });
      reg("cuda_dispatch_cf1.25", [m, T, E, k, t](benchmark::State& st) {
        auto& f = get_fixture(m, T);
        time_launch(
            st, f.stream, [&] { return f.p->dispatch(f.stream); }, t * k * (8 + 13) + E * 48, T);
      });
      reg("cuda_layout_compact_b16", [m, T, k, t](benchmark::State& st) {
        auto& f = get_fixture(m, T);
        time_launch(
            st, f.stream, [&] { return f.p->layout(f.stream); },
            t * k * 16 + static_cast<double>(f.p->b.max_rows()) * 4, T);
      });
      reg("cuda_permute_bf16", [m, T, d](benchmark::State& st) {
        auto& f = get_fixture(m, T);
        time_launch(
            st, f.stream, [&] { return f.p->permute(f.stream); },
            2.0 * static_cast<double>(f.rows_used) * d * 2, T);
      });
      reg("cuda_combine_bf16", [m, T, k, d, t](benchmark::State& st) {
        auto& f = get_fixture(m, T);
        time_launch(
            st, f.stream, [&] { return f.p->combine(f.stream); },
            (t * k * d + t * d) * 2 + t * k * 12, T);
      });
      // backward, router logits (routing + aux + z terms, overwrite): bf16 logits, [T,k] ids +
      // fates + d_weight, E aux counts in; T*E fp32 d_logits out
      reg("cuda_gating_backward_bf16", [m, T, E, k, t](benchmark::State& st) {
        auto& f = get_fixture(m, T);
        time_launch(
            st, f.stream,
            [&] {
              moeroute::cuda::gating_backward_params<__nv_bfloat16> g;
              g.d_logits = f.p->logits.get();
              g.tokens = T;
              g.gated = f.p->b.gating_out();
              g.dispatched = f.p->b.dispatch_out();
              g.d_grad_weight = f.grad_weight_in.get();
              g.accumulate = false;
              g.d_grad_logits = f.grad_logits.get();
              return moeroute::cuda::gating_backward(f.p->b.config(), g, f.stream);
            },
            t * (E * (2 + 4) + k * 9) + E * 8 + 8, T);
      });
      // backward of combine: gather dy into every live row, write d_expert_out [rows,d]
      // (padding rows 0) + row_token; per token read dy and its live expert rows, write d_weight
      // and the residual d_x; [T,k] assignment rows, weights, fates
      reg("cuda_backward_combine_bf16", [m, T, k, d, t](benchmark::State& st) {
        auto& f = get_fixture(m, T);
        const double rows = static_cast<double>(f.rows_used),
                     live = static_cast<double>(f.live_rows);
        time_launch(
            st, f.stream,
            [&] {
              moeroute::cuda::combine_backward_params<__nv_bfloat16> c;
              c.d_expert_out = f.p->ye.get();
              c.d_dy = f.dy.get();
              c.rows = f.rows_used;
              c.tokens = T;
              c.hidden = m.hidden;
              c.layout = f.p->b.layout_out();
              c.dispatched = f.p->b.dispatch_out();
              c.d_grad_expert_out = f.grad_ye.get();
              c.d_grad_weight = f.grad_weight.get();
              c.d_grad_x = f.grad_x.get();
              return moeroute::cuda::combine_backward(f.p->b.config(), c, f.stream);
            },
            (live * d + rows * d) * 2 + rows * 4 + (t * d + live * d + t * d) * 2 +
                t * k * (8 + 4 + 1 + 4),
            T);
      });
      // backward of permute: per token sum its live rows of d_buf [rows,d] into d_x [T,d]
      reg("cuda_backward_permute_bf16", [m, T, k, d, t](benchmark::State& st) {
        auto& f = get_fixture(m, T);
        const double live = static_cast<double>(f.live_rows);
        time_launch(
            st, f.stream,
            [&] {
              moeroute::cuda::permute_backward_params<__nv_bfloat16> q;
              q.d_grad_buf = f.grad_ye.get();
              q.rows = f.rows_used;
              q.tokens = T;
              q.hidden = m.hidden;
              q.layout = f.p->b.layout_out();
              q.d_grad_x = f.grad_x.get();
              return moeroute::cuda::permute_backward(f.p->b.config(), q, f.stream);
            },
            (live * d + t * d) * 2 + t * k * 8, T);
      });
    }

    // expert-bias update (aux-loss-free balancing, once per step): read E int64 loads, read and
    // write E fp32 biases (twice with recenter). One thread: latency, not bandwidth.
    benchmark::RegisterBenchmark(
        ("cuda_backward_expert_bias_update/" + std::string(m.name)).c_str(),
        [m](benchmark::State& st) {
          const std::size_t E = static_cast<std::size_t>(m.experts);
          std::vector<std::int64_t> load(E);
          for (std::size_t e = 0; e < E; ++e) load[e] = static_cast<std::int64_t>((e * 37) % 101);
          device_buffer<float> bias(E);
          device_buffer<std::int64_t> d_load(E);
          bias.upload(std::vector<float>(E, 0.0f));
          d_load.upload(load);
          cudaStream_t stream = nullptr;
          cudaStreamCreate(&stream);
          auto cfg = m.config();
          cfg.gating.bias_update = {1e-3f, true};
          moeroute::cuda::expert_bias_update_params b;
          b.d_bias = bias.get();
          b.d_load = d_load.get();
          time_launch(
              st, stream, [&] { return moeroute::cuda::expert_bias_update(cfg, b, stream); },
              static_cast<double>(E) * (8 + 4 + 4 + 4 + 4), m.experts);
          cudaStreamDestroy(stream);
        })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e == cudaSuccess && devices > 0) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    benchmark::AddCustomContext("gpu", prop.name);
    benchmark::AddCustomContext("peak_bandwidth_assumed",
                                "4.8 TB/s (H200 HBM3e); pct_of_peak is relative to it");
    register_all();
  } else {
    std::fprintf(stderr, "bench_kernels_cuda: no CUDA device (%s): no GPU benchmark registered\n",
                 e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& ex_) {
    std::fprintf(stderr, "bench_kernels_cuda: %s\n", ex_.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
