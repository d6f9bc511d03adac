// SPDX-License-Identifier: Apache-2.0
// GPU gating (cuda::gating) against the CPU reference (reference::gating) on the same inputs:
// ids, reroute ids and counts exactly; gates, logsumexp and the aux / z sums within 1e-5
// relative. Shapes cover T in {0, 1, 7, 1000, 16384}, E in {1, 6, 8, 60, 64, 128, 256, 384, 600},
// k in {1, 2, 4, 8, E}, every score function, select mode, stage, renormalisation, bias, group
// limit, noise, aux-count mode, sequences, padding, NaN/Inf rows, f16/bf16 inputs and the
// golden peer logits; plus workspace errors, T = 0, determinism and CUDA-graph replay.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <moeroute/cuda/gating.cuh>
#include <moeroute/presets.hpp>
#include <moeroute/reference/gating.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "../common/golden.hpp"
#include "gating_harness.cuh"
#include "graph_replay.cuh"

using namespace moeroute;
using test::check_gating;
using test::describe;
using test::grid_bias;
using test::grid_logits;

namespace {

/// Variant v of a config: cycles score function, select mode, stage and renormalisation so a
/// shape grid exercises all of them without a full cartesian product.
routing_config variant(std::int32_t E, std::int32_t k, int v) {
  routing_config c;
  c.num_experts = E;
  c.top_k = k;
  switch (v % 6) {
    case 0:  // softmax before top-k, select scores, renormalise (Qwen3)
      c.gating.select = select_from::scores;
      c.gating.renorm = renormalize::before_drop;
      break;
    case 1:  // softmax after top-k (Mixtral)
      c.gating.select = select_from::logits;
      c.gating.stage = softmax_stage::after_topk;
      break;
    case 2:  // sigmoid, select scores, renormalise with epsilon, scaling
      c.gating.score = score_function::sigmoid;
      c.gating.select = select_from::scores;
      c.gating.renorm = renormalize::before_drop;
      c.gating.renorm_epsilon = 1e-20f;
      c.gating.scaling_factor = 2.5f;
      break;
    case 3:  // sqrt-softplus on logits, no renormalisation
      c.gating.score = score_function::sqrt_softplus;
      c.gating.select = select_from::logits;
      break;
    case 4:  // softmax on logits, renormalise after drop (scaling deferred)
      c.gating.select = select_from::logits;
      c.gating.renorm = renormalize::after_drop;
      c.gating.scaling_factor = 1.5f;
      break;
    default:  // sqrt-softplus on scores, renormalise, fresh all-k counts
      c.gating.score = score_function::sqrt_softplus;
      c.gating.select = select_from::scores;
      c.gating.renorm = renormalize::before_drop;
      c.loss.counts = aux_counts::all_k;
      c.loss.count_source = aux_count_source::fresh_topk;
      break;
  }
  if (v % 2 == 1) c.loss.counts = aux_counts::all_k;
  return c;
}

std::vector<std::int32_t> ks_for(std::int32_t E) {
  std::vector<std::int32_t> ks;
  for (std::int32_t k : {1, 2, 4, 8, E})
    if (k <= E && std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
  return ks;
}

/// Valid mask with every 5th token (and token 3) padding.
std::vector<std::uint8_t> some_padding(std::int64_t T) {
  std::vector<std::uint8_t> v(static_cast<std::size_t>(T), 1);
  for (std::int64_t t = 0; t < T; ++t)
    if (t % 5 == 2 || t == 3) v[t] = 0;
  return v;
}

}  // namespace

// The sanitizer set (tests/gpu_check.sh runs "[quick]" under compute-sanitizer): tiny shapes,
// every score function (variants 0-5 cycle softmax before / after top-k, sigmoid and
// sqrt-softplus, select mode and renormalisation), a group limit, bias and padding.
TEST_CASE("gating: tiny shapes, every score function", "[cuda][gating][quick]") {
  for (std::int32_t E : {6, 64})
    for (std::int32_t k : {1, 2})
      for (std::int64_t T : {1, 7, 100})
        for (int v = 0; v < 6; ++v) {
          const routing_config cfg = variant(E, k, v);
          INFO(describe(cfg, T));
          REQUIRE(check_gating<float>(cfg, grid_logits(T, E, static_cast<std::uint32_t>(v)), T) ==
                  "");
        }
  for (std::int64_t T : {7, 100}) {
    const auto cfg = presets::deepseek_v3(64, 4, 8, 2);
    INFO(describe(cfg, T));
    REQUIRE(check_gating<float>(cfg, grid_logits(T, 64, 11), T, grid_bias(64), some_padding(T)) ==
            "");
  }
}

// The grid in two test cases (one sequence of variants), so that the CPU emulation
// leaves out the [slow] part: k = E >= 128 at T = 1000,
// ~80% of the grid's k + R arg-max rounds.
static void check_grid(bool k_equals_large_e_at_1000) {
  int v = 0;
  for (std::int32_t E : {1, 6, 8, 60, 64, 128, 256, 384, 600}) {
    for (std::int32_t k : ks_for(E)) {
      for (std::int64_t T : {0, 1, 7, 1000}) {
        const routing_config cfg = variant(E, k, v++);
        if ((k == E && E >= 128 && T == 1000) != k_equals_large_e_at_1000) continue;
        const auto logits = grid_logits(T, E, static_cast<std::uint32_t>(v));
        INFO(describe(cfg, T));
        REQUIRE(check_gating<float>(cfg, logits, T) == "");
      }
    }
  }
}

TEST_CASE("gating matches the reference over the T x E x k grid", "[cuda][gating]") {
  check_grid(false);
}

TEST_CASE("gating matches the reference over the grid: k = E >= 128 at T = 1000",
          "[cuda][gating][slow]") {
  check_grid(true);
}

TEST_CASE("gating matches the reference at T = 16384", "[cuda][gating][slow]") {
  struct shape {
    std::int32_t E, k;
    int v;
  };
  for (const shape s : {shape{64, 2, 0}, shape{128, 8, 1}, shape{256, 8, 2}, shape{384, 4, 3},
                        shape{60, 4, 5}, shape{8, 2, 4}}) {
    const std::int64_t T = 16384;
    const routing_config cfg = variant(s.E, s.k, s.v);
    INFO(describe(cfg, T));
    REQUIRE(check_gating<float>(cfg, grid_logits(T, s.E, 99), T) == "");
  }
  // DeepSeek-V3 at full size
  const auto cfg = presets::deepseek_v3();
  INFO(describe(cfg, 16384));
  REQUIRE(check_gating<float>(cfg, grid_logits(16384, 256, 7), 16384, grid_bias(256)) == "");
}

// One test case per E, so that the CPU emulation can run them in different passes.
static void check_every_option(std::int32_t E) {
  const std::int64_t T = 257;
  const auto logits = grid_logits(T, E, 3);
  const auto bias = grid_bias(E);
  const auto valid = some_padding(T);
  for (score_function sf :
       {score_function::softmax, score_function::sigmoid, score_function::sqrt_softplus})
    for (select_from sel : {select_from::logits, select_from::scores})
      for (softmax_stage stage : {softmax_stage::before_topk, softmax_stage::after_topk})
        for (renormalize rn :
             {renormalize::none, renormalize::before_drop, renormalize::after_drop})
          for (bool use_bias : {false, true})
            for (noise_kind nk : {noise_kind::none, noise_kind::gaussian, noise_kind::gumbel})
              for (noise_target nt :
                   {noise_target::selection_only, noise_target::selection_and_gates})
                for (int counts = 0; counts < 3; ++counts) {
                  if (nk == noise_kind::none && nt == noise_target::selection_and_gates) continue;
                  routing_config c;
                  c.num_experts = E;
                  c.top_k = 4;
                  c.gating.score = sf;
                  c.gating.select = sel;
                  c.gating.stage = stage;
                  c.gating.renorm = rn;
                  c.gating.renorm_epsilon = rn == renormalize::before_drop ? 1e-20f : 0.0f;
                  c.gating.scaling_factor = 1.25f;
                  c.gating.expert_bias = use_bias;
                  c.gating.noise.kind = nk;
                  c.gating.noise.scale = 0.75f;
                  c.gating.noise.seed = 1234;
                  c.gating.noise.offset = 77;
                  c.gating.noise.target = nt;
                  c.loss.counts = counts == 0 ? aux_counts::top1 : aux_counts::all_k;
                  c.loss.count_source =
                      counts == 2 ? aux_count_source::fresh_topk : aux_count_source::routed;
                  if (!validate(c)) continue;
                  INFO(describe(c, T));
                  REQUIRE(check_gating<float>(c, logits, T, use_bias ? bias : std::vector<float>{},
                                              valid) == "");
                }
}

TEST_CASE("gating: every option combination, E = 60", "[cuda][gating]") { check_every_option(60); }

TEST_CASE("gating: every option combination, E = 64", "[cuda][gating][slow]") {
  check_every_option(64);
}

TEST_CASE("gating: noise off in eval unless only_in_training is false", "[cuda][gating]") {
  const std::int64_t T = 100;
  const auto logits = grid_logits(T, 64, 5);
  for (bool only_training : {true, false}) {
    routing_config c = variant(64, 2, 0);
    c.training = false;
    c.gating.noise.kind = noise_kind::gumbel;
    c.gating.noise.only_in_training = only_training;
    c.gating.noise.seed = 42;
    INFO(describe(c, T) << " only_in_training=" << only_training);
    REQUIRE(check_gating<float>(c, logits, T) == "");
  }
}

TEST_CASE("gating: NLLB second-expert policies and the batch priority", "[cuda][gating]") {
  // sampling re-picks the second choice with Philox Gumbel noise, random draws whether it is
  // kept, batch_prioritized writes each token's top-1 score: all as the reference does.
  for (const std::int32_t E : {4, 16, 128, 600})
    for (const std::int64_t T : {1, 7, 1000})
      for (const auto policy : {second_expert_policy::all, second_expert_policy::random,
                                second_expert_policy::sampling})
        for (const bool prioritized : {false, true}) {
          presets::nllb_moe_options o;
          o.batch_prioritized_routing = prioritized;
          auto c = presets::nllb_moe(E, o);
          c.gating.second_expert = {policy, 9, 3};
          const auto logits = grid_logits(T, E, 5);
          INFO(describe(c, T) << " second " << to_string(policy) << " prioritized " << prioritized);
          REQUIRE(check_gating<float>(c, logits, T) == "");
          c.gating.score = score_function::sigmoid;  // the priority is score(max logit)
          REQUIRE(check_gating<float>(c, logits, T) == "");
        }
}

TEST_CASE("gating: group limit (DeepSeek-V3 and smaller shapes)", "[cuda][gating]") {
  struct shape {
    std::int32_t E, k, groups, group_topk;
  };
  for (const shape s :
       {shape{256, 8, 8, 4}, shape{64, 4, 8, 2}, shape{60, 6, 6, 3}, shape{384, 8, 4, 2},
        shape{64, 8, 64, 8}, shape{600, 8, 8, 4}, shape{8, 2, 2, 1}}) {
    for (std::int64_t T : {1, 7, 1000}) {
      auto c = presets::deepseek_v3(s.E, s.k, s.groups, s.group_topk);
      const auto logits = grid_logits(T, s.E, 11);
      INFO(describe(c, T));
      REQUIRE(check_gating<float>(c, logits, T, grid_bias(s.E)) == "");
      c.gating.score = score_function::softmax;  // groups on softmax scores, no bias
      c.gating.expert_bias = false;
      INFO(describe(c, T));
      REQUIRE(check_gating<float>(c, logits, T) == "");
      // every group-score rule: Megatron's top k/group_topk, the max, the top-n for each n
      auto& gl = c.gating.group_limit;
      for (std::int32_t n = 0; n <= std::min(3, s.E / s.groups); ++n) {
        gl.score = n == 0 ? group_score::max : group_score::sum_top_n;
        gl.top_n = n == 0 ? 0 : n;
        INFO("group score " << to_string(gl.score) << " n " << gl.top_n);
        REQUIRE(check_gating<float>(c, logits, T) == "");
      }
      gl.score = group_score::sum_top_k_share;
      gl.top_n = 0;
      if (s.k % s.group_topk == 0) REQUIRE(check_gating<float>(c, logits, T) == "");
    }
  }
}

TEST_CASE("gating: reroute candidates for next_choice", "[cuda][gating]") {
  struct shape {
    std::int32_t E, k, cand;
  };
  for (const shape s :
       {shape{60, 2, 4}, shape{6, 4, 4}, shape{8, 1, 7}, shape{384, 8, 8}, shape{600, 2, 3}}) {
    routing_config c = variant(s.E, s.k, 0);
    c.dispatch.dropped = drop_policy::next_choice;
    c.dispatch.reroute.max_candidates = s.cand;
    const std::int64_t T = 300;
    INFO(describe(c, T));
    REQUIRE(c.candidates_per_token() > c.top_k);
    REQUIRE(check_gating<float>(c, grid_logits(T, s.E, 13), T) == "");
  }
}

TEST_CASE("gating: sequence-level sums and padding", "[cuda][gating]") {
  for (std::int64_t L : {1, 8, 100, 1000}) {
    for (std::int32_t E : {8, 60, 256}) {
      routing_config c = variant(E, 2, static_cast<int>(L));
      c.loss.sequence_length = L;
      const std::int64_t T = 1000;
      INFO(describe(c, T));
      REQUIRE(check_gating<float>(c, grid_logits(T, E, 17), T, {}, some_padding(T)) == "");
    }
  }
  // all padding: no sums, ids still defined
  const std::vector<std::uint8_t> none(64, 0);
  REQUIRE(check_gating<float>(variant(60, 2, 0), grid_logits(64, 60, 1), 64, {}, none) == "");
}

TEST_CASE("gating: sequence-level sums and padding, DeepSeek-V3 at T = 16384",
          "[cuda][gating][slow]") {
  routing_config c = presets::deepseek_v3();
  c.loss.sequence_length = 4096;
  INFO(describe(c, 16384));
  REQUIRE(check_gating<float>(c, grid_logits(16384, 256, 19), 16384, grid_bias(256),
                              some_padding(16384)) == "");
}

TEST_CASE("gating: NaN and Inf rows as the reference sanitises them", "[cuda][gating]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  for (std::int32_t E : {6, 60, 256, 600}) {
    const std::int64_t T = 9;
    auto logits = grid_logits(T, E, 23);
    auto row = [&](std::int64_t t) { return logits.begin() + t * E; };
    std::fill(row(0), row(1), nan);   // all NaN
    std::fill(row(1), row(2), -inf);  // all -Inf
    std::fill(row(2), row(3), inf);   // all +Inf
    logits[3 * E + E / 2] = inf;      // one +Inf
    logits[4 * E + 0] = nan;          // NaN first
    logits[4 * E + E - 1] = -inf;
    logits[5 * E + 1 % E] = inf;  // +Inf and -Inf and NaN
    logits[5 * E + 2 % E] = -inf;
    logits[5 * E + 3 % E] = nan;
    std::fill(row(6), row(7), -8.0f);  // all equal (ties everywhere)
    std::fill(row(7), row(8), -FLT_MAX);
    for (int v = 0; v < 6; ++v) {
      for (std::int32_t k : {1, std::min<std::int32_t>(4, E), E}) {
        routing_config c = variant(E, k, v);
        INFO(describe(c, T));
        REQUIRE(check_gating<float>(c, logits, T) == "");
        c.gating.noise.kind = noise_kind::gaussian;
        c.gating.noise.scale = 3.0f;
        INFO(describe(c, T));
        REQUIRE(check_gating<float>(c, logits, T) == "");
      }
    }
    auto ds = presets::deepseek_v3(E, 2, 2, 1);
    INFO(describe(ds, T));
    REQUIRE(check_gating<float>(ds, logits, T, grid_bias(E)) == "");
    // groups on raw logits: group scores of +-FLT_MAX rows overflow to +-inf in float
    routing_config gl = variant(E, 2, 4);
    gl.gating.group_limit = {2, 1};
    INFO(describe(gl, T));
    REQUIRE(check_gating<float>(gl, logits, T) == "");
  }
}

