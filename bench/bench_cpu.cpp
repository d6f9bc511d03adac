// SPDX-License-Identifier: Apache-2.0
// Google Benchmark of the CPU backend (include/moeroute/cpu/) beside its baselines, measured
// in the same run:
//   - gating over the model shapes of shapes.hpp at T = 4096 and 16384, one thread and every
//     thread, ns per logit, beside reference::gating (the speed-up the docs quote);
//   - dispatch + layout (capacity factor 1.25) and the losses at T = 16384;
//   - the capacity tool's whole routing call (Megatron 64 x 2, uniform and Zipf batches), one
//     thread and every thread;
//   - permute, combine and their backward passes in bf16 (d = 2048, T = 4096), each beside a
//     single-thread memcpy moving the same bytes (`memcpy/read+write=<bytes>`, reads + writes
//     counted as for the operations), so % of memcpy bandwidth reads straight off the
//     bytes_per_second column.
// Built with -march=native (MOEROUTE_BENCH_NATIVE) and OpenMP when available.
// JSON with --benchmark_out=FILE --benchmark_out_format=json.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <moeroute/cpu.hpp>
#include <moeroute/reference.hpp>

#include <moeroute/planner/cpu_route.hpp>
#include <moeroute/planner/scenarios.hpp>

#include "aligned.hpp"
#include "shapes.hpp"

