// SPDX-License-Identifier: Apache-2.0
// An MoE layer forward on the fast CPU backend (moeroute::cpu): the same params structs the
// CUDA launchers take, host pointers, caller-owned workspace, and an executor where a launcher
// takes its stream (OpenMP when built with -fopenmp, else serial).
//   router logits -> cpu::gating -> cpu::dispatch (capacity 1.25) -> cpu::layout (padded)
//   -> cpu::permute -> one tiny linear expert each -> cpu::combine, and cpu::losses
// The result is checked against the CPU reference of the same layer: the same experts and slots
// for every assignment, and the output within 1e-5 (the backend's exp rounds differently from
// libm's by an ulp, so gates and weights may differ in the last bit). Prints OK, or MISMATCH
// and exits 1.
//
//   g++ -std=c++20 -O3 -march=native -fopenmp -I include examples/cpu_backend.cpp
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <moeroute/cpu.hpp>
#include <moeroute/reference.hpp>

namespace mr = moeroute;

int main() {
  mr::presets::megatron_options mo;
  mo.capacity_factor = 1.25;  // Megatron-Core's routing with a capacity: some tokens drop
  const mr::routing_config cfg = mr::presets::megatron(/*experts=*/16, /*k=*/2, mo);
  const std::int64_t T = 512, D = 32;
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;
  std::vector<float> logits(T * E), x(T * D);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = float((i * 7919) % 97) / 24.0f;
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 31) % 17) / 8.0f - 1.0f;

  // [snippet:params-cpu]
  // gating: ids, gates and the loss sums, into buffers the caller owns
  std::vector<std::int32_t> ids(T * k);
  std::vector<float> gates(T * k), lse(T);
  std::vector<double> score_sum(E), z_sum(1);
  std::vector<std::int64_t> counts(E), valid_tokens(1);
  mr::gating_params<float> g;  // the struct cuda::gating takes, here with host pointers
  g.d_logits = logits.data();
  g.tokens = T;
  g.out.d_ids = ids.data();
  g.out.d_gates = gates.data();
  g.out.d_logsumexp = lse.data();
  g.out.sums = {score_sum.data(), counts.data(), valid_tokens.data(), z_sum.data()};
  std::vector<std::byte> ws(mr::cpu::gating_workspace_bytes(cfg, T));
  if (auto s = mr::cpu::gating(cfg, g, ws.data(), ws.size()); !s)
    return std::puts(s.message.c_str()), 1;

  // dispatch: a fate, expert, slot and weight per assignment; counts and totals
  std::vector<std::int32_t> expert(T * k), slot(T * k);
  std::vector<float> weight(T * k);
  std::vector<mr::fate> fates(T * k);
  std::vector<std::int64_t> requested(E), kept(E), rerouted(E), dropped(E), received(E), load(E);
  mr::dispatch_totals totals;
  mr::dispatch_params d;
  d.tokens = T;
  d.gated = g.out;
  d.out = {expert.data(),    slot.data(), weight.data(),   fates.data(),
           requested.data(), kept.data(), rerouted.data(), dropped.data(),
           received.data(),  load.data(), &totals};
  ws.resize(mr::cpu::dispatch_workspace_bytes(cfg, T));
  if (auto s = mr::cpu::dispatch(cfg, d, ws.data(), ws.size()); !s)
    return std::puts(s.message.c_str()), 1;

  // padded layout [E, C, D] -> permute -> experts -> combine
  const std::int64_t rows = mr::layout_max_rows(cfg, T, mr::layout_kind::padded);
  std::vector<std::int64_t> offsets(E + 1), row_of(T * k), num_rows(1);
  std::vector<std::int32_t> row_token(rows);
  mr::layout_params l;
  l.tokens = T;
  l.max_rows = rows;
  l.dispatched = d.out;
  l.out = {offsets.data(), nullptr, row_token.data(), row_of.data(), nullptr, num_rows.data()};
  if (auto s = mr::cpu::layout(cfg, l); !s) return std::puts(s.message.c_str()), 1;
  std::vector<float> buf(rows * D), y(T * D);
  if (auto s =
          mr::cpu::permute(cfg, mr::permute_params<float>{x.data(), T, D, l.out, rows, buf.data()});
      !s)
    return std::puts(s.message.c_str()), 1;
  for (std::int32_t e = 0; e < E; ++e)  // expert e: scale its rows by (1 + e / 8)
    for (std::int64_t r = offsets[e]; r < offsets[e + 1]; ++r)
      for (std::int64_t c = 0; c < D; ++c) buf[r * D + c] *= 1.0f + float(e) / 8.0f;
  if (auto s = mr::cpu::combine(
          cfg, mr::combine_params<float>{buf.data(), rows, T, D, l.out, d.out, x.data(), y.data()});
      !s)
    return std::puts(s.message.c_str()), 1;
  // [/snippet]

  double aux = 0.0, z = 0.0;
  mr::loss_params lp;
  lp.tokens = T;
  lp.sums = g.out.sums;
  lp.d_aux_loss = &aux;
  lp.d_z_loss = &z;
  if (auto s = mr::cpu::losses(cfg, lp); !s) return std::puts(s.message.c_str()), 1;

  // the same layer on the reference
  const auto r = mr::reference::route<float>(cfg, logits, T);
  const auto L = mr::reference::layout(cfg, r.dispatch, mr::layout_kind::padded);
  std::vector<float> rbuf(L.num_rows * D), ry(T * D);
  mr::reference::permute<float>(cfg, L, x, T, D, rbuf);
  for (std::int32_t e = 0; e < E; ++e)
    for (std::int64_t row = L.offsets[e]; row < L.offsets[e + 1]; ++row)
      for (std::int64_t c = 0; c < D; ++c) rbuf[row * D + c] *= 1.0f + float(e) / 8.0f;
  mr::reference::combine<float>(cfg, L, r.dispatch, rbuf, D, x, ry);
  bool same = expert == r.dispatch.expert && slot == r.dispatch.slot &&
              totals.dropped == r.dispatch.total_dropped;
  for (std::size_t i = 0; i < y.size(); ++i)
    same = same && std::fabs(y[i] - ry[i]) <= 1e-5f * (1.0f + std::fabs(ry[i]));
  std::printf("C=%lld kept=%lld dropped=%lld aux=%.5f (reference %.5f) z=%.5f (reference %.5f)\n",
              (long long)totals.capacity, (long long)totals.kept, (long long)totals.dropped, aux,
              r.losses.aux.value, z, r.losses.z.value);
  std::puts(same ? "OK" : "MISMATCH");
  return same ? 0 : 1;
}
