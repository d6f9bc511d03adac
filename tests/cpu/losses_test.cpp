// SPDX-License-Identifier: Apache-2.0
// cpu::losses and cpu::expert_bias_update against the reference, bit for bit; the z sum needed
// only with a z-loss.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <moeroute/cpu/expert_bias_update.hpp>
#include <moeroute/cpu/losses.hpp>
#include <moeroute/reference.hpp>

#include "../common/dispatch_cases.hpp"

namespace moeroute::test {

TEST_CASE("cpu losses and expert-bias update equal the reference bit for bit", "[cpu][losses]") {
  for (const std::int64_t L : {std::int64_t{0}, std::int64_t{7}, std::int64_t{50}}) {
    case_spec s;
    routing_config cfg = make_config(60, 4, s, 350);
    cfg.loss.sequence_length = L;
    cfg.loss.aux_coefficient = 0.01f;
    cfg.loss.z_coefficient = 0.001f;
    const auto g = make_gating(cfg, 350, 11, true);
    const auto want = reference::losses(cfg, g);
    double aux = -1, seq = -1, z = -1;
    loss_params p;
    p.tokens = g.tokens;
    p.sums = reference::view(g).sums;
    p.sums.d_z_sum_squares = &want.z.sum_squares;  // (gating_output keeps no z sum)
    p.d_aux_loss = &aux;
    p.d_sequence_aux_loss = &seq;
    p.d_z_loss = &z;
    REQUIRE(cpu::losses(cfg, p).ok());
    REQUIRE(std::memcmp(&aux, &want.aux.value, sizeof aux) == 0);
    REQUIRE(std::memcmp(&seq, &want.sequence_aux, sizeof seq) == 0);
    REQUIRE(std::memcmp(&z, &want.z.value, sizeof z) == 0);
    p.d_aux_loss = nullptr;
    p.sums.d_aux_count = nullptr;  // not needed without an aux output
    p.d_sequence_aux_loss = nullptr;
    REQUIRE(cpu::losses(cfg, p).ok());
    // the z sum is needed only with a z-loss: without one it is not read, and z is 0
    p.sums.d_z_sum_squares = nullptr;
    const auto st = cpu::losses(cfg, p);
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find("sums.d_z_sum_squares") != std::string::npos);
    routing_config no_z = cfg;
    no_z.loss.z_coefficient = 0.0f;
    z = -1;
    REQUIRE(cpu::losses(no_z, p).ok());
    REQUIRE(z == 0.0);
    REQUIRE(reference::losses(no_z, g).z.value == 0.0);
  }
  routing_config cfg;
  cfg.num_experts = 6;
  cfg.gating.bias_update.rate = 0.01f;
  for (const bool recenter : {false, true}) {
    cfg.gating.bias_update.recenter = recenter;
    std::vector<float> want = {0.1f, -0.2f, 0.0f, 0.05f, 0.3f, -0.1f}, got = want;
    const std::vector<std::int64_t> load = {10, 3, 7, 7, 0, 15};
    reference::expert_bias_update(cfg, want, load);
    REQUIRE(cpu::expert_bias_update(cfg, {got.data(), load.data()}).ok());
    REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  }
  REQUIRE(cpu::expert_bias_update(cfg, {nullptr, nullptr}).code == status_code::invalid_argument);
}

}  // namespace moeroute::test
