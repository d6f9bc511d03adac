// SPDX-License-Identifier: Apache-2.0
// Training steps of a tiny MoE layer on the CPU reference, forward and backward, with a router
// that starts collapsed (every token prefers expert 0). Two ways to balance it:
//   A. the aux loss: SGD on the router weights through gating_backward (task loss
//      through combine/permute backward + aux loss + z-loss);
//   B. aux-loss-free: the DeepSeek-V3 expert-bias update from loads accumulated over
//      micro-batches (a recomputed micro-batch, as activation checkpointing does, is ignored).
// Each prints, per step, the aux loss and the drop rate; both fall. Runs in well under a second.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

namespace ref = moeroute::reference;

namespace {

constexpr std::int64_t T = 256;  // tokens per micro-batch
constexpr std::int64_t D = 16;   // hidden size (feature 0 is a constant 1: a router bias input)
constexpr std::int32_t E = 8;    // experts

struct layer {
  std::vector<float> router;   // [D, E] logits = x router
  std::vector<float> experts;  // [E, D, D] expert e: out = in W_e (kept fixed here)
};

std::vector<float> tokens(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(T * D);
  for (std::int64_t t = 0; t < T; ++t) {
    x[t * D] = 1.0f;
    for (std::int64_t c = 1; c < D; ++c) x[t * D + c] = n(rng);
  }
  return x;
}

layer collapsed_layer() {
  layer l;
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.0f, 0.3f);
  l.router.resize(D * E);
  for (auto& w : l.router) w = n(rng);
  l.router[0 * E + 0] += 3.0f;  // the collapse: +3 on expert 0 for every token
  l.experts.resize(E * D * D);
  for (auto& w : l.experts) w = n(rng);
  return l;
}

std::vector<float> router_logits(const layer& l, const std::vector<float>& x) {
  std::vector<float> logits(T * E, 0.0f);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < D; ++c)
      for (std::int32_t e = 0; e < E; ++e) logits[t * E + e] += x[t * D + c] * l.router[c * E + e];
  return logits;
}

/// out rows = in rows times their expert's matrix (rows of the compact layout, by segment).
void experts_forward(const layer& l, const ref::layout_output& L, const std::vector<float>& in,
                     std::vector<float>& out) {
  out.assign(in.size(), 0.0f);
  for (std::int32_t e = 0; e < E; ++e)
    for (std::int64_t r = L.offsets[e]; r < L.offsets[e + 1]; ++r)
      for (std::int64_t i = 0; i < D; ++i)
        for (std::int64_t o = 0; o < D; ++o)
          out[r * D + o] += in[r * D + i] * l.experts[(e * D + i) * D + o];
}

/// d in = d out W_e^T (padding rows stay 0: their d out is 0).
void experts_backward(const layer& l, const ref::layout_output& L, const std::vector<float>& d_out,
                      std::vector<float>& d_in) {
  d_in.assign(d_out.size(), 0.0f);
  for (std::int32_t e = 0; e < E; ++e)
    for (std::int64_t r = L.offsets[e]; r < L.offsets[e + 1]; ++r)
      for (std::int64_t i = 0; i < D; ++i)
        for (std::int64_t o = 0; o < D; ++o)
          d_in[r * D + i] += d_out[r * D + o] * l.experts[(e * D + i) * D + o];
}

/// First and last aux loss and drop rate of a run.
struct trend {
  double aux0 = 0, aux1 = 0, drop0 = 0, drop1 = 0;
  [[nodiscard]] bool fell() const { return aux1 < aux0 && drop1 < drop0; }
};

