// SPDX-License-Identifier: Apache-2.0
// Google Benchmark of the CPU backend (include/moeroute/cpu/) beside the reference it must
// agree with, measured in the same run: gating over the model shapes of shapes.hpp at
// T = 4096 and 16384, one thread and every thread, with ns per logit and the speed-up over
// reference::gating; plus a memcpy of the logits, the machine's bandwidth baseline.
// Built with -march=native (MOEROUTE_BENCH_NATIVE) and OpenMP when available.
// JSON with --benchmark_out=FILE --benchmark_out_format=json.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <moeroute/cpu/gating.hpp>
#include <moeroute/reference/gating.hpp>

#include "scenarios.hpp"
#include "shapes.hpp"

namespace {

using namespace moeroute;
using namespace moeroute::bench;

/// Host buffers for one cpu::gating call of T tokens.
struct gating_buffers {
  std::vector<std::int32_t> ids, reroute;
  std::vector<float> gates, lse, priority;
  std::vector<std::uint8_t> skipped;
  std::vector<double> aux_sum, seq_sum;
  std::vector<std::int64_t> aux_count, seq_count, seq_tokens;
  std::int64_t valid_tokens = 0, nonfinite = 0;
  double z = 0.0;
  std::vector<unsigned char> workspace;
  gating_params<float> p;

  gating_buffers(const routing_config& cfg, const std::vector<float>& logits,
                 const std::vector<float>& bias, std::int64_t T) {
    const std::size_t t = static_cast<std::size_t>(T), k = static_cast<std::size_t>(cfg.top_k),
                      E = static_cast<std::size_t>(cfg.num_experts);
    const std::size_t S =
        cfg.loss.sequence_length > 0 ? static_cast<std::size_t>(T / cfg.loss.sequence_length) : 0;
    ids.resize(t * k);
    gates.resize(t * k);
    reroute.resize(t * static_cast<std::size_t>(cfg.candidates_per_token() - cfg.top_k));
    lse.resize(t);
    priority.resize(t);
    skipped.resize(t);
    aux_sum.resize(E);
    aux_count.resize(E);
    seq_sum.resize(S * E);
    seq_count.resize(S * E);
    seq_tokens.resize(S);
    workspace.resize(cpu::gating_workspace_bytes(cfg, T));
    p.d_logits = logits.data();
    p.tokens = T;
    p.d_bias = bias.empty() ? nullptr : bias.data();
    p.out = {ids.data(),
             gates.data(),
             reroute.data(),
             lse.data(),
             {aux_sum.data(), aux_count.data(), &valid_tokens, &z, &nonfinite, seq_sum.data(),
              seq_count.data(), seq_tokens.data()},
             priority.data(),
             skipped.data()};
  }
};

void set_counters(benchmark::State& st, std::int64_t T, std::int64_t E, double bytes_per_iter) {
  st.SetItemsProcessed(st.iterations() * T);
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations() * bytes_per_iter));
  st.counters["ns_per_logit"] =
      benchmark::Counter(static_cast<double>(st.iterations() * T * E),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void register_all() {
  for (const std::int64_t T : {std::int64_t{4096}, std::int64_t{16384}}) {
    for (const model_shape& m : model_shapes) {
      const std::string sfx = "/" + std::string(m.name) + "/T=" + std::to_string(T);
      const double bytes = static_cast<double>(T) * (m.experts * 4.0 + m.top_k * 8.0 + 4.0);
      for (const int threads : {1, 0}) {
        const std::string name =
            "cpu_gating" + sfx + (threads == 1 ? "/threads=1" : "/threads=all");
        benchmark::RegisterBenchmark(
            name.c_str(),
            [m, T, threads, bytes](benchmark::State& st) {
              const routing_config cfg = m.config();
              const auto logits =
                  make_logits(scenario_kind::uniform, T, m.experts, scenario_params{});
              const std::vector<float> bias(cfg.gating.expert_bias ? m.experts : 0, 0.0f);
              gating_buffers b(cfg, logits, bias, T);
              const cpu::executor ex = threads == 1 ? cpu::executor::serial() : cpu::executor{};
              for (auto _ : st) {
                const status s = cpu::gating(cfg, b.p, b.workspace.data(), b.workspace.size(), ex);
                if (!s) st.SkipWithError(s.message.c_str());
                benchmark::DoNotOptimize(b.ids.data());
              }
              set_counters(st, T, m.experts, bytes);
            })
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.2)
            ->UseRealTime();
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
            set_counters(st, T, m.experts, bytes);
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2);
      // the baseline: copying the logits once (read + write), single thread
      benchmark::RegisterBenchmark(
          ("memcpy_logits" + sfx).c_str(),
          [m, T](benchmark::State& st) {
            const std::size_t n = static_cast<std::size_t>(T * m.experts);
            std::vector<float> src(n, 1.0f), dst(n);
            for (auto _ : st) {
              std::memcpy(dst.data(), src.data(), n * sizeof(float));
              benchmark::DoNotOptimize(dst.data());
              benchmark::ClobberMemory();
            }
            st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations() * n * sizeof(float)));
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("moeroute", "CPU backend beside the reference, same run");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
