// SPDX-License-Identifier: Apache-2.0
// Gating's token columns (cpu/detail/token_columns.hpp, AVX2 builds): softmax and sigmoid rows of
// 8 to 128 experts with up to 8 choices go eight tokens at a time, one per register lane. Checked
// four ways: against the reference (check_gating, whose lean run takes the columns and whose
// full run, asking for the per-token aux rows, takes rows: the two compared bit for bit); a
// token's ids, gates and logsumexp the same bits wherever it sits in the batch (a shift by
// three tokens moves every token to another lane, or out of a whole tile to the rows) and on
// any executor; each column kernel against its row kernel, bit for bit (a reordered double sum
// rarely reaches a float output); and the path asserted taken, so that a change to its
// conditions cannot leave it untested.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <moeroute/cpu/gating.hpp>
#include <moeroute/presets.hpp>

#include "../common/gating_cases.hpp"
#include "gating_harness.hpp"

using namespace moeroute;

namespace {

struct column_case {
  const char* name;
  routing_config cfg;
};

std::vector<column_case> column_cases() {
  std::vector<column_case> cs;
  routing_config megatron = presets::megatron(64, 2, {.capacity_factor = 1.25});
  megatron.loss.z_coefficient = 0.001f;
  cs.push_back({"megatron (64, 2), z-loss, fresh top-k counts", megatron});
  routing_config mixtral = test::variant(8, 2, 0);  // softmax, select P, renormalise
  mixtral.loss.z_coefficient = 0.001f;
  cs.push_back({"softmax, select P, renormalise (8, 2)", mixtral});
  cs.push_back({"softmax after top-k (24, 2), all-k counts", test::variant(24, 2, 1)});
  cs.push_back({"softmax on logits, renormalise after drop (128, 1)", test::variant(128, 1, 4)});
  routing_config prio = test::variant(16, 2, 0);
  prio.dispatch.prio = priority::batch_prioritized;
  prio.gating.scaling_factor = 2.0f;
  cs.push_back({"batch-prioritised, scaled (16, 2)", prio});
  routing_config wide = presets::megatron(128, 1);
  cs.push_back({"megatron (128, 1)", wide});
  routing_config gpt_oss = presets::megatron(32, 4, {.capacity_factor = 1.0});
  gpt_oss.loss.z_coefficient = 0.001f;
  cs.push_back({"softmax after top-k (32, 4), fresh top-k counts", gpt_oss});
  cs.push_back({"softmax, select P, renormalise (16, 4)", test::variant(16, 4, 0)});
  cs.push_back({"softmax on logits, renormalise after drop (24, 3)", test::variant(24, 3, 4)});
  routing_config olmoe = test::variant(64, 8, 0);
  olmoe.loss.counts = aux_counts::all_k;
  olmoe.loss.count_source = aux_count_source::fresh_topk;
  cs.push_back({"softmax, select P, renormalise (64, 8), fresh top-k counts", olmoe});
  cs.push_back({"softmax after top-k (128, 6)", test::variant(128, 6, 1)});
  // sigmoid scores: Llama-4's (sigmoid of the chosen logits), DeepSeek-V3's without groups
  // (bias, renormalise, scaling), one with a z-loss and batch priority, one selecting biased
  // logits with fresh counts
  routing_config llama4 = test::variant(16, 1, 2);
  llama4.gating.select = select_from::logits;
  llama4.gating.renorm = renormalize::none;
  llama4.gating.scaling_factor = 1.0f;
  cs.push_back({"sigmoid of the chosen logits (16, 1)", llama4});
  cs.push_back({"sigmoid, bias, no groups (64, 8)", presets::deepseek_v3(64, 8, 0, 0)});
  routing_config sig_prio = test::variant(8, 2, 2);
  sig_prio.loss.z_coefficient = 0.001f;
  sig_prio.dispatch.prio = priority::batch_prioritized;
  cs.push_back({"sigmoid, z-loss, batch-prioritised (8, 2)", sig_prio});
  routing_config sig_logits = test::variant(24, 2, 2);
  sig_logits.gating.select = select_from::logits;
  sig_logits.gating.expert_bias = true;
  sig_logits.loss.counts = aux_counts::all_k;
  sig_logits.loss.count_source = aux_count_source::fresh_topk;
  cs.push_back({"sigmoid, biased logits selected, fresh counts (24, 2)", sig_logits});
  return cs;
}

// the 1/64-grid logits with more exact ties (values on a coarse grid in every fourth row), so
// the lower-index rule decides selections
std::vector<float> tied_logits(std::int64_t T, std::int32_t E, std::uint32_t seed) {
  std::vector<float> x = test::grid_logits(T, E, seed);
  for (std::int64_t t = 0; t < T; t += 4)
    for (std::int32_t e = 0; e < E; ++e) x[t * E + e] = std::round(x[t * E + e] * 2.0f) / 2.0f;
  // a row whose sigmoid scores are all 0 (their sum too: the aux denominator's epsilon decides)
  if (T > 9)
    for (std::int32_t e = 0; e < E; ++e) x[9 * E + e] = -100.0f - static_cast<float>(e % 3);
  return x;
}

// the expert bias where the config has one (else none)
std::vector<float> bias_of(const routing_config& c) {
  return c.gating.expert_bias ? test::grid_bias(c.num_experts) : std::vector<float>{};
}

std::vector<std::uint8_t> padded(std::int64_t T) {
  std::vector<std::uint8_t> v(T, 1);
  for (std::int64_t t = 5; t < T; t += 7) v[t] = 0;
  return v;
}

}  // namespace

