// SPDX-License-Identifier: Apache-2.0
// moeroute's gating inside an engine with its own losses, and the sequence-level aux loss of
// a packed, context-parallel batch from per-sequence sums — on the CPU backend.
//   1. cpu::gating writes the optional per-token aux inputs (the score row P [T, E] and the
//      experts each token counts for [T, k]); the engine computes its own aux loss from them
//      (here Megatron's formula, written out) and gets cpu::losses' value.
//   2. a batch packed [sequence position, batch] as Megatron and TransformerEngine hold it, each
//      sequence split over two context-parallel ranks: each rank routes its half, the ranks add
//      their per-sequence sums (an all-reduce in a real run), and cpu::losses on the added sums
//      is the loss of the unsplit batch.
// Prints OK, or MISMATCH and exits 1.
//
//   g++ -std=c++20 -O3 -march=native -fopenmp -I include examples/own_losses.cpp
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <moeroute/cpu.hpp>
#include <moeroute/presets.hpp>

namespace mr = moeroute;

namespace {

/// Host buffers of one cpu::gating call, optionally with the per-token aux outputs.
struct routed {
  std::vector<std::int32_t> ids, count_ids;
  std::vector<float> gates, lse, aux_scores;
  std::vector<double> score_sum, z_sum, seq_score_sum;
  std::vector<std::int64_t> counts, valid_tokens, seq_counts, seq_tokens;
  mr::gating_params<float> p;

  routed(const mr::routing_config& cfg, const std::vector<float>& logits, std::int64_t T,
         bool per_token) {
    const std::int32_t E = cfg.num_experts, k = cfg.top_k;
    const std::int64_t S = cfg.loss.sequence_length > 0 ? T / cfg.loss.sequence_length : 0;
    ids.resize(T * k);
    gates.resize(T * k);
    lse.resize(T);
    score_sum.resize(E);
    counts.resize(E);
    valid_tokens.resize(1);
    z_sum.resize(1);
    seq_score_sum.resize(S * E);
    seq_counts.resize(S * E);
    seq_tokens.resize(S);
    p.d_logits = logits.data();
    p.tokens = T;
    p.out.d_ids = ids.data();
    p.out.d_gates = gates.data();
    p.out.d_logsumexp = lse.data();
    p.out.sums = {score_sum.data(), counts.data(),        valid_tokens.data(), z_sum.data(),
                  nullptr,          seq_score_sum.data(), seq_counts.data(),   seq_tokens.data()};
    if (per_token) {
      aux_scores.resize(T * E);
      count_ids.resize(T * k);
      p.out.d_aux_scores = aux_scores.data();
      p.out.d_aux_count_ids = count_ids.data();
    }
  }
  mr::status run(const mr::routing_config& cfg) {
    std::vector<std::byte> ws(mr::cpu::gating_workspace_bytes(cfg, p.tokens));
    return mr::cpu::gating(cfg, p, ws.data(), ws.size());
  }
};

bool close(double a, double b) { return std::fabs(a - b) <= 1e-12 * std::fabs(b) + 1e-300; }

}  // namespace

