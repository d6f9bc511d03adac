// SPDX-License-Identifier: Apache-2.0
// The CPU backend's gating (cpu::gating) against reference::gating: the whole gating grid the
// CUDA backend runs (common/gating_grid.inc: shapes, every option, groups, NLLB policies,
// reroute candidates, sequences and padding, NaN/Inf rows, f16/bf16, the golden peer logits),
// each case run serially, on OpenMP and through a reverse-order parallel-for hook with
// bit-identical results required; plus errors, T = 0 and both task plans of the sequences.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <moeroute/cpu/gating.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/reference/gating.hpp>

#include "../common/gating_cases.hpp"
#include "../common/golden.hpp"
#include "gating_harness.hpp"

using namespace moeroute;

#define MOEROUTE_TEST_BACKEND "[cpu]"
#include "../common/gating_grid.inc"

TEST_CASE("cpu gating: both task plans of the sequence sums", "[cpu][gating]") {
  // short sequences: a task holds whole sequences; long ones: a task is a piece of one
  for (const std::int64_t T : {4096, 20000}) {
    for (const std::int64_t L : {1, 2, 16, 64, 512, 4096}) {
      if (T % L != 0) continue;
      routing_config c = variant(64, 2, 0);
      c.loss.sequence_length = L;
      const auto plan = cpu::make_gating_plan(c, T);
      INFO(describe(c, T) << " tasks " << plan.tasks << " whole " << plan.whole_segments);
      REQUIRE(plan.tasks >= 1);
      REQUIRE(check_gating<float>(c, grid_logits(T, 64, 29), T, {}, some_padding(T)) == "");
    }
  }
}

TEST_CASE("cpu gating: errors name the argument, and T = 0 writes nothing", "[cpu][gating]") {
  routing_config c = presets::deepseek_v3();
  const std::int64_t T = 8;
  const auto logits = grid_logits(T, 256, 1);
  std::vector<float> bias = grid_bias(256);
  test::cpu_gating_buffers<float> b(c, logits, T, bias, {}, 0);
  REQUIRE(b.run(c, cpu::executor::serial()).st.ok());

  bias[17] = std::numeric_limits<float>::quiet_NaN();
  test::cpu_gating_buffers<float> nan_bias(c, logits, T, bias, {}, 0);
  const auto st = nan_bias.run(c, cpu::executor::serial()).st;
  REQUIRE(st.code == status_code::invalid_argument);
  REQUIRE(st.message.find("d_bias[17]") != std::string::npos);

  auto p = b.p;
  p.out.d_gates = nullptr;
  auto s = cpu::gating(c, p, b.workspace.data(), b.workspace.size());
  REQUIRE(s.code == status_code::invalid_argument);
  REQUIRE(s.message.find("out.d_gates") != std::string::npos);

  // the z sum is needed only with a z-loss (DeepSeek-V3 has none); the logsumexp never
  REQUIRE(c.loss.z_coefficient == 0.0f);
  auto no_lse = b.p;
  no_lse.out.d_logsumexp = nullptr;
  no_lse.out.sums.d_z_sum_squares = nullptr;
  REQUIRE(cpu::gating(c, no_lse, b.workspace.data(), b.workspace.size()).ok());
  routing_config with_z = c;
  with_z.loss.z_coefficient = 0.001f;
  s = cpu::gating(with_z, no_lse, b.workspace.data(), b.workspace.size());
  REQUIRE(s.code == status_code::invalid_argument);
  REQUIRE(s.message.find("out.sums.d_z_sum_squares") != std::string::npos);
  REQUIRE(s.message.find("loss.z_coefficient") != std::string::npos);

  s = cpu::gating(c, b.p, b.workspace.data(), b.workspace.size() - 1);
  REQUIRE(s.code == status_code::workspace_too_small);
  REQUIRE(s.message.find("gating_workspace_bytes") != std::string::npos);

  routing_config bad = c;
  bad.top_k = 0;
  s = cpu::gating(bad, b.p, b.workspace.data(), b.workspace.size());
  REQUIRE(s.code == status_code::invalid_config);

  auto zero = b.p;
  zero.tokens = 0;
  zero.d_logits = nullptr;
  REQUIRE(cpu::gating_workspace_bytes(c, 0) == 0);
  REQUIRE(cpu::gating(c, zero, nullptr, 0).ok());
}

TEST_CASE("cpu gating: the inference path (training = false, no sums) routes as the training path",
          "[cpu][gating]") {
  const auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() &&
           (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
  };
  for (const std::int32_t E : {60, 256}) {
    routing_config c = E == 256 ? presets::deepseek_v3() : variant(E, 4, 5);
    c.loss.sequence_length = 100;
    c.loss.z_coefficient = 0.001f;
    const std::int64_t T = 300;
    INFO(describe(c, T));
    const auto logits = grid_logits(T, E, 43);
    const std::vector<float> bias = c.gating.expert_bias ? grid_bias(E) : std::vector<float>{};
    test::cpu_gating_buffers<float> b(c, logits, T, bias, some_padding(T), 0);
    const auto trained = b.run(c, cpu::executor::serial());
    REQUIRE(trained.st.ok());

    routing_config infer = c;
    infer.training = false;
    test::cpu_gating_buffers<float> n(c, logits, T, bias, some_padding(T), 0);
    n.p.out.sums = {};
    n.p.out.d_aux_scores = nullptr;
    n.p.out.d_aux_count_ids = nullptr;
    const auto inferred = n.run(infer, cpu::executor::serial());
    REQUIRE(inferred.st.ok());
    REQUIRE(same(trained.ids, inferred.ids));
    REQUIRE(same(trained.gates, inferred.gates));
    REQUIRE(same(trained.reroute_ids, inferred.reroute_ids));
    REQUIRE(same(trained.logsumexp, inferred.logsumexp));
    REQUIRE(inferred.aux_score_sum[0] == -7.0);  // not written (the harness's fill)

    n.p.out.sums.d_valid_tokens = &n.g.valid_tokens;
    n.p.out.sums.d_z_sum_squares = &n.g.z_sum_squares;
    const auto scalars = n.run(infer, cpu::executor::serial());
    REQUIRE(scalars.st.ok());
    REQUIRE(scalars.valid_tokens == trained.valid_tokens);
    REQUIRE(std::memcmp(&scalars.z_sum_squares, &trained.z_sum_squares, sizeof(double)) == 0);

    n.p.out.sums = {};
    auto st = cpu::gating(c, n.p, n.workspace.data(), n.workspace.size());
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find("out.sums.d_aux_score_sum") != std::string::npos);
    REQUIRE(st.message.find("training = true") != std::string::npos);
  }
}
