// SPDX-License-Identifier: Apache-2.0
// GPU gating (cuda::gating) against the CPU reference (reference::gating) on the same inputs:
// ids, reroute ids and counts exactly; gates, logsumexp and the aux / z sums within 1e-5
// relative. Shapes cover T in {0, 1, 7, 1000, 16384}, E in {1, 6, 8, 60, 64, 128, 256, 384, 600},
// k in {1, 2, 4, 8, E}, every score function, select mode, stage, renormalisation, bias, group
// limit, noise, aux-count mode, sequences, padding, NaN/Inf rows, f16/bf16 inputs and the
// golden peer logits; plus workspace errors, T = 0, determinism and CUDA-graph replay, the
// inference path (no sums) against the training path, and batch invariance (below).
#include <catch2/catch.hpp>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <moeroute/cuda/gating.cuh>
#include <moeroute/presets.hpp>
#include <moeroute/reference/gating.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "../common/gating_cases.hpp"
#include "../common/golden.hpp"
#include "gating_harness.cuh"
#include "graph_replay.cuh"

using namespace moeroute;

#define MOEROUTE_TEST_BACKEND "[cuda]"
#include "../common/gating_grid.inc"

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

namespace {
/// A bit-level case: the config for E (DeepSeek-V3 at 256, else a grid variant; a test may
/// change it), its logits (seed), its bias where the config takes one, and the buffers of one
/// call with padding.
struct bits_case {
  routing_config cfg;
  std::int64_t tokens;
  std::vector<float> logits, bias;
  bits_case(std::int32_t E, std::int64_t T, std::uint32_t seed)
      : cfg(E == 256 ? presets::deepseek_v3() : variant(E, 4, 5)),
        tokens(T),
        logits(grid_logits(T, E, seed)) {
    if (cfg.gating.expert_bias) bias = grid_bias(E);
  }
  [[nodiscard]] test::gating_buffers<float> buffers() const {
    return {cfg, logits, tokens, bias, some_padding(tokens)};
  }
};
}  // namespace