TEST_CASE("cpu gating columns: the path is taken where it applies", "[cpu][gating]") {
  // and not beyond its bounds: 9 choices, 136 experts, a row not a multiple of 8
  for (const auto& [E, k] : {std::pair{64, 9}, std::pair{136, 2}, std::pair{60, 2}}) {
    const routing_config c = test::variant(E, k, 1);
    test::cpu_gating_buffers<float> b(c, test::grid_logits(8, E, 1), 8, {}, {}, 0);
    b.p.out.d_aux_scores = nullptr;
    b.p.out.d_aux_count_ids = nullptr;
    CHECK_FALSE(cpu::detail::gating_agent<float>(c, b.p).columns);
  }
  for (const auto& c : column_cases()) {
    INFO(c.name);
    const std::int64_t T = 16;
    test::cpu_gating_buffers<float> b(c.cfg, tied_logits(T, c.cfg.num_experts, 3), T,
                                      bias_of(c.cfg), {}, 0);
    b.p.out.d_aux_scores = nullptr;
    b.p.out.d_aux_count_ids = nullptr;
    const cpu::detail::gating_agent<float> lean(c.cfg, b.p);
#if defined(MOEROUTE_CPU_TOKEN_COLUMNS)
    // (where they pay: rows of up to 128 experts)
    CHECK(lean.columns == cpu::detail::columns::pays(c.cfg.num_experts));
#else
    CHECK_FALSE(lean.columns);
#endif
    // the per-token aux rows are written by rows only
    b.p.out.d_aux_scores = b.g.aux_scores.data();
    const cpu::detail::gating_agent<float> full(c.cfg, b.p);
    CHECK_FALSE(full.columns);
  }
}

TEST_CASE("cpu gating columns: the reference's results, the rows' bits", "[cpu][gating]") {
  for (const auto& c : column_cases()) {
    const std::int32_t E = c.cfg.num_experts;
    for (const std::int64_t T : {std::int64_t{8}, std::int64_t{45}, std::int64_t{1000}}) {
      INFO(c.name << " T = " << T);
      auto logits = tied_logits(T, E, 11);
      const auto bias = bias_of(c.cfg);
      REQUIRE(test::check_gating<float>(c.cfg, logits, T, bias) == "");
      REQUIRE(test::check_gating<float>(c.cfg, logits, T, bias, padded(T)) == "");
      // a NaN and an Inf: their tiles go by rows, the others by columns
      logits[3 * E + 1] = std::numeric_limits<float>::quiet_NaN();
      if (T > 20) logits[17 * E + E - 1] = std::numeric_limits<float>::infinity();
      REQUIRE(test::check_gating<float>(c.cfg, logits, T, bias, padded(T)) == "");
      // bf16 logits, through the same load
      std::vector<bf16_bits> h(logits.size());
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = to_bf16(logits[i]);
      REQUIRE(test::check_gating<bf16_bits>(c.cfg, h, T, bias) == "");
    }
  }
}

