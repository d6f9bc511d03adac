// SPDX-License-Identifier: Apache-2.0
// Google Benchmark of every CPU reference stage over the shapes of real models (shapes.hpp):
// gate, dispatch, padded and compact layouts, permute, combine, losses, and the backward passes
// (logit gradients, combine backward, permute backward). Each case reports bytes and items
// (tokens) per second. JSON with --benchmark_out=FILE --benchmark_out_format=json.
//
// These time the *reference* (plain loop nests written to be obviously correct), which is
// what the CUDA kernels are checked against — not a tuned CPU implementation.
#include <cstdint>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <moeroute/reference.hpp>

#include <moeroute/planner/scenarios.hpp>

#include "shapes.hpp"

namespace {

using namespace moeroute;
using namespace moeroute::bench;
using namespace moeroute::planner;

struct prepared {
  routing_config cfg;
  std::vector<float> logits;
  std::vector<float> bias;
  reference::gating_output gating;
  reference::dispatch_output dispatch;
};

prepared prepare(const model_shape& m, std::int64_t T, const routing_config& cfg) {
  prepared p;
  p.cfg = cfg;
  p.logits = make_logits(scenario_kind::uniform, T, m.experts, scenario_params{});
  if (cfg.gating.expert_bias) p.bias.assign(m.experts, 0.0f);
  p.gating = reference::gating<float>(cfg, p.logits, T, p.bias);
  p.dispatch = reference::dispatch(cfg, p.gating);
  return p;
}

/// n deterministic upstream gradients in [-0.5, 0.5) (d_weight for the logit-gradient case).
std::vector<float> grad_values(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<float>(s >> 40) / 16777216.0f - 0.5f;
  }
  return v;
}

/// Rows of the layout that hold a token (the rows the backward kernels read or gather into).
std::int64_t live_rows(const reference::layout_output& L) {
  std::int64_t n = 0;
  for (std::int32_t t : L.row_token) n += t >= 0 ? 1 : 0;
  return n;
}

void set_counters(benchmark::State& st, std::int64_t T, double bytes_per_iter) {
  st.SetItemsProcessed(st.iterations() * T);
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations() * bytes_per_iter));
}