TEST_CASE("gating: f16 and bf16 inputs, aligned and not", "[cuda][gating]") {
  for (std::int32_t E : {8, 60, 64, 256, 384, 600}) {
    const std::int64_t T = 333;
    const auto f = grid_logits(T, E, 29);
    for (int v = 0; v < 6; ++v) {
      const routing_config c = variant(E, std::min<std::int32_t>(E, 4), v);
      INFO(describe(c, T));
      REQUIRE(check_gating<half_bits>(c, test::convert<half_bits>(f), T) == "");
      REQUIRE(check_gating<bf16_bits>(c, test::convert<bf16_bits>(f), T) == "");
      // a start that is not 16-byte aligned forces the scalar loads
      REQUIRE(check_gating<half_bits>(c, test::convert<half_bits>(f), T, {}, {}, 1) == "");
      REQUIRE(check_gating<float>(c, f, T, {}, {}, 1) == "");
    }
  }
}

TEST_CASE("gating: golden peer logits through every preset", "[cuda][gating][golden]") {
  const auto files =
      test::load_golden_files(test::golden_directory("MOEROUTE_GOLDEN_DIR", "golden"));
  REQUIRE(!files.empty());
  for (const auto& file : files) {
    const std::int64_t T = file.doc.at("tokens").get<std::int64_t>();
    const std::int32_t E = file.doc.at("experts").get<std::int32_t>();
    const std::vector<float> logits = test::golden_logits(file.doc);
    // every case's own preset, and every preset of the registry on the same logits
    std::vector<std::pair<routing_config, std::vector<float>>> runs;
    for (const auto& cs : file.doc["cases"])
      runs.emplace_back(test::preset_for(cs, E), test::golden_bias(cs));
    for (const auto& p : presets::registry) {
      routing_config c;
      if (!presets::by_name(p.name, E, std::min(p.default_k, E), c).ok() || !validate(c).ok())
        continue;
      runs.emplace_back(c, c.gating.expert_bias ? grid_bias(E) : std::vector<float>{});
    }
    presets::megatron_options mo;
    mo.score = score_function::sigmoid;
    mo.groups = E >= 8 ? 4 : 2;
    mo.group_topk = 2;
    mo.scaling_factor = 2.5f;
    mo.expert_bias = true;
    runs.emplace_back(presets::megatron(E, 4, mo), grid_bias(E));
    runs.emplace_back(presets::deepseek_v3(E, 4, mo.groups, 2), grid_bias(E));
    for (const auto& [c, bias] : runs) {
      INFO(file.name() << ": " << describe(c, T));
      REQUIRE(check_gating<float>(c, logits, T, bias) == "");
    }
  }
}