TEST_CASE("cpu gating columns: fresh top-k counts where a P past the choices ties the least",
          "[cpu][gating]") {
  // Megatron's counts are a fresh top-k of P. Selecting by logits, the columns compare only
  // the next expert's P with the least counted one's (P keeps the logits' order); here the
  // last counted choice's logit is 2^-10 and the next one's 2^-10 - 2^-26, at a lower index:
  // 128 ulps apart, so the keys rank them, but x - max rounds both to one value (or to 0 and
  // a quarter ulp of exp's 1), so their P tie and the fresh top-k takes the lower index
  struct fresh_case {
    routing_config cfg;
    std::int32_t last, next;  // the experts of the last counted choice and of the next one
  };
  routing_config top1 = presets::megatron(64, 2, {.capacity_factor = 1.25});
  top1.loss.counts = aux_counts::top1;  // (the next one is the second choice)
  for (const auto& [cfg, last, next] :
       {fresh_case{presets::megatron(64, 2), 40, 10}, fresh_case{presets::megatron(32, 4), 30, 3},
        fresh_case{top1, 50, 20}}) {
    const std::int32_t E = cfg.num_experts, counted = cfg.aux_counts_per_token();
    INFO("E = " << E << ", k = " << cfg.top_k << ", counted " << counted);
    const std::int64_t T = 24;
    // every other logit well below the ones set, and a permutation of distinct values (a
    // token with a near tie among its best would send its tile to insertion, which counts P)
    std::vector<float> x(static_cast<std::size_t>(T * E));
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int32_t e = 0; e < E; ++e)
        x[t * E + e] = -3.0f - 0.01f * static_cast<float>((e * 7 + t * 13) % E);
    for (std::int64_t t = 0; t < T; t += 2) {  // every other token, in every lane of a tile
      float* row = &x[t * E];
      std::int32_t e = 0;  // the choices before the last counted one: 1, 1/2, ... (free ids)
      for (std::int32_t j = 0; j + 1 < counted; ++j, ++e) {
        while (e == last || e == next) ++e;
        row[e] = 1.0f / static_cast<float>(1 << j);
      }
      row[last] = 0x1p-10f;
      row[next] = 0x1p-10f - 0x1p-26f;
    }
    REQUIRE(test::check_gating<float>(cfg, x, T, {}) == "");
    // the premise: P's fresh top-k is not the routed set (the rows write the count ids)
    test::cpu_gating_buffers<float> b(cfg, x, T, {}, {}, 0);
    const auto o = b.run(cfg, cpu::executor::serial());
    REQUIRE(o.st.ok());
    for (std::int64_t t = 0; t < T; t += 2) {
      const auto* ids = &o.aux_count_ids[t * counted];
      CHECK(std::find(ids, ids + counted, next) != ids + counted);
      CHECK(std::find(ids, ids + counted, last) == ids + counted);
    }
  }
}

TEST_CASE(
    "cpu gating columns: a token's bits do not depend on its place in the batch or the threads",
    "[cpu][gating]") {
  const auto same = [](const void* a, const void* b, std::size_t bytes) {
    return std::memcmp(a, b, bytes) == 0;
  };
  for (const auto& c : column_cases()) {
    INFO(c.name);
    const std::int32_t E = c.cfg.num_experts, k = c.cfg.top_k;
    const std::int64_t T = 2497, shift = 3;  // several tasks: 16k logits each
    const auto logits = tied_logits(T + shift, E, 5);
    const std::vector<float> tail(logits.begin() + shift * E, logits.end());
    test::cpu_gating_buffers<float> all(c.cfg, logits, T + shift, bias_of(c.cfg), {}, 0);
    test::cpu_gating_buffers<float> later(c.cfg, tail, T, bias_of(c.cfg), {}, 0);
    for (auto* b : {&all, &later}) {
      b->p.out.d_aux_scores = nullptr;
      b->p.out.d_aux_count_ids = nullptr;
    }
    // (serially, on OpenMP and with the tasks in reverse order: the same bits)
    test::gating_outputs a;
    REQUIRE(test::run_three_ways(c.cfg, all, a) == "");
    const auto l = later.run(c.cfg, cpu::executor::serial());
    REQUIRE(a.st.ok());
    REQUIRE(l.st.ok());
    for (std::int64_t t = 0; t < T; ++t) {
      INFO("token " << t << " (at " << t + shift << " in the longer batch)");
      REQUIRE(same(&l.ids[t * k], &a.ids[(t + shift) * k], k * sizeof(std::int32_t)));
      REQUIRE(same(&l.gates[t * k], &a.gates[(t + shift) * k], k * sizeof(float)));
      REQUIRE(same(&l.logsumexp[t], &a.logsumexp[t + shift], sizeof(float)));
    }
  }
}