void register_all() {
  for (const model_shape& m : model_shapes) {
    const std::string model(m.name);
    const std::int64_t E = m.experts, k = m.top_k;
    for (std::int64_t T : cpu_token_counts) {
      const std::string sfx = "/" + model + "/T=" + std::to_string(T);

      // gate: read T*E fp32 logits, write [T,k] ids + gates (+ logsumexp)
      benchmark::RegisterBenchmark(
          ("gating" + sfx).c_str(),
          [m, T](benchmark::State& st) {
            const routing_config cfg = m.config();
            const auto logits =
                make_logits(scenario_kind::uniform, T, m.experts, scenario_params{});
            const std::vector<float> bias(cfg.gating.expert_bias ? m.experts : 0, 0.0f);
            for (auto _ : st) {
              auto g = reference::gating<float>(cfg, logits, T, bias);
              benchmark::DoNotOptimize(g.ids.data());
            }
            set_counters(st, T, T * (m.experts * 4.0 + m.top_k * 8.0 + 4.0));
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.05);

      // dispatch (capacity factor 1.25): read [T,k] ids + gates, write expert/slot/weight/fate
      benchmark::RegisterBenchmark(("dispatch_cf1.25" + sfx).c_str(),
                                   [m, T, E, k](benchmark::State& st) {
                                     const auto p = prepare(m, T, m.capacity_config());
                                     for (auto _ : st) {
                                       auto d = reference::dispatch(p.cfg, p.gating);
                                       benchmark::DoNotOptimize(d.slot.data());
                                     }
                                     set_counters(st, T, T * k * (8.0 + 13.0) + E * 48.0);
                                   })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.05);

      // layouts: read [T,k] expert + slot, write row_token [rows] + assignment_row [T,k]
      benchmark::RegisterBenchmark(("layout_padded" + sfx).c_str(),
                                   [m, T, k](benchmark::State& st) {
                                     const auto p = prepare(m, T, m.capacity_config());
                                     std::int64_t rows = 0;
                                     for (auto _ : st) {
                                       auto L = reference::layout(p.cfg, p.dispatch,
                                                                  layout_kind::padded);
                                       rows = L.num_rows;
                                       benchmark::DoNotOptimize(L.row_token.data());
                                     }
                                     set_counters(st, T, T * k * 16.0 + rows * 4.0);
                                   })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.05);
      benchmark::RegisterBenchmark(("layout_compact_b16" + sfx).c_str(),
                                   [m, T, k](benchmark::State& st) {
                                     const auto p = prepare(m, T, m.config());
                                     std::int64_t rows = 0;
                                     for (auto _ : st) {
                                       auto L = reference::layout(p.cfg, p.dispatch,
                                                                  layout_kind::compact, 16);
                                       rows = L.num_rows;
                                       benchmark::DoNotOptimize(L.row_token.data());
                                     }
                                     set_counters(st, T, T * k * 16.0 + rows * 8.0);
                                   })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.05);

      // losses: aux (batch), sequence aux, z-loss from the gating sums
      benchmark::RegisterBenchmark(("losses" + sfx).c_str(),
                                   [m, T, E](benchmark::State& st) {
                                     const auto p = prepare(m, T, m.config());
                                     for (auto _ : st) {
                                       auto a = reference::aux_loss(p.cfg, p.gating);
                                       auto z = reference::z_loss(p.cfg, p.gating);
                                       benchmark::DoNotOptimize(a.value);
                                       benchmark::DoNotOptimize(z.value);
                                     }
                                     set_counters(st, T, E * 16.0 + T * 5.0);
                                   })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.05);

      // backward, router logits (gating_backward: routing + aux + z terms): read T*E fp32
      // logits, [T,k] ids + fates + d_weight, E aux counts; read and write T*E fp32 d_logits
      benchmark::RegisterBenchmark(("gating_backward" + sfx).c_str(),
                                   [m, T, E, k](benchmark::State& st) {
                                     const auto p = prepare(m, T, m.config());
                                     const auto dw = grad_values(T * k, 1);
                                     std::vector<float> dl(static_cast<std::size_t>(T * E), 0.0f);
                                     for (auto _ : st) {
                                       reference::gating_backward<float>(p.cfg, p.logits, p.gating,
                                                                         p.dispatch, dw, dl);
                                       benchmark::DoNotOptimize(dl.data());
                                       benchmark::ClobberMemory();
                                     }
                                     set_counters(st, T, T * (E * 12.0 + k * 9.0) + E * 8.0);
                                   })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.05);
    }

    // permute / combine: bf16 hidden states, compact layout of the model's dropless routing
    for (std::int64_t T : cpu_data_token_counts) {
      const std::string sfx =
          "/" + model + "/T=" + std::to_string(T) + "/d=" + std::to_string(m.hidden);
      benchmark::RegisterBenchmark(
          ("permute_bf16" + sfx).c_str(),
          [m, T](benchmark::State& st) {
            const auto p = prepare(m, T, m.config());
            const auto L = reference::layout(p.cfg, p.dispatch, layout_kind::compact, 1);
            const std::int64_t d = m.hidden;
            std::vector<bf16_bits> x(static_cast<std::size_t>(T * d), to_bf16(0.5f));
            std::vector<bf16_bits> out(static_cast<std::size_t>(L.num_rows * d));
            for (auto _ : st) {
              reference::permute<bf16_bits>(p.cfg, L, x, T, d, out);
              benchmark::DoNotOptimize(out.data());
              benchmark::ClobberMemory();
            }
            set_counters(st, T, 2.0 * L.num_rows * d * 2.0);
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.05);
      benchmark::RegisterBenchmark(
          ("combine_bf16" + sfx).c_str(),
          [m, T](benchmark::State& st) {
            const auto p = prepare(m, T, m.config());
            const auto L = reference::layout(p.cfg, p.dispatch, layout_kind::compact, 1);
            const std::int64_t d = m.hidden;
            std::vector<bf16_bits> eo(static_cast<std::size_t>(L.num_rows * d), to_bf16(0.25f));
            std::vector<bf16_bits> x(static_cast<std::size_t>(T * d), to_bf16(0.5f));
            std::vector<bf16_bits> y(static_cast<std::size_t>(T * d));
            for (auto _ : st) {
              reference::combine<bf16_bits>(p.cfg, L, p.dispatch, eo, d, x, y);
              benchmark::DoNotOptimize(y.data());
              benchmark::ClobberMemory();
            }
            set_counters(st, T, (L.num_rows * d + T * d) * 2.0);
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.05);

      // backward of combine (bf16, compact layout of the dropless routing): gather dy [T,d] into
      // every live row and write d_expert_out [rows,d]; per token read dy and the live expert
      // rows, write d_weight [T,k] fp32 and the residual d_x [T,d]; [T,k] weights, fates, rows
      benchmark::RegisterBenchmark(
          ("backward_combine_bf16" + sfx).c_str(),
          [m, T, k](benchmark::State& st) {
            const auto p = prepare(m, T, m.config());
            const auto L = reference::layout(p.cfg, p.dispatch, layout_kind::compact, 1);
            const std::int64_t d = m.hidden;
            const std::int64_t live = live_rows(L);
            std::vector<bf16_bits> eo(static_cast<std::size_t>(L.num_rows * d), to_bf16(0.25f));
            std::vector<bf16_bits> dy(static_cast<std::size_t>(T * d), to_bf16(0.5f));
            std::vector<bf16_bits> deo(eo.size()), dx(dy.size());
            std::vector<float> dw(static_cast<std::size_t>(T * k));
            for (auto _ : st) {
              reference::combine_backward<bf16_bits>(p.cfg, L, p.dispatch, eo, d, dy, deo, dw, dx);
              benchmark::DoNotOptimize(deo.data());
              benchmark::DoNotOptimize(dw.data());
              benchmark::ClobberMemory();
            }
            set_counters(st, T,
                         (live * d + L.num_rows * d) * 2.0 + L.num_rows * 4.0 +
                             (T * d + live * d + T * d) * 2.0 + T * k * (8.0 + 4.0 + 1.0 + 4.0));
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.05);
      // backward of permute (bf16): per token sum its live rows of d_buf [rows,d] into d_x [T,d]
      benchmark::RegisterBenchmark(
          ("backward_permute_bf16" + sfx).c_str(),
          [m, T, k](benchmark::State& st) {
            const auto p = prepare(m, T, m.config());
            const auto L = reference::layout(p.cfg, p.dispatch, layout_kind::compact, 1);
            const std::int64_t d = m.hidden;
            const std::int64_t live = live_rows(L);
            std::vector<bf16_bits> dbuf(static_cast<std::size_t>(L.num_rows * d), to_bf16(0.25f));
            std::vector<bf16_bits> dx(static_cast<std::size_t>(T * d));
            for (auto _ : st) {
              reference::permute_backward<bf16_bits>(p.cfg, L, p.dispatch, dbuf, d, dx);
              benchmark::DoNotOptimize(dx.data());
              benchmark::ClobberMemory();
            }
            set_counters(st, T, (live * d + T * d) * 2.0 + T * k * 8.0);
          })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.05);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("moeroute", "CPU reference stages (plain loops, not tuned kernels)");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