TEST_CASE("gating: workspace too small, bad params, T = 0", "[cuda][gating][quick]") {
  const auto cfg = presets::deepseek_v3();
  const std::int64_t T = 100;
  const auto logits = grid_logits(T, 256, 31);
  test::gating_buffers<float> b(cfg, logits, T, grid_bias(256), {});
  REQUIRE(b.workspace_bytes > 0);
  REQUIRE(b.workspace_bytes == cuda::gating_workspace_bytes(cfg, T));
  auto s = cuda::gating(cfg, b.p, b.workspace.get(), b.workspace_bytes - 1);
  REQUIRE(s.code == status_code::workspace_too_small);
  REQUIRE(s.message.find("gating_workspace_bytes") != std::string::npos);
  s = cuda::gating(cfg, b.p, nullptr, 0);
  REQUIRE(s.code == status_code::workspace_too_small);

  auto p = b.p;
  p.d_bias = nullptr;
  s = cuda::gating(cfg, p, b.workspace.get(), b.workspace_bytes);
  REQUIRE(s.code == status_code::invalid_argument);
  REQUIRE(s.message.find("d_bias") != std::string::npos);
  p = b.p;
  p.out.d_ids = nullptr;
  s = cuda::gating(cfg, p, b.workspace.get(), b.workspace_bytes);
  REQUIRE(s.code == status_code::invalid_argument);
  REQUIRE(s.message.find("d_ids") != std::string::npos);
  p = b.p;
  p.tokens = -1;
  REQUIRE(cuda::gating(cfg, p, b.workspace.get(), b.workspace_bytes).code ==
          status_code::invalid_shape);
  auto bad = cfg;
  bad.top_k = 300;
  REQUIRE(cuda::gating(bad, b.p, b.workspace.get(), b.workspace_bytes).code ==
          status_code::invalid_config);
  auto seq = cfg;
  seq.loss.sequence_length = 7;  // 100 % 7 != 0
  REQUIRE(cuda::gating(seq, b.p, b.workspace.get(), b.workspace_bytes).code ==
          status_code::invalid_shape);

  // T = 0: success, nothing written, no workspace needed
  REQUIRE(cuda::gating_workspace_bytes(cfg, 0) == 0);
  b.ids.fill_bytes(0xAB);
  b.aux_count.fill_bytes(0xAB);
  p = b.p;
  p.tokens = 0;
  REQUIRE(cuda::gating(cfg, p, nullptr, 0).ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  for (auto id : b.ids.download()) REQUIRE(static_cast<std::uint32_t>(id) == 0xABABABABu);
  for (auto n : b.aux_count.download())
    REQUIRE(static_cast<std::uint64_t>(n) == 0xABABABABABABABABull);
}

namespace {
template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
bool same_bits(const test::gpu_gating& a, const test::gpu_gating& b) {
  return same_bytes(a.ids, b.ids) && same_bytes(a.reroute_ids, b.reroute_ids) &&
         same_bytes(a.gates, b.gates) && same_bytes(a.logsumexp, b.logsumexp) &&
         same_bytes(a.aux_score_sum, b.aux_score_sum) && same_bytes(a.aux_count, b.aux_count) &&
         same_bytes(a.seq_score_sum, b.seq_score_sum) && same_bytes(a.seq_count, b.seq_count) &&
         same_bytes(a.seq_tokens, b.seq_tokens) && a.valid_tokens == b.valid_tokens &&
         a.nonfinite == b.nonfinite &&
         std::memcmp(&a.z_sum_squares, &b.z_sum_squares, sizeof(double)) == 0;
}
}  // namespace

TEST_CASE("gating: two runs and a CUDA graph replay give identical bits", "[cuda][gating]") {
  for (std::int32_t E : {60, 256, 600}) {
    routing_config cfg = E == 256 ? presets::deepseek_v3() : variant(E, 4, 5);
    cfg.loss.sequence_length = 500;
    const std::int64_t T = 2000;
    const auto logits = grid_logits(T, E, 37);
    const auto bias = cfg.gating.expert_bias ? grid_bias(E) : std::vector<float>{};
    test::gating_buffers<float> b(cfg, logits, T, bias, some_padding(T));
    const auto first = b.download(b.run(cfg));
    REQUIRE(first.st.ok());
    const auto ref = reference::gating<float>(cfg, std::span<const float>(logits), T,
                                              std::span<const float>(bias),
                                              std::span<const std::uint8_t>(some_padding(T)));
    REQUIRE(test::compare(ref, first) == "");
    b.ids.fill_bytes(0);
    b.gates.fill_bytes(0);
    b.aux_sum.fill_bytes(0);
    const auto second = b.download(b.run(cfg));
    REQUIRE(same_bits(first, second));

    cudaStream_t stream;
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    test::capture_and_replay(
        stream, [&](cudaStream_t s) { return b.run(cfg, s); },
        [&] {
          b.ids.fill_bytes(0);
          b.gates.fill_bytes(0);
          b.aux_sum.fill_bytes(0);
          b.seq_sum.fill_bytes(0);
        },
        [&] { REQUIRE(same_bits(first, b.download(status::success()))); });
    cudaStreamDestroy(stream);
  }
}