TEST_CASE("gating: two runs and a CUDA graph replay give identical bits", "[cuda][gating]") {
  for (std::int32_t E : {60, 256, 600}) {
    const std::int64_t T = 2000;
    bits_case c(E, T, 37);
    c.cfg.loss.sequence_length = 500;
    const routing_config& cfg = c.cfg;
    const auto& logits = c.logits;
    const auto& bias = c.bias;
    auto b = c.buffers();
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

TEST_CASE("gating: the logsumexp is optional, and so is the z sum without a z-loss",
          "[cuda][gating][quick]") {
  for (std::int32_t E : {60, 256}) {
    for (const float z_coefficient : {0.0f, 0.5f}) {
      bits_case c(E, 1000, 41);
      c.cfg.loss.z_coefficient = z_coefficient;
      const routing_config& cfg = c.cfg;
      INFO(describe(cfg, c.tokens));
      auto b = c.buffers();
      const auto full = b.download(b.run(cfg));
      REQUIRE(full.st.ok());

      // without the z sum a z-loss is an error naming it
      auto p = b.p;
      p.out.d_logsumexp = nullptr;
      p.out.sums.d_z_sum_squares = nullptr;
      auto s = cuda::gating(cfg, p, b.workspace.get(), b.workspace_bytes);
      if (z_coefficient != 0.0f) {
        REQUIRE(s.code == status_code::invalid_argument);
        REQUIRE(s.message.find("out.sums.d_z_sum_squares") != std::string::npos);
        p.out.sums.d_z_sum_squares = b.p.out.sums.d_z_sum_squares;  // the lse alone skipped
      }
      b.lse.fill_bytes(0xAB);
      b.z.fill_bytes(0xAB);
      b.ids.fill_bytes(0);
      b.aux_sum.fill_bytes(0);
      auto lean = b.download(cuda::gating(cfg, p, b.workspace.get(), b.workspace_bytes));
      REQUIRE(lean.st.ok());
      for (const float v : lean.logsumexp) {
        std::uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        REQUIRE(bits == 0xABABABABu);
      }
      if (z_coefficient == 0.0f) {
        std::uint64_t bits;
        std::memcpy(&bits, &lean.z_sum_squares, sizeof bits);
        REQUIRE(bits == 0xABABABABABABABABull);
        lean.z_sum_squares = full.z_sum_squares;
      }
      lean.logsumexp = full.logsumexp;
      REQUIRE(same_bits(full, lean));
    }
  }
}

TEST_CASE("gating: the inference path (training = false, no sums) routes as the training path",
          "[cuda][gating][quick]") {
  // E = 60 (4-slot rows), 256 (DeepSeek-V3: bias and groups), 600 (the generic kernel); with
  // sequences and padding. The inference call leaves every sum and per-token aux output null:
  // one kernel, no P row, no counts. Its ids, gates, reroute ids and logsumexp are the training
  // call's bits; a call with only the scalar sums gives the training call's scalars.
  for (std::int32_t E : {60, 256, 600}) {
    bits_case c(E, 300, 43);
    c.cfg.loss.sequence_length = 100;
    c.cfg.loss.z_coefficient = 0.001f;
    INFO(describe(c.cfg, c.tokens));
    auto b = c.buffers();
    const auto trained = b.download(b.run(c.cfg));
    REQUIRE(trained.st.ok());

    routing_config infer = c.cfg;
    infer.training = false;
    auto sums = b.p.out.sums;
    b.p.out.sums = {};
    b.p.out.d_aux_scores = nullptr;
    b.p.out.d_aux_count_ids = nullptr;
    b.ids.fill_bytes(0);
    b.gates.fill_bytes(0);
    b.lse.fill_bytes(0);
    const auto inferred = b.download(b.run(infer));
    REQUIRE(inferred.st.ok());
    REQUIRE(same_bytes(trained.ids, inferred.ids));
    REQUIRE(same_bytes(trained.gates, inferred.gates));
    REQUIRE(same_bytes(trained.reroute_ids, inferred.reroute_ids));
    REQUIRE(same_bytes(trained.logsumexp, inferred.logsumexp));

    // the scalars alone: valid tokens, z sum and non-finite count as the training call's
    b.p.out.sums.d_valid_tokens = sums.d_valid_tokens;
    b.p.out.sums.d_z_sum_squares = sums.d_z_sum_squares;
    b.p.out.sums.d_nonfinite = sums.d_nonfinite;
    b.valid_tokens.fill_bytes(0);
    b.z.fill_bytes(0);
    const auto scalars = b.download(b.run(infer));
    REQUIRE(scalars.st.ok());
    REQUIRE(scalars.valid_tokens == trained.valid_tokens);
    REQUIRE(std::memcmp(&scalars.z_sum_squares, &trained.z_sum_squares, sizeof(double)) == 0);
    REQUIRE(same_bytes(trained.ids, scalars.ids));

    // training = true still names a missing sum; so does a partial set of sequence sums
    b.p.out.sums = {};
    auto st = b.run(c.cfg);
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find("out.sums.d_aux_score_sum") != std::string::npos);
    b.p.out.sums.d_seq_count = sums.d_seq_count;
    st = b.run(infer);
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find("out.sums.d_seq_score_sum") != std::string::npos);
  }
}

// ---- batch invariance -------------------------------------------------------------------
// Batch invariance of the GPU gating: a token's ids, gates, reroute candidates, logsumexp and
// batch priority are bitwise the same whatever T is and wherever the token sits in the batch
// (docs/numerics.md, "Batch invariance"). Inference engines batch requests differently from run
// to run, and RL pipelines recompute a rollout's routing in a training batch: both need a token's
// routing to be its own. Holds because one group of lanes computes a token from its own row in
// a fixed order; only the sums across tokens (aux, z, counts) depend on the batch. Gating noise
// is keyed by the token's index (moeroute/rng.hpp), so noisy configs are position-dependent by
// design and not tested here.