trend part_a_aux_loss() {
  std::printf("A. aux loss (GShard top-2, capacity factor 1.0, aux coefficient 0.1, SGD lr 0.5)\n");
  auto cfg = moeroute::presets::gshard_top2(E, 1.0, 4);
  cfg.loss.aux_coefficient = 0.1f;
  cfg.loss.z_coefficient = 1e-3f;
  layer l = collapsed_layer();
  const auto x = tokens(2);
  std::vector<float> target(T * D);
  {
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.0f, 0.1f);
    for (auto& v : target) v = n(rng);
  }
  const float lr = 0.5f;
  trend tr;
  std::printf("  step   aux loss   drop rate   task loss\n");
  for (int step = 0; step < 30; ++step) {
    // forward
    const auto logits = router_logits(l, x);
    const auto r = ref::route<float>(cfg, logits, T);
    const auto L = ref::layout(cfg, r.dispatch, moeroute::layout_kind::compact);
    const auto stats = ref::compute_stats(r.dispatch, L);
    std::vector<float> buf(L.num_rows * D), out, y(T * D);
    ref::permute<float>(cfg, L, x, T, D, buf);
    experts_forward(l, L, buf, out);
    ref::combine<float>(cfg, L, r.dispatch, out, D, x, y);
    double task = 0.0;
    std::vector<float> dy(T * D);
    for (std::int64_t i = 0; i < T * D; ++i) {
      const float diff = y[i] - target[i];
      task += 0.5 * diff * diff / T;
      dy[i] = diff / static_cast<float>(T);
    }
    const double aux =
        r.losses.aux.value / cfg.loss.aux_coefficient;  // reported with coefficient 1
    if (step == 0) tr = {aux, 0, stats.drop_rate, 0};
    tr.aux1 = aux;
    tr.drop1 = stats.drop_rate;
    if (step % 3 == 0 || step == 29)
      std::printf("  %4d   %8.4f   %8.3f%%   %9.5f\n", step, aux, 100.0 * stats.drop_rate, task);

    // [snippet:cpu-backward]
    // backward: combine -> experts -> permute (d x, unused here), and the router's logits
    std::vector<float> d_out(L.num_rows * D), d_weight(T * cfg.top_k), d_x(T * D), d_buf;
    ref::combine_backward(cfg, L, r.dispatch, out, D, dy, d_out, d_weight, d_x);
    experts_backward(l, L, d_out, d_buf);
    ref::permute_backward(cfg, L, r.dispatch, d_buf, D, d_x, /*accumulate=*/true);
    std::vector<float> d_logits(T * E, 0.0f);
    ref::gating_backward(cfg, logits, r.gating, r.dispatch, d_weight, d_logits);
    // [/snippet]
    // d router = x^T d_logits; SGD
    for (std::int64_t c = 0; c < D; ++c)
      for (std::int32_t e = 0; e < E; ++e) {
        float g = 0.0f;
        for (std::int64_t t = 0; t < T; ++t) g += x[t * D + c] * d_logits[t * E + e];
        l.router[c * E + e] -= lr * g;
      }
  }
  return tr;
}

trend part_b_expert_bias() {
  trend tr;
  std::printf(
      "B. aux-loss-free: expert bias (DeepSeek-V3 sigmoid top-2, capacity factor 1.0,\n"
      "   rate 0.01, 2 micro-batches per step, micro-batch 0 recomputed)\n");
  auto cfg = moeroute::presets::deepseek_v3(E, 2, 1, 0);
  cfg.capacity.mode = moeroute::capacity_mode::factor;  // measure what a capacity would drop
  cfg.capacity.factor = 1.0;
  cfg.loss.aux_coefficient = 1.0f;  // only reported; the bias does the balancing
  cfg.gating.bias_update = {/*rate=*/0.01f, /*recenter=*/true};
  const layer l = collapsed_layer();
  const std::vector<float> micro[2] = {tokens(4), tokens(5)};
  const std::vector<float> logits[2] = {router_logits(l, micro[0]), router_logits(l, micro[1])};
  std::vector<float> bias(E, 0.0f);
  ref::expert_load_accumulator loads(E);
  std::printf("  step   aux loss   drop rate   bias[0]\n");
  for (int step = 0; step < 40; ++step) {
    loads.reset();
    double aux = 0.0, drop = 0.0;
    for (int mb = 0; mb < 2; ++mb) {
      const auto r = ref::route<float>(cfg, logits[mb], T, bias);
      loads.add(r.dispatch, mb);
      aux += r.losses.aux.value / 2;
      drop += ref::compute_stats(r.dispatch,
                                 ref::layout(cfg, r.dispatch, moeroute::layout_kind::compact))
                  .drop_rate /
              2;
    }
    // activation checkpointing recomputes micro-batch 0 during backward: not counted again
    if (loads.add(ref::route<float>(cfg, logits[0], T, bias).dispatch, 0))
      std::printf("  error: recomputed micro-batch counted twice\n");
    if (step == 0) tr = {aux, 0, drop, 0};
    tr.aux1 = aux;
    tr.drop1 = drop;
    if (step % 4 == 0 || step == 39)
      std::printf("  %4d   %8.4f   %8.3f%%   %+.3f\n", step, aux, 100.0 * drop, bias[0]);
    ref::expert_bias_update(cfg, bias, loads.counts());
  }
  return tr;
}

}  // namespace

int main() {
  const trend a = part_a_aux_loss();
  const trend b = part_b_expert_bias();
  const bool ok = a.fell() && b.fell();
  std::printf(
      "%s: aux loss %.3f -> %.3f and drop rate %.1f%% -> %.1f%% (aux loss); "
      "%.3f -> %.3f and %.1f%% -> %.1f%% (expert bias)\n",
      ok ? "OK" : "FAILED", a.aux0, a.aux1, 100 * a.drop0, 100 * a.drop1, b.aux0, b.aux1,
      100 * b.drop0, 100 * b.drop1);
  return ok ? 0 : 1;
}
