// SPDX-License-Identifier: Apache-2.0
// The sequence-level aux loss as each peer lays out and reduces it (loss.sequence_order,
// loss.sequence_reduce, presets::with_sequence_aux), its form from per-sequence sums (sharded
// and packed batches), and the per-token aux outputs a caller computes its own loss from.
// The peers' formulas are transcribed here from their code, on their own tensor layouts.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include "../common/gating_compare.hpp"

using namespace moeroute;
namespace ref = moeroute::reference;
using test::grid_logits;

namespace {

/// Per-token P rows and counted ids of a gating, as a peer's tensors would hold them.
struct token_view {
  std::int64_t T;
  std::int32_t E, c;
  const std::vector<float>& P;               // [T, E]
  const std::vector<std::int32_t>& counted;  // [T, c]
};

/// The peers' per-sequence loss, transcribed, on their own tensor views: sequence b's
/// cost[e] = (its tokens counting e) / (L * k / E), its P = the mean over its L tokens, and
/// the loss sum_e cost * P, reduced over the B sequences.
/// - Megatron-Core (sequence_load_balancing_loss_func / _apply_seq_aux_loss): probs.view(L, B,
///   E), so token (s, b) is row s * B + b; (cost * probs.mean(0)).sum(1), summed over B (TE's
///   fused kernel on the [L, B * E] view) and divided by B for Megatron's mean.
/// - DeepSeek-V2 / V3 HF `seq_aux`: scores.view(bsz, seq_len, E), token (b, s) is row b * L + s;
///   (ce * scores.mean(1)).sum(1).mean() * alpha.
enum class view { seq_batch, batch_seq };
double peer_seq_aux(const token_view& v, view layout, std::int64_t L, std::int32_t k, double coeff,
                    bool mean) {
  const std::int64_t B = v.T / L;
  double total = 0.0;
  for (std::int64_t b = 0; b < B; ++b) {
    std::vector<double> cost(v.E, 0.0), pmean(v.E, 0.0);
    for (std::int64_t s = 0; s < L; ++s) {
      const std::int64_t t = layout == view::seq_batch ? s * B + b : b * L + s;
      for (std::int32_t j = 0; j < v.c; ++j) cost[v.counted[t * v.c + j]] += 1.0;
      for (std::int32_t e = 0; e < v.E; ++e) pmean[e] += v.P[t * v.E + e];
    }
    double row = 0.0;
    for (std::int32_t e = 0; e < v.E; ++e)
      row += cost[e] / (static_cast<double>(L) * k / v.E) * (pmean[e] / static_cast<double>(L));
    total += row;
  }
  return coeff * (mean ? total / static_cast<double>(B) : total);
}

/// [S, L] logits to [L, S]: token s * L + p moves to p * S + s.
std::vector<float> to_position_major(const std::vector<float>& x, std::int64_t S, std::int64_t L,
                                     std::int32_t E) {
  std::vector<float> y(x.size());
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t p = 0; p < L; ++p)
      for (std::int32_t e = 0; e < E; ++e) y[(p * S + s) * E + e] = x[(s * L + p) * E + e];
  return y;
}

}  // namespace

TEST_CASE("sequence aux: [L, S] packing is [S, L] packing transposed, bit for bit",
          "[reference][losses][sequence]") {
  const std::int64_t S = 5, L = 12, T = S * L;
  for (const std::int32_t E : {8, 60}) {
    const auto base = presets::megatron(E, 2);
    const auto sm = presets::with_sequence_aux(base, L, presets::sequence_aux_peer::deepseek);
    const auto pm = presets::with_sequence_aux(base, L, presets::sequence_aux_peer::megatron);
    REQUIRE(pm.loss.sequence_order == token_order::position_major);
    const auto x = grid_logits(T, E, 31);
    const auto a = ref::gating(sm, x, T);
    const auto b = ref::gating(pm, to_position_major(x, S, L, E), T);
    // the same tokens in each sequence, added in the same position order
    CHECK(a.seq_tokens == b.seq_tokens);
    CHECK(a.seq_count == b.seq_count);
    CHECK(a.seq_score_sum == b.seq_score_sum);
    CHECK(ref::sequence_aux_loss(sm, a) == ref::sequence_aux_loss(pm, b));
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t p = 0; p < L; ++p)
        for (std::int32_t j = 0; j < 2; ++j)
          REQUIRE(a.ids[(s * L + p) * 2 + j] == b.ids[(p * S + s) * 2 + j]);
    // position-major sums are not the sequence-major sums of the same buffer
    const auto c = ref::gating(sm, to_position_major(x, S, L, E), T);
    CHECK(c.seq_count != b.seq_count);
  }
}

