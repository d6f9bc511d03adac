// SPDX-License-Identifier: Apache-2.0
// Reference aux-loss, sequence aux-loss and z-loss gradients against central finite
// differences of their double forwards (tests/common/finite_difference.hpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include "../common/finite_difference.hpp"

using namespace moeroute;
using namespace moeroute::test;
namespace ref = moeroute::reference;

namespace {

void check_losses(const std::string& name, const routing_config& cfg, std::int64_t T,
                  const std::vector<float>& logits, const std::vector<float>& bias = {},
                  const std::vector<std::uint8_t>& valid = {}) {
  INFO("case " << name);
  const auto g = ref::gating(cfg, logits, T, bias, valid);
  const auto dsp = ref::dispatch(cfg, g);
  const auto x = to_double(logits);
  const std::int64_t TE = T * cfg.num_experts;
  // the double forwards are the real ones
  REQUIRE(aux_double(cfg, x, g) == Approx(ref::aux_loss(cfg, g).value).epsilon(1e-6));
  REQUIRE(z_double(cfg, x, g) == Approx(ref::z_loss(cfg, g).value).epsilon(1e-6));
  if (cfg.loss.sequence_length > 0)
    REQUIRE(seq_aux_double(cfg, x, g) == Approx(ref::sequence_aux_loss(cfg, g)).epsilon(1e-6));

  {
    std::vector<double> an(TE, 0.0);
    ref::aux_loss_backward<double>(cfg, x, g, an);
    check_fd_double([&](const std::vector<double>& xs) { return aux_double(cfg, xs, g); }, x, an);
    check_fd_float(
        [&](const std::vector<float>& xs) {
          ref::gating_output gp;
          require_same_decisions(cfg, xs, T, bias, valid, g, dsp, &gp);
          return ref::aux_loss(cfg, gp).value;
        },
        logits, an);
  }
  {
    std::vector<double> an(TE, 0.0);
    ref::z_loss_backward<double>(cfg, x, g, an);
    check_fd_double([&](const std::vector<double>& xs) { return z_double(cfg, xs, g); }, x, an);
    check_fd_float(
        [&](const std::vector<float>& xs) {
          return ref::z_loss(cfg, ref::gating(cfg, xs, T, bias, valid)).value;
        },
        logits, an);
  }
  if (cfg.loss.sequence_length > 0) {
    std::vector<double> an(TE, 0.0);
    ref::sequence_aux_loss_backward<double>(cfg, x, g, an);
    check_fd_double([&](const std::vector<double>& xs) { return seq_aux_double(cfg, xs, g); }, x,
                    an);
    check_fd_float(
        [&](const std::vector<float>& xs) {
          ref::gating_output gp;
          require_same_decisions(cfg, xs, T, bias, valid, g, dsp, &gp);
          return ref::sequence_aux_loss(cfg, gp);
        },
        logits, an);
  }
  // the one call: routing + aux + sequence aux + z, against the FD of the weighted total
  {
    const auto u = upstream(T * cfg.top_k, 77);
    gating_backward_weights w;
    w.routing = 0.5;
    w.aux = 2.0;
    w.sequence_aux = 3.0;
    w.z = 0.25;
    std::vector<double> an(TE, 0.0);
    ref::gating_backward<double>(cfg, x, g, dsp, u, an, w);
    const bool seq = cfg.loss.sequence_length > 0;
    check_fd_double(
        [&](const std::vector<double>& xs) {
          return w.routing * dot(u, weights_double(cfg, xs, g, dsp)) +
                 w.aux * aux_double(cfg, xs, g) +
                 (seq ? w.sequence_aux * seq_aux_double(cfg, xs, g) : 0.0) +
                 w.z * z_double(cfg, xs, g);
        },
        x, an);
  }
}

}  // namespace