namespace {

using namespace moeroute;
using namespace moeroute::bench;
using namespace moeroute::planner;

void set_rate(benchmark::State& st, std::int64_t T, double bytes_per_iter) {
  st.SetItemsProcessed(st.iterations() * T);
  st.SetBytesProcessed(
      static_cast<std::int64_t>(static_cast<double>(st.iterations()) * bytes_per_iter));
}
void set_ns_per_logit(benchmark::State& st, std::int64_t T, std::int64_t E) {
  st.counters["ns_per_logit"] =
      benchmark::Counter(static_cast<double>(st.iterations() * T * E),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
cpu::executor executor_for(int threads) {
  return threads == 1 ? cpu::executor::serial() : cpu::executor{};
}
const char* threads_name(int threads) { return threads == 1 ? "/threads=1" : "/threads=all"; }
/// "/<model>/T=<T>", built by appending: GCC 12 warns a false -Wrestrict on the inlined
/// `"/" + std::string(...)` (a known GCC 12 false positive in std::string's operator+).
std::string shape_suffix(const model_shape& m, std::int64_t T) {
  std::string s = "/";
  s.append(m.name).append("/T=").append(std::to_string(T));
  return s;
}

/// A single-thread memcpy moving `bytes` in all (bytes / 2 read, bytes / 2 written), counted as
/// `bytes` per call like the operations it is the baseline of: the bandwidth columns compare
/// directly.
void register_memcpy(std::int64_t bytes) {
  benchmark::RegisterBenchmark(
      ("memcpy/read+write=" + std::to_string(bytes)).c_str(),
      [bytes](benchmark::State& st) {
        const std::size_t half = static_cast<std::size_t>(bytes / 2);
        aligned_vector<unsigned char> src(half, 1), dst(half);
        for (auto _ : st) {
          std::memcpy(dst.data(), src.data(), half);
          benchmark::DoNotOptimize(dst.data());
          benchmark::ClobberMemory();
        }
        st.SetBytesProcessed(st.iterations() * static_cast<std::int64_t>(2 * half));
      })
      ->Unit(benchmark::kMicrosecond)
      ->MinTime(0.2)
      ->UseRealTime();
}

void register_gating() {
  for (const std::int64_t T : {std::int64_t{4096}, std::int64_t{16384}}) {
    for (const model_shape& m : model_shapes) {
      const std::string sfx = shape_suffix(m, T);
      const double bytes = static_cast<double>(T) * (m.experts * 4.0 + m.top_k * 8.0 + 4.0);
      for (const int threads : {1, 0}) {
        benchmark::RegisterBenchmark(
            ("cpu_gating" + sfx + threads_name(threads)).c_str(),
            [m, T, threads, bytes](benchmark::State& st) {
              const routing_config cfg = m.config();
              const auto logits =
                  make_logits(scenario_kind::uniform, T, m.experts, scenario_params{});
              const std::vector<float> bias(cfg.gating.expert_bias ? m.experts : 0, 0.0f);
              // the cpu::gating call alone, on outputs and a workspace allocated once (an
              // engine's steady state: the same buffers every step)
              cpu_gating_call call(cfg, logits, T, bias);
              for (auto _ : st) {
                const double us = call.run(executor_for(threads));
                if (!call.result().st) st.SkipWithError(call.result().st.message.c_str());
                benchmark::DoNotOptimize(call.result().g.ids.data());
                st.SetIterationTime(us * 1e-6);
              }
              set_rate(st, T, bytes);
              set_ns_per_logit(st, T, m.experts);
            })
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.2)
            ->UseManualTime();
      }
      benchmark::RegisterBenchmark(
          ("reference_gating" + sfx).c_str(),
          [m, T, bytes](benchmark::State& st) {
            const routing_config cfg = m.config();
            const auto logits =
                make_logits(scenario_kind::uniform, T, m.experts, scenario_params{});
            const std::vector<float> bias(cfg.gating.expert_bias ? m.experts : 0, 0.0f);
            for (auto _ : st) {
              auto g = reference::gating<float>(cfg, logits, T, bias);
              benchmark::DoNotOptimize(g.ids.data());
            }
            set_rate(st, T, bytes);
            set_ns_per_logit(st, T, m.experts);
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2);
    }
  }
}

/// dispatch + layout + losses on one gating (capacity factor 1.25, the model's priority).
void register_dispatch() {
  const std::int64_t T = 16384;
  for (const model_shape& m : model_shapes) {
    const std::string sfx = shape_suffix(m, T);
    benchmark::RegisterBenchmark(
        ("cpu_dispatch_layout_losses_cf1.25" + sfx).c_str(),
        [m, T](benchmark::State& st) {
          const routing_config cfg = m.capacity_config(1.25);
          const auto logits = make_logits(scenario_kind::zipf, T, m.experts, scenario_params{});
          const std::vector<float> bias(cfg.gating.expert_bias ? m.experts : 0, 0.0f);
          const cpu_gated g = cpu_gate(cfg, logits, T, bias, 1, cpu::executor::serial());
          for (auto _ : st) {  // the three calls alone (cpu_route_rest times them)
            const cpu_routed r = cpu_route_rest(cfg, g, true, 1, 1, cpu::executor::serial());
            if (!r.st) st.SkipWithError(r.st.message.c_str());
            benchmark::DoNotOptimize(r.dispatch.slot.data());
            st.SetIterationTime(r.us * 1e-6);
          }
          set_rate(st, T, static_cast<double>(T * m.top_k) * 24.0);
        })
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.2)
        ->UseManualTime();
  }
}

/// The capacity tool's whole routing call (gating, dispatch, layout, losses: the calls alone)
/// for issue 11's shape — Megatron-Core (E = 64, k = 2), capacity factor 1.25, T = 16384 — on
/// a uniform and a Zipf-skewed batch, one thread and every thread: the two-thread ratio of
/// the call compare_torch.py times against PyTorch. (Run with
/// --benchmark_enable_random_interleaving=true to spread a noisy neighbour over both.)
void register_routing_call() {
  const std::int64_t T = 16384;
  const model_shape m{"megatron", "megatron", 64, 2, 2048};
  for (const scenario_kind batch : {scenario_kind::uniform, scenario_kind::zipf})
    for (const int threads : {1, 0}) {
      const std::string name = "cpu_routing_call/megatron_64x2_cf1.25/" +
                               std::string(scenario_names[static_cast<int>(batch)]) +
                               "/T=" + std::to_string(T) + threads_name(threads);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [m, T, batch, threads](benchmark::State& st) {
                                     routing_config cfg = m.capacity_config(1.25);
                                     cfg.training = true;  // as the capacity tool routes
                                     const auto logits =
                                         make_logits(batch, T, m.experts, scenario_params{});
                                     const cpu::executor ex = executor_for(threads);
                                     for (auto _ : st) {
                                       const cpu_gated g = cpu_gate(cfg, logits, T, {}, 1, ex);
                                       const cpu_routed r = cpu_route_rest(cfg, g, true, 1, 1, ex);
                                       if (!g.st || !r.st) st.SkipWithError("routing failed");
                                       benchmark::DoNotOptimize(r.dispatch.slot.data());
                                       st.SetIterationTime((g.us + r.us) * 1e-6);
                                     }
                                     set_ns_per_logit(st, T, m.experts);
                                   })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2)
          ->UseManualTime();
    }
}