TEST_CASE("sequence aux: each peer's convention reproduces its transcribed formula",
          "[reference][losses][sequence]") {
  const std::int64_t L = 16, B = 6, T = L * B;
  SECTION("Megatron-Core (mean) and TransformerEngine (sum) on [L, B]") {
    for (const std::int32_t E : {8, 64}) {
      presets::megatron_options o;
      o.score = E == 8 ? score_function::softmax : score_function::sigmoid;
      auto base = presets::megatron(E, 4, o);
      base.loss.aux_coefficient = 0.01f;
      const auto mg = presets::with_sequence_aux(base, L, presets::sequence_aux_peer::megatron);
      const auto te =
          presets::with_sequence_aux(base, L, presets::sequence_aux_peer::transformer_engine);
      const auto g = ref::gating(mg, grid_logits(T, E, 41), T);
      const token_view v{T, E, 4, g.aux_scores, g.aux_count_ids};
      INFO("E = " << E);
      CHECK(ref::sequence_aux_loss(mg, g) ==
            Approx(peer_seq_aux(v, view::seq_batch, L, 4, 0.01f, true)).epsilon(1e-12));
      // the routing does not depend on the reduction: the same gating serves both
      CHECK(ref::sequence_aux_loss(te, g) ==
            Approx(peer_seq_aux(v, view::seq_batch, L, 4, 0.01f, false)).epsilon(1e-12));
      CHECK(ref::sequence_aux_loss(te, g) ==
            Approx(static_cast<double>(B) * ref::sequence_aux_loss(mg, g)).epsilon(1e-12));
    }
  }
  SECTION("DeepSeek-V3 on [B, L]") {
    const auto c = presets::with_sequence_aux(presets::deepseek_v3(64, 8, 8, 4), L,
                                              presets::sequence_aux_peer::deepseek);
    const auto g = ref::gating(c, grid_logits(T, 64, 42), T, test::grid_bias(64));
    const token_view v{T, 64, 8, g.aux_scores, g.aux_count_ids};
    // DeepSeek counts the routed top-k (bias and group limit included): the routed ids
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int32_t j = 0; j < 8; ++j) REQUIRE(g.aux_count_ids[t * 8 + j] == g.ids[t * 8 + j]);
    CHECK(ref::sequence_aux_loss(c, g) ==
          Approx(peer_seq_aux(v, view::batch_seq, L, 8, 1e-4f, true)).epsilon(1e-12));
  }
}

