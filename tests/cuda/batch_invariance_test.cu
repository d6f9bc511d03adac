// SPDX-License-Identifier: Apache-2.0
// Batch invariance of the GPU gating: a token's ids, gates, reroute candidates, logsumexp and
// batch priority are bitwise the same whatever T is and wherever the token sits in the batch
// (docs/numerics.md, "Batch invariance"). Inference engines batch requests differently from run
// to run, and RL pipelines recompute a rollout's routing in a training batch: both need a token's
// routing to be its own. Holds because one group of lanes computes a token from its own row in
// a fixed order; only the sums across tokens (aux, z, counts) depend on the batch. Gating noise
// is keyed by the token's index (moeroute/rng.hpp), so noisy configs are position-dependent by
// design and not tested here.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/presets.hpp>

#include "../common/gating_cases.hpp"
#include "gating_harness.cuh"

using namespace moeroute;

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