int main() {
  const std::int32_t E = 16, k = 2;
  const std::int64_t L = 64, B = 8, T = L * B;  // 8 sequences of 64 tokens
  std::vector<float> logits(T * E);
  for (std::size_t i = 0; i < logits.size(); ++i)
    logits[i] = std::sin(0.37f * float(i)) * 2.0f + (i % E == 3 ? 1.0f : 0.0f);
  bool ok = true;

  // [snippet:own-aux-loss]
  // 1. the engine's own aux loss from the per-token outputs
  const mr::routing_config cfg = mr::presets::megatron(E, k);  // fresh top-k counts, E/k scale
  routed r(cfg, logits, T, /*per_token=*/true);
  if (auto s = r.run(cfg); !s) return std::puts(s.message.c_str()), 1;
  // Megatron: E / (k T^2) * sum_e (sum_t P[t, e]) * tokens_per_expert[e], times the coefficient
  std::vector<double> p_sum(E, 0.0), tokens_per_expert(E, 0.0);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int32_t e = 0; e < E; ++e) p_sum[e] += r.aux_scores[t * E + e];
    for (std::int32_t j = 0; j < k; ++j) tokens_per_expert[r.count_ids[t * k + j]] += 1.0;
  }
  double own = 0.0;
  for (std::int32_t e = 0; e < E; ++e) own += p_sum[e] * tokens_per_expert[e];
  own *= cfg.loss.aux_coefficient * E / (double(k) * double(T) * double(T));
  // [/snippet]
  double aux = 0.0;
  mr::loss_params lp;
  lp.tokens = T;
  lp.sums = r.p.out.sums;
  lp.d_aux_loss = &aux;
  if (auto s = mr::cpu::losses(cfg, lp); !s) return std::puts(s.message.c_str()), 1;
  std::printf("aux loss: own %.15g, cpu::losses %.15g\n", own, aux);
  ok = ok && std::fabs(own - aux) <= 1e-9 * aux;

  // [snippet:packed-sharded]
  // 2. Megatron's sequence aux loss: tokens [L, B] (position-major), mean over sequences
  const mr::routing_config whole =
      mr::presets::with_sequence_aux(cfg, L, mr::presets::sequence_aux_peer::megatron);
  // context parallelism: rank r holds positions [r L/2, (r+1) L/2) of every sequence, still
  // [L/2, B]; it routes them with sequence_length L/2 and the ranks add their sums
  const mr::routing_config half =
      mr::presets::with_sequence_aux(cfg, L / 2, mr::presets::sequence_aux_peer::megatron);
  std::vector<double> seq_score(B * E, 0.0);
  std::vector<std::int64_t> seq_count(B * E, 0), seq_tokens(B, 0), valid(1, 0);
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<float> mine(logits.begin() + rank * (T / 2) * E,
                                  logits.begin() + (rank + 1) * (T / 2) * E);
    routed part(half, mine, T / 2, /*per_token=*/false);
    if (auto s = part.run(half); !s) return std::puts(s.message.c_str()), 1;
    for (std::int64_t i = 0; i < B * E; ++i) {  // all-reduce (sum) in a real run
      seq_score[i] += part.seq_score_sum[i];
      seq_count[i] += part.seq_counts[i];
    }
    for (std::int64_t b = 0; b < B; ++b) seq_tokens[b] += part.seq_tokens[b];
    valid[0] += part.valid_tokens[0];
  }
  double seq_aux_sharded = 0.0;
  mr::loss_params sp;
  sp.tokens = T;  // the tokens the added sums cover: S = T / L sequences
  sp.sums.d_valid_tokens = valid.data();
  sp.sums.d_seq_score_sum = seq_score.data();
  sp.sums.d_seq_count = seq_count.data();
  sp.sums.d_seq_tokens = seq_tokens.data();
  sp.d_sequence_aux_loss = &seq_aux_sharded;
  if (auto s = mr::cpu::losses(whole, sp); !s) return std::puts(s.message.c_str()), 1;
  // [/snippet]

  // the unsplit batch, routed at once
  routed all(whole, logits, T, false);
  if (auto s = all.run(whole); !s) return std::puts(s.message.c_str()), 1;
  double seq_aux = 0.0;
  mr::loss_params ap;
  ap.tokens = T;
  ap.sums = all.p.out.sums;
  ap.d_sequence_aux_loss = &seq_aux;
  if (auto s = mr::cpu::losses(whole, ap); !s) return std::puts(s.message.c_str()), 1;
  std::printf("sequence aux loss: two CP ranks %.15g, unsplit %.15g\n", seq_aux_sharded, seq_aux);
  ok = ok && seq_count == all.seq_counts && seq_tokens == all.seq_tokens &&
       close(seq_aux_sharded, seq_aux);
  std::puts(ok ? "OK" : "MISMATCH");
  return ok ? 0 : 1;
}