TEST_CASE("sequence aux: sums of sharded sequences add up to the unsharded loss",
          "[reference][losses][sequence][sharding]") {
  const std::int32_t E = 16;
  const std::int64_t S = 4, L = 10, T = S * L;
  for (const auto peer :
       {presets::sequence_aux_peer::megatron, presets::sequence_aux_peer::transformer_engine}) {
    const auto whole = presets::with_sequence_aux(presets::megatron(E, 2), L, peer);
    const auto x = grid_logits(T, E, 51);  // [L, S]
    const auto g = ref::gating(whole, x, T);
    // context parallelism: rank r holds positions [r * L/2, (r + 1) * L/2) of every sequence,
    // still [L/2, S]; each routes its half with sequence_length L/2, then the sums add
    const auto half = presets::with_sequence_aux(presets::megatron(E, 2), L / 2, peer);
    std::vector<double> score(S * E, 0.0);
    std::vector<std::int64_t> count(S * E, 0), tokens(S, 0);
    for (int r = 0; r < 2; ++r) {
      const std::vector<float> xr(x.begin() + r * (T / 2) * E, x.begin() + (r + 1) * (T / 2) * E);
      const auto gr = ref::gating(half, xr, T / 2);
      REQUIRE(gr.sequences == S);
      for (std::int64_t i = 0; i < S * E; ++i) {
        score[i] += gr.seq_score_sum[i];
        count[i] += gr.seq_count[i];
      }
      for (std::int64_t s = 0; s < S; ++s) tokens[s] += gr.seq_tokens[s];
    }
    CHECK(count == g.seq_count);
    CHECK(tokens == g.seq_tokens);
    CHECK(ref::sequence_aux_loss_from_sums(whole, score, count, tokens) ==
          Approx(ref::sequence_aux_loss(whole, g)).epsilon(1e-12));
    // the gradient: each rank's backward on the added sums is the unsharded gradient's rows
    std::vector<double> want(T * E, 0.0);
    ref::sequence_aux_loss_backward<double>(whole, std::vector<double>(x.begin(), x.end()), g,
                                            want);
    for (int r = 0; r < 2; ++r) {
      const std::vector<float> xr(x.begin() + r * (T / 2) * E, x.begin() + (r + 1) * (T / 2) * E);
      auto gr = ref::gating(half, xr, T / 2);
      gr.seq_score_sum = score;  // the all-reduced sums
      gr.seq_count = count;
      gr.seq_tokens = tokens;
      std::vector<double> got((T / 2) * E, 0.0);
      ref::sequence_aux_loss_backward<double>(half, std::vector<double>(xr.begin(), xr.end()), gr,
                                              got);
      for (std::int64_t i = 0; i < (T / 2) * E; ++i)
        REQUIRE(got[i] == Approx(want[r * (T / 2) * E + i]).epsilon(1e-12).margin(1e-300));
    }
  }
  // data parallelism with the sum reduction: sequences on different ranks are separate terms
  const auto mean =
      presets::with_sequence_aux(presets::megatron(E, 2), L, presets::sequence_aux_peer::deepseek);
  auto sum = mean;
  sum.loss.sequence_reduce = sequence_reduction::sum;
  const auto x = grid_logits(T, E, 52);  // [S, L]: ranks take sequences 0-1 and 2-3
  const auto g = ref::gating(sum, x, T);
  double parts = 0.0;
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> xr(x.begin() + r * (T / 2) * E, x.begin() + (r + 1) * (T / 2) * E);
    parts += ref::sequence_aux_loss(sum, ref::gating(sum, xr, T / 2));
  }
  CHECK(parts == Approx(ref::sequence_aux_loss(sum, g)).epsilon(1e-12));
  CHECK(ref::sequence_aux_loss(sum, g) ==
        Approx(static_cast<double>(S) * ref::sequence_aux_loss(mean, g)).epsilon(1e-12));
}

TEST_CASE("sequence aux: an all-padding sequence adds nothing and leaves the mean",
          "[reference][losses][sequence]") {
  auto c =
      presets::with_sequence_aux(presets::mixtral(8, 2), 4, presets::sequence_aux_peer::megatron);
  const std::int64_t S = 3, T = 12;
  // [L, S]: sequence 1 is tokens 1, 4, 7, 10 — all padding
  const std::vector<std::uint8_t> valid = {1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1};
  const auto g = ref::gating(c, grid_logits(T, 8, 61), T, {}, valid);
  REQUIRE(g.seq_tokens == std::vector<std::int64_t>{4, 0, 4});
  std::vector<double> per(S, 0.0);
  for (std::int64_t s = 0; s < S; ++s) {
    if (s == 1) continue;
    const std::vector<double> sc(g.seq_score_sum.begin() + s * 8,
                                 g.seq_score_sum.begin() + (s + 1) * 8);
    const std::vector<std::int64_t> ct(g.seq_count.begin() + s * 8,
                                       g.seq_count.begin() + (s + 1) * 8);
    per[s] = ref::sequence_aux_loss_from_sums(c, sc, ct, std::vector<std::int64_t>{4});
  }
  CHECK(ref::sequence_aux_loss(c, g) == Approx((per[0] + per[2]) / 2).epsilon(1e-14));
  c.loss.sequence_reduce = sequence_reduction::sum;
  CHECK(ref::sequence_aux_loss(c, g) == Approx(per[0] + per[2]).epsilon(1e-14));
}