#if defined(MOEROUTE_CPU_TOKEN_COLUMNS)
TEST_CASE("cpu gating columns: each kernel gives the row kernel's bits", "[cpu][gating]") {
  // rows of mixed magnitudes with ties, +0 / -0 maxima (their sign reaches the logsumexp),
  // and values whose exps underflow (wide: exp8 on AVX2), or values within 86 of their row's
  // max (moderate: exp8_moderate, the boundary included): the double and float sums, exps,
  // logsumexps, P and sigmoids of the columns compared with math.hpp's row kernels bit for
  // bit, lane by lane
  namespace col = cpu::detail::columns;
  constexpr std::int32_t W = col::lanes;
  const auto same = [](const auto& a, const auto& b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  for (const bool wide : {true, false})
    for (const std::int32_t E : {8, 16, 24, 40, 64, 128}) {
      INFO("E = " << E << (wide ? ", wide" : ", moderate"));
      std::vector<float> rows = test::grid_logits(W, E, static_cast<std::uint32_t>(E));
      for (std::int32_t e = 0; e < E; ++e) {
        const auto f = static_cast<float>(e);
        rows[1 * E + e] = e % 2 == 0 ? -0.0f : -1.0f - f;                    // max -0
        rows[2 * E + e] = e % 3 == 0 ? 0.0f : (e % 3 == 1 ? -0.0f : -2.0f);  // +0 and -0
        // (moderate: from -93.5 to -7.5, exactly 86 apart)
        rows[3 * E + e] =
            wide ? f * 9.0f - 200.0f
                 : std::clamp(-93.5f + f * 86.0f / static_cast<float>(E - 1), -93.5f, -7.5f);
        rows[4 * E + e] = wide ? 1e30f / (f + 1.0f) : 1e30f;
      }
      std::vector<float> xc(static_cast<std::size_t>(W * E)), ec(xc.size()), pc(xc.size());
      col::f32x8 m, lo;
      REQUIRE(col::load(rows.data(), E, xc.data(), m, lo));
      col::f64x4 sum[2];
      col::exp_and_sum(xc.data(), E, m, lo, ec.data(), sum);
      const col::f64x4 inv[2] = {1.0 / sum[0], 1.0 / sum[1]};
      pc = ec;
      col::normalize(pc.data(), E, inv);
      std::vector<float> sc(xc.size());
      col::sigmoid(xc.data(), E, sc.data());
      const col::f32x8 ssum = col::sum_f32(sc.data(), E);
      float lse[W];
      col::logsumexp(m, sum, lse);
      for (std::int32_t l = 0; l < W; ++l) {
        INFO("row " << l);
        std::vector<float> x(E), ex(E), p(E), s(E);
        std::int64_t bad = 0;
        const float rm = cpu::math::load_row(rows.data() + l * E, E, x.data(), bad);
        CHECK(same(m[l], rm));
        CHECK(lo[l] == *std::min_element(x.begin(), x.end()));
        const double rs = cpu::math::exp_row(x.data(), E, rm, ex.data());
        CHECK(same(sum[l / 4][l % 4], rs));
        CHECK(same(lse[l], static_cast<float>(static_cast<double>(rm) + cpu::math::log(rs))));
        cpu::math::normalize_row(ex.data(), E, rs, p.data());
        cpu::math::sigmoid_row(x.data(), E, s.data());
        CHECK(same(ssum[l], cpu::math::sum_row_f32(s.data(), E)));
        for (std::int32_t e = 0; e < E; ++e) {
          INFO("expert " << e);
          CHECK(same(xc[e * W + l], x[e]));
          CHECK(same(ec[e * W + l], ex[e]));
          CHECK(same(pc[e * W + l], p[e]));
          CHECK(same(sc[e * W + l], s[e]));
        }
      }
    }
}
#endif

#if defined(MOEROUTE_CPU_TOKEN_COLUMNS)
namespace {

namespace col = cpu::detail::columns;

// top_k (keys where a tile allows) against top_k_inserted, and whether the keys took the tile
template <std::int32_t K>
void check_top_k(const std::vector<float>& c, std::int32_t E, bool keys_expected) {
  INFO("K = " << K);
  col::i32x8 id[K], want_id[K];
  col::f32x8 b[K], want_b[K];
  col::top_k_inserted<K>(c.data(), E, want_id, want_b);
  col::top_k<K>(c.data(), E, id, b);
  for (std::int32_t j = 0; j < K; ++j)
    for (std::int32_t l = 0; l < col::lanes; ++l) {
      INFO("place " << j << " lane " << l);
      CHECK(id[j][l] == want_id[j][l]);
      const float got = b[j][l], want = want_b[j][l];  // (clang: no address of an element)
      CHECK(std::memcmp(&got, &want, sizeof got) == 0);
    }
  if constexpr (K >= 2) {
    col::i32x8 kid[K];
    col::f32x8 kb[K];
    CHECK(col::top_k_by_keys<K>(c.data(), E, kid, kb) == keys_expected);
  }
}

// every K; a (near) tie between a token's best of ranks tie and tie + 1 (none: -1) stops the
// keys where it lies among the K + 1 best
template <std::int32_t... K>
void check_top_k_all(const std::vector<float>& c, std::int32_t E, std::int32_t tie,
                     std::integer_sequence<std::int32_t, K...>) {
  (check_top_k<K + 1>(c, E, E >= K + 2 && (tie < 0 || tie + 1 > K + 1)), ...);
}

// a float's int32 order (select.hpp's), and back: the map is its own inverse
float from_order(std::int32_t o) {
  const std::int32_t bits = o ^ ((o >> 31) & 0x7fffffff);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
std::int32_t order_of(float f) {
  std::int32_t bits;
  std::memcpy(&bits, &f, sizeof f);
  return bits ^ ((bits >> 31) & 0x7fffffff);
}

}  // namespace

TEST_CASE("cpu gating columns: the keyed top-k selects what insertion selects", "[cpu][gating]") {
  // columns (8 tokens a column) of distinct values, then among one token's best a near tie
  // the keys cannot rank (two values in one block of 128 in the int32 order), a true tie, or
  // -0 and +0: those tiles go by insertion, the others by keys, both with insertion's ids and
  // values
  constexpr std::int32_t W = col::lanes;
  const auto seq = std::make_integer_sequence<std::int32_t, col::max_choices>{};
  constexpr std::int32_t multipliers[] = {5, 7, 11, 13, 17, 19};  // (prime to every E)
  for (const std::int32_t E : {8, 16, 24, 64, 128}) {
    INFO("E = " << E);
    std::vector<float> c(static_cast<std::size_t>(E * W));
    const auto fill = [&](std::int32_t seed) {
      // a permutation of the experts per token, 0.375 apart from -0.375 E / 2 + 0.125 (never
      // 0), lane 5's scaled by powers of two from 2^-100 to 2^99; and one +0 (lane 2)
      for (std::int32_t e = 0; e < E; ++e)
        for (std::int32_t l = 0; l < W; ++l) {
          const std::int32_t rank = (e * multipliers[seed] + seed * 3 + l * 11) % E;
          const float x = static_cast<float>(rank - E / 2) * 0.375f + 0.125f;
          c[e * W + l] = l == 5 ? std::ldexp(x, (e * 37) % 200 - 100) : x;
        }
      c[(E / 2) * W + 2] = 0.0f;
    };
    const auto expert_at = [&](std::int32_t l, std::int32_t rank) {  // lane l's rank-th best
      std::vector<std::int32_t> e(E);
      for (std::int32_t i = 0; i < E; ++i) e[i] = i;
      std::stable_sort(e.begin(), e.end(),
                       [&](std::int32_t a, std::int32_t b) { return c[a * W + l] > c[b * W + l]; });
      return e[rank];
    };
    for (std::int32_t seed = 0; seed < 6; ++seed) {
      INFO("seed " << seed);
      fill(seed);
      check_top_k_all(c, E, -1, seq);
      for (std::int32_t rank = 0; rank < 9 && rank + 1 < E; ++rank) {
        INFO("tie at rank " << rank);
        const std::int32_t l = (seed + rank) % W;
        const std::int32_t upper = expert_at(l, rank), lower = expert_at(l, rank + 1);
        const float v = c[upper * W + l];
        // a near tie, the order still by value: both within v's block of 128 (the values
        // are much further apart than that, so no rank changes)
        const std::int32_t block = order_of(v) & ~col::key_index_mask;
        c[upper * W + l] = from_order(block + 64);
        c[lower * W + l] = from_order(block + 32);
        check_top_k_all(c, E, rank, seq);
        c[upper * W + l] = v;
        c[lower * W + l] = v;  // a true tie: the lower index first
        check_top_k_all(c, E, rank, seq);
        fill(seed);
      }
      // -0 and +0 the best of lane 3 (the rest below -1): a tie, expert 0's -0 first; a lone
      // -0 (made +0 before the keys) is none
      for (std::int32_t e = 0; e < E; ++e) c[e * W + 3] = -1.0f - std::fabs(c[e * W + 3]);
      c[(E - 1) * W + 3] = 0.0f;
      c[3] = -0.0f;
      check_top_k_all(c, E, 0, seq);
      c[(E - 1) * W + 3] = -1.0f;
      check_top_k_all(c, E, -1, seq);
    }
  }
}
#endif