namespace {

template <class T>
bool same_row(const std::vector<T>& a, std::int64_t ta, const std::vector<T>& b, std::int64_t tb,
              std::int64_t width) {
  if (width == 0) return true;
  return std::memcmp(a.data() + ta * width, b.data() + tb * width,
                     static_cast<std::size_t>(width) * sizeof(T)) == 0;
}

/// "" when token ta of batch a and token tb of batch b got the same bits, else what differs.
std::string same_token(const routing_config& cfg, const test::gpu_gating& a, std::int64_t ta,
                       const test::gpu_gating& b, std::int64_t tb) {
  const std::int64_t k = cfg.top_k, r = cfg.reroute_candidates();
  std::string what;
  if (!same_row(a.ids, ta, b.ids, tb, k)) what += " ids";
  if (!same_row(a.gates, ta, b.gates, tb, k)) what += " gates";
  if (!same_row(a.reroute_ids, ta, b.reroute_ids, tb, r)) what += " reroute_ids";
  if (!same_row(a.logsumexp, ta, b.logsumexp, tb, 1)) what += " logsumexp";
  if (!a.token_priority.empty() && !same_row(a.token_priority, ta, b.token_priority, tb, 1))
    what += " token_priority";
  return what.empty() ? ""
                      : "token " + std::to_string(ta) + " vs " + std::to_string(tb) + ":" + what;
}

/// rows [first, first + n) of a [T, E] matrix
std::vector<float> rows(const std::vector<float>& m, std::int32_t E, std::int64_t first,
                        std::int64_t n) {
  return {m.begin() + first * E, m.begin() + (first + n) * E};
}

}  // namespace

TEST_CASE("gating: a token's outputs do not depend on its batch", "[cuda][gating][invariance]") {
  struct named {
    const char* name;
    routing_config cfg;
  };
  routing_config kimi = test::variant(384, 8, 2);    // E = 384 (Kimi-K2's count), sigmoid
  routing_config wide = test::variant(512, 10, 0);   // k not a power of two
  wide.dispatch.dropped = drop_policy::next_choice;  // with reroute candidates
  const named cases[] = {
      {"mixtral (8 lanes a token)", presets::mixtral()},
      {"E = 16 (16 lanes)", test::variant(16, 4, 2)},
      {"olmoe", presets::olmoe()},
      {"qwen3", presets::qwen_moe()},
      {"deepseek-v3 (bias, groups)", presets::deepseek_v3()},
      {"E = 384, k = 8", kimi},
      {"E = 512, k = 10, reroute", wide},
      {"E = 600 (generic kernel), k = 6", test::variant(600, 6, 3)},
  };
  for (const auto& [name, cfg] : cases) {
    INFO(name);
    REQUIRE(!cfg.noise_active());
    const std::int32_t E = cfg.num_experts;
    const std::vector<float> bias =
        cfg.gating.expert_bias ? test::grid_bias(E) : std::vector<float>{};
    const std::int64_t T = 96;
    const auto logits = test::grid_logits(T, E, 7);
    const auto batch = test::run_gpu<float>(cfg, logits, T, bias);
    REQUIRE(batch.st.ok());

    // each token alone (T = 1)
    for (const std::int64_t t : {std::int64_t{0}, std::int64_t{37}, T - 1}) {
      const auto alone = test::run_gpu<float>(cfg, rows(logits, E, t, 1), 1, bias);
      REQUIRE(alone.st.ok());
      REQUIRE(same_token(cfg, batch, t, alone, 0) == "");
    }
    // the batch in reverse order: every token at another position, beside other tokens
    std::vector<float> reversed;
    for (std::int64_t t = T - 1; t >= 0; --t) {
      const auto row = rows(logits, E, t, 1);
      reversed.insert(reversed.end(), row.begin(), row.end());
    }
    const auto rev = test::run_gpu<float>(cfg, reversed, T, bias);
    REQUIRE(rev.st.ok());
    for (std::int64_t t = 0; t < T; ++t) REQUIRE(same_token(cfg, batch, t, rev, T - 1 - t) == "");
    // inside a larger batch of other tokens, at an offset no chunk or group boundary matches
    const std::int64_t big = 3 * T + 5, at = 151;
    auto embedded = test::grid_logits(big, E, 8);
    std::copy(logits.begin(), logits.end(), embedded.begin() + at * E);
    const auto large = test::run_gpu<float>(cfg, embedded, big, bias);
    REQUIRE(large.st.ok());
    for (std::int64_t t = 0; t < T; ++t) REQUIRE(same_token(cfg, batch, t, large, at + t) == "");
  }
}