TEST_CASE("per-token aux outputs add up to the sums, padding rows count for nothing",
          "[reference][gating][losses]") {
  const std::int32_t E = 12;
  const std::int64_t T = 40;
  std::vector<std::uint8_t> valid(T, 1);
  for (std::int64_t t = 3; t < T; t += 7) valid[t] = 0;
  for (const auto& c :
       {presets::megatron(E, 3), presets::deepspeed_top2(E), presets::olmoe(E, 4)}) {
    const auto g = ref::gating(c, grid_logits(T, E, 71), T, {}, valid);
    const std::int32_t cn = c.aux_counts_per_token();
    REQUIRE(g.aux_scores.size() == static_cast<std::size_t>(T * E));
    REQUIRE(g.aux_count_ids.size() == static_cast<std::size_t>(T * cn));
    std::vector<double> psum(E, 0.0);
    std::vector<std::int64_t> counts(E, 0);
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int32_t j = 0; j < cn; ++j) {
        const std::int32_t e = g.aux_count_ids[t * cn + j];
        if (!valid[t]) {
          REQUIRE(e == -1);
          continue;
        }
        REQUIRE((e >= 0 && e < E));
        ++counts[e];
        // best first by P (the fresh top-k) or by the routing (the routed ids)
        if (j > 0 && c.loss.count_source == aux_count_source::fresh_topk)
          REQUIRE(g.aux_scores[t * E + g.aux_count_ids[t * cn + j - 1]] >= g.aux_scores[t * E + e]);
      }
      for (std::int32_t e = 0; e < E; ++e) {
        if (!valid[t]) REQUIRE(g.aux_scores[t * E + e] == 0.0f);
        psum[e] += g.aux_scores[t * E + e];
      }
    }
    CHECK(counts == g.aux_count);
    for (std::int32_t e = 0; e < E; ++e)
      CHECK(psum[e] == Approx(g.aux_score_sum[e]).epsilon(1e-12));
  }
}

TEST_CASE("sequence aux from sums: bad shapes and counts name the argument",
          "[reference][losses][sequence][hostile]") {
  const auto c =
      presets::with_sequence_aux(presets::mixtral(4, 2), 2, presets::sequence_aux_peer::deepseek);
  const std::vector<double> score(8, 0.25);
  const std::vector<std::int64_t> count(8, 1), tokens{2, 2};
  CHECK(ref::sequence_aux_loss_from_sums(c, score, count, tokens) > 0.0);
  const auto message = [&](auto&& f) {
    try {
      f();
    } catch (const error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message([&] {
               (void)ref::sequence_aux_loss_from_sums(c, std::vector<double>(7, 0.0), count,
                                                      tokens);
             }),
             Catch::Contains("score_sum has 7 elements"));
  CHECK_THAT(message([&] {
               (void)ref::sequence_aux_loss_from_sums(c, score, std::vector<std::int64_t>(9, 1),
                                                      tokens);
             }),
             Catch::Contains("counts has 9 elements"));
  CHECK_THAT(
      message([&] {
        (void)ref::sequence_aux_loss_from_sums(c, score, count, std::vector<std::int64_t>{2, -1});
      }),
      Catch::Contains("tokens[1] = -1"));
  // no sequences: 0
  CHECK(ref::sequence_aux_loss_from_sums(c, {}, {}, {}) == 0.0);
}