TEST_CASE("backward: aux-loss, sequence aux-loss and z-loss gradients match finite differences",
          "[backward][losses]") {
  {
    auto c = presets::deepspeed_top2(4, 1.0, 1);  // softmax P, top-1 counts, E * sum
    c.loss.z_coefficient = 0.3f;
    check_losses("DeepSpeed top-2 aux + z", c, 10, separated_logits(10, 4, 80));
  }
  {
    presets::megatron_options o;  // fresh top-k counts, E/k scaling
    check_losses("Megatron top-2 (softmax)", presets::megatron(6, 2, o), 9,
                 separated_logits(9, 6, 81));
    o.score = score_function::sigmoid;
    o.groups = 3;
    o.group_topk = 1;
    o.expert_bias = true;
    o.scaling_factor = 2.5f;
    check_losses("Megatron sigmoid, normalised scores P = s / (sum s + 1e-20)",
                 presets::megatron(6, 2, o), 9, separated_logits(9, 6, 82),
                 {0.1f, -0.1f, 0.05f, 0.0f, 0.02f, -0.03f});
  }
  {
    auto c = plain(5, 2);
    c.gating.score = score_function::sqrt_softplus;
    c.gating.select = select_from::scores;
    c.loss.counts = aux_counts::all_k;
    c.loss.aux_coefficient = 0.01f;
    c.loss.sequence_length = 4;
    check_losses("sqrt-softplus, sequence aux (L = 4), coefficient 0.01", c, 12,
                 separated_logits(12, 5, 83));
  }
  {
    auto c = presets::mixtral(6, 2);
    c.loss.sequence_length = 3;
    // token 4 padding; the last sequence entirely padding (left out of the mean)
    check_losses("Mixtral, sequence aux with a valid mask", c, 9, separated_logits(9, 6, 84), {},
                 {1, 1, 1, 1, 0, 1, 0, 0, 0});
  }
  {
    // [L, S] packing, summed (TransformerEngine) and averaged (Megatron): 3 sequences of 4;
    // tokens 1 and 7 (sequence 1, positions 0 and 2) padding
    const std::vector<std::uint8_t> valid = {1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1};
    for (const auto peer :
         {presets::sequence_aux_peer::transformer_engine, presets::sequence_aux_peer::megatron}) {
      const auto c = presets::with_sequence_aux(presets::megatron(6, 2), 4, peer);
      check_losses(
          peer == presets::sequence_aux_peer::megatron ? "Megatron [L, S], mean" : "TE [L, S], sum",
          c, 12, separated_logits(12, 6, 85), {}, valid);
    }
  }
}

TEST_CASE("backward: global-batch aux loss from sums equals the unsharded gradient",
          "[backward][losses][sharding]") {
  // Two ranks each hold half a batch: the global loss uses the summed counts and token total;
  // each rank's gradient from aux_loss_backward_from_sums is its rows of the full gradient.
  presets::megatron_options o;
  const auto c = presets::megatron(6, 2, o);
  const std::int64_t T = 12, half = 6;
  const auto x = separated_logits(T, 6, 90);
  const auto g = ref::gating(c, x, T);
  std::vector<float> full(T * 6, 0.0f);
  ref::aux_loss_backward(c, x, g, full);
  std::vector<float> xa(x.begin(), x.begin() + half * 6), xb(x.begin() + half * 6, x.end());
  const auto ga = ref::gating(c, xa, half), gb = ref::gating(c, xb, half);
  std::vector<std::int64_t> counts(6);
  for (int e = 0; e < 6; ++e) counts[e] = ga.aux_count[e] + gb.aux_count[e];
  REQUIRE(counts == g.aux_count);
  std::vector<float> da(half * 6, 0.0f), db(half * 6, 0.0f);
  ref::aux_loss_backward_from_sums(c, xa, ga, counts, T, da);
  ref::aux_loss_backward_from_sums(c, xb, gb, counts, T, db);
  for (std::int64_t i = 0; i < half * 6; ++i) {
    CHECK(da[i] == full[i]);
    CHECK(db[i] == full[half * 6 + i]);
  }
  // and the forward: the loss from the summed sums is the unsharded loss
  std::vector<double> psum(6);
  for (int e = 0; e < 6; ++e) psum[e] = ga.aux_score_sum[e] + gb.aux_score_sum[e];
  CHECK(ref::aux_loss_from_sums(c, psum, counts, T) ==
        Approx(ref::aux_loss(c, g).value).epsilon(1e-12));
}