/// The logit gradient (routing, aux and z terms) of each model's routing with capacity 1.25, on
/// the batch gating and dispatch made; the same inputs for every run.
void register_gating_backward() {
  const std::int64_t T = 16384;
  for (const model_shape& m : model_shapes)
    for (const int threads : {1, 0}) {
      const std::string name = "cpu_gating_backward/" + std::string(m.name) +
                               "/T=" + std::to_string(T) + threads_name(threads);
      benchmark::RegisterBenchmark(
          name.c_str(),
          [m, T, threads](benchmark::State& st) {
            routing_config cfg = m.capacity_config(1.25);
            if (cfg.loss.aux_coefficient == 0.0f) cfg.loss.aux_coefficient = 0.01f;
            if (cfg.loss.z_coefficient == 0.0f) cfg.loss.z_coefficient = 0.001f;
            const auto logits =
                make_logits(scenario_kind::uniform, T, m.experts, scenario_params{});
            const std::vector<float> bias(cfg.gating.expert_bias ? m.experts : 0, 0.0f);
            const cpu_gated g = cpu_gate(cfg, logits, T, bias, 1, cpu::executor::serial());
            const cpu_routed r = cpu_route_rest(cfg, g, true, 1, 1, cpu::executor::serial());
            std::vector<float> dw(static_cast<std::size_t>(T * m.top_k));
            for (std::size_t i = 0; i < dw.size(); ++i)
              dw[i] = static_cast<float>(static_cast<int>(i % 7) - 3) * 0.125f;
            std::vector<float> out(static_cast<std::size_t>(T * m.experts));
            gating_backward_params<float> p;
            p.d_logits = logits.data();
            p.tokens = T;
            p.gated = g.view();
            p.dispatched.d_fate = r.dispatch.fates.data();
            p.d_grad_weight = dw.data();
            p.accumulate = false;
            p.d_grad_logits = out.data();
            const cpu::executor ex = executor_for(threads);
            for (auto _ : st) {
              if (auto s = cpu::gating_backward(cfg, p, ex); !s)
                st.SkipWithError(s.message.c_str());
              benchmark::DoNotOptimize(out.data());
            }
            set_ns_per_logit(st, T, m.experts);
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2)
          ->UseRealTime();
    }
}

/// A routed batch and its layout, for the row operations.
struct routed_rows {
  routing_config cfg;
  std::int64_t T = 0, d = 0, rows = 0, used_rows = 0;
  reference::dispatch_output dsp;
  reference::layout_output L;
  dispatch_totals totals{};
  aligned_vector<bf16_bits> x, buf, y, grad;  // 64-byte aligned, as an engine's tensors
  const_dispatch_result dview() const { return reference::view(dsp, totals); }
  const_layout_result lview() const { return reference::view(L); }
};

routed_rows make_rows(const model_shape& m, std::int64_t T, std::int64_t d) {
  routed_rows r;
  r.cfg = m.capacity_config(1.25);
  r.T = T;
  r.d = d;
  const auto logits = make_logits(scenario_kind::uniform, T, m.experts, scenario_params{});
  const std::vector<float> bias(r.cfg.gating.expert_bias ? m.experts : 0, 0.0f);
  const auto g = reference::gating<float>(r.cfg, logits, T, bias);
  r.dsp = reference::dispatch(r.cfg, g);
  r.totals = r.dsp.totals();
  r.L = reference::layout(r.cfg, r.dsp, layout_kind::padded);
  r.rows = r.L.num_rows;
  for (std::int32_t t : r.L.row_token) r.used_rows += t >= 0 ? 1 : 0;
  r.x.assign(static_cast<std::size_t>(T * d), from_float<bf16_bits>(0.5f));
  r.buf.assign(static_cast<std::size_t>(r.rows * d), from_float<bf16_bits>(0.25f));
  r.y.assign(static_cast<std::size_t>(T * d), bf16_bits{});
  r.grad.assign(static_cast<std::size_t>(std::max(r.rows, T) * d), bf16_bits{});
  return r;
}

void register_rows() {
  const std::int64_t T = 4096, d = 2048;
  for (const model_shape& m : model_shapes) {
    if (m.top_k > 2 && m.experts > 128) continue;  // the DeepSeek-V3 buffer: 1.1 GB, skipped
    const std::string sfx = shape_suffix(m, T) + "/d=" + std::to_string(d);
    const routed_rows probe = make_rows(m, T, 1);
    const double el = sizeof(bf16_bits);
    // bytes each op must move at the least (reads + writes of live rows / tokens)
    const double permute_bytes = 2.0 * static_cast<double>(probe.rows) * d * el;
    const double combine_bytes = static_cast<double>(probe.used_rows + T) * d * el;
    const double combine_bwd_bytes =
        static_cast<double>(probe.rows + 2 * probe.used_rows + T) * d * el;
    const double permute_bwd_bytes = static_cast<double>(probe.used_rows + T) * d * el;
    for (const double b : {permute_bytes, combine_bytes, combine_bwd_bytes, permute_bwd_bytes})
      register_memcpy(static_cast<std::int64_t>(b));
    for (const int threads : {1, 0}) {
      const cpu::executor ex = executor_for(threads);
      benchmark::RegisterBenchmark(("cpu_permute_bf16" + sfx + threads_name(threads)).c_str(),
                                   [m, T, d, ex, permute_bytes](benchmark::State& st) {
                                     routed_rows r = make_rows(m, T, d);
                                     const permute_params<bf16_bits> p{
                                         r.x.data(), T, d, r.lview(), r.rows, r.buf.data()};
                                     for (auto _ : st) {
                                       if (auto s = cpu::permute(r.cfg, p, ex); !s)
                                         st.SkipWithError(s.message.c_str());
                                       benchmark::ClobberMemory();
                                     }
                                     set_rate(st, T, permute_bytes);
                                   })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("cpu_combine_bf16" + sfx + threads_name(threads)).c_str(),
                                   [m, T, d, ex, combine_bytes](benchmark::State& st) {
                                     routed_rows r = make_rows(m, T, d);
                                     const combine_params<bf16_bits> p{
                                         r.buf.data(), r.rows,    T,          d,
                                         r.lview(),    r.dview(), r.x.data(), r.y.data()};
                                     for (auto _ : st) {
                                       if (auto s = cpu::combine(r.cfg, p, ex); !s)
                                         st.SkipWithError(s.message.c_str());
                                       benchmark::ClobberMemory();
                                     }
                                     set_rate(st, T, combine_bytes);
                                   })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2)
          ->UseRealTime();
      benchmark::RegisterBenchmark(
          ("cpu_combine_backward_bf16" + sfx + threads_name(threads)).c_str(),
          [m, T, d, ex, combine_bwd_bytes](benchmark::State& st) {
            routed_rows r = make_rows(m, T, d);
            std::vector<float> dw(static_cast<std::size_t>(T * m.top_k));
            const combine_backward_params<bf16_bits> p{
                r.buf.data(), r.y.data(), r.rows,        T,         d,
                r.lview(),    r.dview(),  r.grad.data(), dw.data(), nullptr};
            for (auto _ : st) {
              if (auto s = cpu::combine_backward(r.cfg, p, ex); !s)
                st.SkipWithError(s.message.c_str());
              benchmark::ClobberMemory();
            }
            set_rate(st, T, combine_bwd_bytes);
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2)
          ->UseRealTime();
      benchmark::RegisterBenchmark(
          ("cpu_permute_backward_bf16" + sfx + threads_name(threads)).c_str(),
          [m, T, d, ex, permute_bwd_bytes](benchmark::State& st) {
            routed_rows r = make_rows(m, T, d);
            const permute_backward_params<bf16_bits> p{r.buf.data(), r.rows, T,         d,
                                                       r.lview(),    false,  r.y.data()};
            for (auto _ : st) {
              if (auto s = cpu::permute_backward(r.cfg, p, ex); !s)
                st.SkipWithError(s.message.c_str());
              benchmark::ClobberMemory();
            }
            set_rate(st, T, permute_bwd_bytes);
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2)
          ->UseRealTime();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_gating();
  register_dispatch();
  register_routing_call();
  register_gating_backward();
  register_rows();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("moeroute", "CPU backend beside the reference and memcpy, same run");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
