// SPDX-License-Identifier: Apache-2.0
// moeroute inside an engine that routes by itself: the engine's own top-k expert ids and gates
// (here from a toy router; in practice a router GEMM epilogue) go straight to capacity
// assignment, the compact layout a grouped GEMM wants, permute and combine — no moeroute gating.
//   engine top-2 ids + gates -> cpu::dispatch (capacity factor 1.25) -> cpu::layout (compact,
//   blocks of 16 rows) -> cpu::permute -> one tiny linear expert each -> cpu::combine
// Checked against the reference on the same ids (reference::routing_from_ids: the same fates,
// experts and slots) and against the layer computed directly from the dispatch weights.
// Prints OK, or MISMATCH and exits 1.
//
//   g++ -std=c++20 -O3 -march=native -fopenmp -I include examples/external_ids.cpp
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <moeroute/cpu.hpp>
#include <moeroute/reference.hpp>

namespace mr = moeroute;

int main() {
  const std::int64_t T = 256, D = 16, block = 16;
  const std::int32_t E = 8, k = 2;
  // The engine's router: two distinct experts per token, a softmax over the two as gates
  // (expert 0 is popular, so capacity drops some of its assignments).
  std::vector<std::int32_t> ids(T * k);
  std::vector<float> gates(T * k), x(T * D);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int32_t first = t % 3 == 0 ? 0 : static_cast<std::int32_t>((t * 5) % E);
    const std::int32_t second = (first + 1 + static_cast<std::int32_t>(t % (E - 1))) % E;
    const float a = 1.0f + float(t % 7) / 7.0f, b = float(t % 5) / 5.0f;
    ids[t * k] = first;
    ids[t * k + 1] = second;
    gates[t * k] = 1.0f / (1.0f + std::exp(b - a));
    gates[t * k + 1] = 1.0f - gates[t * k];
  }
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 31) % 17) / 8.0f - 1.0f;

  // [snippet:external-ids]
  // The config says what moeroute decides: capacity and drop policy. Gating fields are not
  // read; the priority (score_per_expert: an expert keeps its largest gates) reads the gates.
  mr::routing_config cfg = mr::presets::megatron(E, k);
  cfg.capacity.mode = mr::capacity_mode::factor;
  cfg.capacity.factor = 1.25;

  // dispatch straight from the engine's arrays (validated: ids in [0, E) and distinct per
  // token, gates finite; an error names the element)
  std::vector<std::int32_t> expert(T * k), slot(T * k);
  std::vector<float> weight(T * k);
  std::vector<mr::fate> fates(T * k);
  std::vector<std::int64_t> requested(E), kept(E), rerouted(E), dropped(E), received(E), load(E);
  mr::dispatch_totals totals;
  mr::dispatch_params d;
  d.tokens = T;
  d.gated.d_ids = ids.data();      // [T, k] int32, the engine's top-k
  d.gated.d_gates = gates.data();  // [T, k] f32, its gates
  d.out = {expert.data(),    slot.data(), weight.data(),   fates.data(),
           requested.data(), kept.data(), rerouted.data(), dropped.data(),
           received.data(),  load.data(), &totals};
  std::vector<std::byte> ws(mr::cpu::dispatch_workspace_bytes(cfg, T));
  if (auto s = mr::cpu::dispatch(cfg, d, ws.data(), ws.size()); !s)
    return std::puts(s.message.c_str()), 1;

  // compact layout: experts packed, each segment a whole number of 16-row blocks, sized by
  // the tight bound; block_expert says which expert's weights each block multiplies
  const std::int64_t rows = mr::compact_max_rows(cfg, T, block);
  std::vector<std::int64_t> offsets(E + 1), row_of(T * k), num_rows(1);
  std::vector<std::int32_t> row_token(rows), block_expert(rows / block);
  mr::layout_params l;
  l.kind = mr::layout_kind::compact;
  l.block_size = block;
  l.tokens = T;
  l.max_rows = rows;
  l.dispatched = d.out;
  l.out = {offsets.data(),      nullptr,        row_token.data(), row_of.data(),
           block_expert.data(), num_rows.data()};
  if (auto s = mr::cpu::layout(cfg, l); !s) return std::puts(s.message.c_str()), 1;

  // permute -> the engine's experts, block by block -> combine
  std::vector<float> buf(rows * D), y(T * D);
  if (auto s =
          mr::cpu::permute(cfg, mr::permute_params<float>{x.data(), T, D, l.out, rows, buf.data()});
      !s)
    return std::puts(s.message.c_str()), 1;
  for (std::int64_t b = 0; b < num_rows[0] / block; ++b)  // expert e scales by (1 + e / 8)
    for (std::int64_t r = b * block; r < (b + 1) * block; ++r)
      for (std::int64_t c = 0; c < D; ++c) buf[r * D + c] *= 1.0f + float(block_expert[b]) / 8.0f;
  if (auto s = mr::cpu::combine(
          cfg, mr::combine_params<float>{buf.data(), rows, T, D, l.out, d.out, x.data(), y.data()});
      !s)
    return std::puts(s.message.c_str()), 1;
  // [/snippet]

  // the reference on the same ids decides the same fates, experts and slots
  const auto g = mr::reference::routing_from_ids(cfg, {ids, gates});
  const auto r = mr::reference::dispatch(cfg, g);
  bool same = expert == r.expert && slot == r.slot && fates == r.fates &&
              totals.dropped == r.total_dropped && totals.kept == r.total_kept;
  // and the layer is what the dispatch weights say: y = sum of weight * (1 + e / 8) * x
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < D; ++c) {
      float want = 0.0f;
      for (std::int32_t j = 0; j < k; ++j)
        if (expert[t * k + j] >= 0)
          want += weight[t * k + j] * (1.0f + float(expert[t * k + j]) / 8.0f) * x[t * D + c];
      same = same && std::fabs(y[t * D + c] - want) <= 1e-5f * (1.0f + std::fabs(want));
    }
  std::printf("C=%lld kept=%lld dropped=%lld rows=%lld of bound %lld (blocks of %lld)\n",
              (long long)totals.capacity, (long long)totals.kept, (long long)totals.dropped,
              (long long)num_rows[0], (long long)rows, (long long)block);
  std::puts(same ? "OK" : "MISMATCH");
  return same ? 0 : 1;
}
