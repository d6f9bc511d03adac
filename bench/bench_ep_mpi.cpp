// SPDX-License-Identifier: Apache-2.0
// Expert-parallel dispatch + combine on CPU processes over MPI, for Mixtral- and DeepSeek-V3-
// sized layers (bf16), beside the raw MPI_Alltoallv of the same bytes and a memcpy of the same
// payload measured in the same run. Run under mpiexec (R = 2 and 4 in bench/run_all.sh).
//
// Every benchmark is collective, so the iteration count is fixed (Google Benchmark must not
// pick a different count on each rank) and each iteration's time is the slowest rank's
// (UseManualTime after an MPI_Allreduce MAX). Rank 0 reports; the summary line gives
//   ratio = t(dispatch + combine) / (t(raw alltoallv both ways) + t(memcpy of the payload)),
// the goal being <= 1.5.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <moeroute/ep.hpp>
#include <moeroute/ep/mpi.hpp>
#include <moeroute/reference.hpp>

#include "aligned.hpp"
#include "shapes.hpp"

namespace {

namespace ep = moeroute::ep;
using moeroute::bf16_bits;

struct layer {
  std::string name;
  ep::plan plan;
  // 64-byte aligned, as an engine's tensors are (the row kernels stream a large aligned output)
  moeroute::bench::aligned_vector<bf16_bits> x, received, returned, y;
  moeroute::bench::aligned_vector<std::byte> ws;
  std::int64_t d = 0;
};

ep::mpi_transport* g_transport = nullptr;
std::map<std::string, layer> g_layers;
std::map<std::string, double> g_seconds;  // mean seconds per iteration, by benchmark name

/// One layer of a model shape: T tokens on every rank, routed from seeded logits, global scope.
layer& layer_for(const moeroute::bench::model_shape& m, std::int64_t tokens,
                 bool check_ranks = true) {
  const std::string key = std::string(m.name) + (check_ranks ? "" : "/unchecked");
  if (auto it = g_layers.find(key); it != g_layers.end()) return it->second;
  ep::transport& t = *g_transport;
  moeroute::routing_config cfg = m.capacity_config(1.25);
  cfg.gating.group_limit = {};  // the bias-free layer; the exchange does not depend on gating
  cfg.gating.expert_bias = false;
  ep::options opt;
  opt.scope = ep::capacity_scope::global;
  opt.check_ranks = check_ranks;
  const auto place = ep::placement::contiguous(m.experts, t.ranks());
  std::vector<float> logits(tokens * m.experts);
  std::uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(t.rank() + 1);
  for (auto& v : logits) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<std::int64_t>(s >> 40) % 2000) / 500.0f;
  }
  const auto g = moeroute::reference::gating(cfg, logits, tokens);
  layer L;
  L.name = key;
  L.d = m.hidden;
  L.plan = ep::make_plan(t, cfg, place, opt, ep::local_dispatch(cfg, place, opt, t.rank(), g),
                         m.hidden, sizeof(bf16_bits));
  L.x.assign(tokens * m.hidden, bf16_bits{0x3f80});
  L.received.resize(L.plan.receive_rows * m.hidden);
  L.returned.resize(L.plan.send_total() * m.hidden);
  L.y.resize(tokens * m.hidden);
  L.ws.resize(ep::workspace_bytes(L.plan));
  layer& stored = g_layers.emplace(key, std::move(L)).first->second;
  // one untimed call: every buffer's pages mapped and MPI's connections made before timing
  ep::dispatch<bf16_bits>(t, stored.plan, stored.x, stored.received, stored.ws);
  ep::combine<bf16_bits>(t, stored.plan, stored.received, stored.x, stored.returned, stored.y,
                         stored.ws);
  return stored;
}

/// Times fn collectively: barrier, run, the slowest rank's seconds.
template <class F>
double collective_seconds(F&& fn) {
  MPI_Barrier(g_transport->comm());
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), mx = 0;
  MPI_Allreduce(&s, &mx, 1, MPI_DOUBLE, MPI_MAX, g_transport->comm());
  return mx;
}

/// Payload bytes this rank moves per layer: its rows out and back.
std::int64_t payload_bytes(const layer& L) {
  return 2 * L.plan.send_total() * L.d * static_cast<std::int64_t>(sizeof(bf16_bits));
}

void record(benchmark::State& state, const std::string& name, double total, const layer& L) {
  g_seconds[name] = total / static_cast<double>(state.iterations());
  state.SetBytesProcessed(state.iterations() * payload_bytes(L));
  state.counters["rows_sent"] = static_cast<double>(L.plan.send_total());
  state.counters["rows_recv"] = static_cast<double>(L.plan.recv_total());
  state.counters["hotspot"] = L.plan.hotspot();
}

void bm_ep(benchmark::State& state, moeroute::bench::model_shape m, std::int64_t tokens,
           bool check_ranks) {
  layer& L = layer_for(m, tokens, check_ranks);
  double total = 0;
  for (auto _ : state) {
    const double s = collective_seconds([&] {
      ep::dispatch<bf16_bits>(*g_transport, L.plan, L.x, L.received, L.ws);
      ep::combine<bf16_bits>(*g_transport, L.plan, L.received, L.x, L.returned, L.y, L.ws);
    });
    state.SetIterationTime(s);
    total += s;
  }
  record(state, "ep/" + L.name, total, L);  // L.name ends in /unchecked without validation
}

void bm_raw(benchmark::State& state, moeroute::bench::model_shape m, std::int64_t tokens) {
  layer& L = layer_for(m, tokens);
  const auto& p = L.plan;
  const std::size_t row = static_cast<std::size_t>(L.d) * sizeof(bf16_bits);
  std::vector<std::byte> send(p.send_total() * row), recv(p.recv_total() * row);
  double total = 0;
  for (auto _ : state) {
    const double s = collective_seconds([&] {
      g_transport->alltoallv(send.data(), p.send_rows, p.send_offsets, recv.data(), p.recv_rows,
                             p.recv_offsets, row);
      g_transport->alltoallv(recv.data(), p.recv_rows, p.recv_offsets, send.data(), p.send_rows,
                             p.send_offsets, row);
    });
    state.SetIterationTime(s);
    total += s;
  }
  record(state, "raw/" + L.name, total, L);
}

void bm_memcpy(benchmark::State& state, moeroute::bench::model_shape m, std::int64_t tokens) {
  layer& L = layer_for(m, tokens);
  const std::size_t bytes = static_cast<std::size_t>(L.plan.send_total() * L.d) * sizeof(bf16_bits);
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes);
  double total = 0;
  for (auto _ : state) {
    const double s = collective_seconds([&] {
      std::memcpy(b.data(), a.data(), bytes);
      benchmark::DoNotOptimize(b.data());
    });
    state.SetIterationTime(s);
    total += s;
  }
  record(state, "memcpy/" + L.name, total, L);
}

/// Ranks other than 0 run every benchmark too (they are collective) but print nothing.
class silent_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  {
    ep::mpi_transport t(MPI_COMM_WORLD);
    g_transport = &t;
    rank = t.rank();
    benchmark::Initialize(&argc, argv);
    const std::pair<const char*, std::int64_t> cases[] = {{"mixtral_8x7b", 2048},
                                                          {"deepseek_v3", 512}};
    for (const auto& [name, tokens] : cases)
      for (const auto& m : moeroute::bench::model_shapes) {
        if (m.name != name) continue;
        const std::string suffix = std::string(m.name) + "/T=" + std::to_string(tokens) +
                                   "/R=" + std::to_string(t.ranks());
        benchmark::RegisterBenchmark(("ep_dispatch_combine/" + suffix).c_str(), bm_ep, m, tokens,
                                     true)
            ->Iterations(30)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
        // the validation mode off: no agreement all-gather before each call
        benchmark::RegisterBenchmark(("ep_dispatch_combine_unchecked/" + suffix).c_str(), bm_ep, m,
                                     tokens, false)
            ->Iterations(30)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(("raw_alltoallv/" + suffix).c_str(), bm_raw, m, tokens)
            ->Iterations(30)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(("memcpy_payload/" + suffix).c_str(), bm_memcpy, m, tokens)
            ->Iterations(30)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
    // Every rank runs every benchmark (they are collective); only rank 0 reports.
    if (rank == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      silent_reporter silent;
      benchmark::RunSpecifiedBenchmarks(&silent);
    }
    if (rank == 0)
      for (const auto& [name, L] : g_layers) {
        if (name.find("/unchecked") != std::string::npos) continue;
        const double e = g_seconds["ep/" + name], u = g_seconds["ep/" + name + "/unchecked"],
                     r = g_seconds["raw/" + name], c = g_seconds["memcpy/" + name];
        std::printf(
            "summary %s R=%d: dispatch+combine %.3f ms (%.3f ms without the validation "
            "mode), raw alltoallv %.3f ms, memcpy %.3f ms, ratio %.2f (%.2f unchecked; "
            "goal <= 1.5), %.2f GB/s payload\n",
            name.c_str(), t.ranks(), 1e3 * e, 1e3 * u, 1e3 * r, 1e3 * c, e / (r + c), u / (r + c),
            static_cast<double>(payload_bytes(L)) / e / 1e9);
      }
    g_layers.clear();
  }
  MPI_Finalize();
  return 0;
}
