// SPDX-License-Identifier: Apache-2.0
// The backward launchers (gating_backward, combine_backward, permute_backward, expert_bias_update)
// against the CPU reference over a wider grid than backward_test.cu, with its tolerances: every
// score function, renormalisation and drop policy, noise, groups and bias, batch / sequence aux
// and z-loss terms, f32 / f16 / bf16 logits and elements, k = 1 .. E, T in {0, 1, 7, 300},
// hidden 1 .. 300, NaN / Inf and all-very-negative rows.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <moeroute/config_fields.hpp>
#include <moeroute/cuda/combine_backward.cuh>
#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/expert_bias_update.cuh>
#include <moeroute/cuda/gating_backward.cuh>
#include <moeroute/cuda/permute_backward.cuh>
#include <moeroute/names.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include "../common/backward_cases.hpp"
#include "device_forward.cuh"

using namespace moeroute;
namespace ref = moeroute::reference;
using cuda::device_buffer;
using moeroute::test::grid_logit_case;
using moeroute::test::grid_logit_cases;
using moeroute::test::grid_logits;
using moeroute::test::grid_valid;
using moeroute::test::random_logits;
using moeroute::test::random_values;

/// REQUIRE a status, printing its message when it fails.
#define REQUIRE_OK(expr)         \
  do {                           \
    const auto status_ = (expr); \
    INFO(status_.message);       \
    REQUIRE(status_);            \
  } while (0)

namespace {

using moeroute::bf16_bits;
using moeroute::half_bits;

/// Index of the first element with |got - want| > rel |want| + abs, or -1.
template <class A, class B>
std::int64_t first_mismatch(const A& got, const B& want, double rel, double abs) {
  if (got.size() != want.size()) return 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!(std::fabs(g - w) <= rel * std::fabs(w) + abs)) return static_cast<std::int64_t>(i);
  }
  return -1;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// The name of an element type, for messages.
template <class Bits>
constexpr const char* element_name() {
  return std::is_same_v<Bits, float> ? "f32" : (std::is_same_v<Bits, half_bits> ? "f16" : "bf16");
}
/// A host vector as device elements of the same bits.
template <class Bits>
auto as_device(const device_buffer<Bits>& b) {
  return reinterpret_cast<kernels::device_element_t<Bits>*>(b.get());
}

// ---------------------------------------------------------------------------------------------
// Logit gradients

template <class Bits>
void check_grid_logit_grads(const grid_logit_case& c, std::int64_t T, std::uint32_t seed) {
  auto cfg = c.cfg;
  if (c.sequence) cfg.loss.sequence_length = T == 300 ? 60 : (T > 0 ? T : 1);
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;
  INFO("case " << c.name << ", T = " << T << ", logits " << element_name<Bits>());
  const auto x32 = grid_logits(T, E, seed, cfg.gating.score);
  std::vector<Bits> xb(x32.size());
  std::vector<float> x(x32.size());  // what the kernel reads, as float
  for (std::size_t i = 0; i < x.size(); ++i) {
    xb[i] = from_float<Bits>(x32[i]);
    x[i] = to_float(xb[i]);
  }
  std::vector<float> bias;
  if (c.bias) bias = random_values(E, seed + 7);
  for (auto& b : bias) b *= 0.1f;
  const auto valid = grid_valid(T);
  const auto g = ref::gating<Bits>(cfg, std::span<const Bits>(xb), T, bias, valid);
  const auto d = ref::dispatch(cfg, g);
  const auto dw = random_values(T * k, seed + 1);

  device_buffer<Bits> d_x(xb);
  device_buffer<float> d_dw(dw), d_out(T * E);
  const moeroute::test::device_forward forward(g, d);
  cuda::gating_backward_params<kernels::device_element_t<Bits>> p;
  p.d_logits = as_device(d_x);
  p.tokens = T;
  forward.attach(p, valid.empty());  // no mask given: d_valid null, all valid
  p.d_grad_logits = d_out.get();

  for (const auto& ps : moeroute::test::backward_passes) {
    INFO("pass " << ps.name);
    std::vector<float> want(T * E, ps.accumulate ? 0.5f : 0.0f);
    ref::gating_backward(cfg, x, g, d, ps.routing ? dw : std::vector<float>{}, want, ps.w);
    d_out.upload(std::vector<float>(T * E, ps.accumulate ? 0.5f : 123.0f));
    p.d_grad_weight = ps.routing ? d_dw.get() : nullptr;
    p.weights = ps.w;
    p.accumulate = ps.accumulate;
    REQUIRE_OK(cuda::gating_backward(cfg, p));
    const auto got = d_out.download();
    const auto bad = first_mismatch(got, want, 1e-6, 1e-9);
    INFO("first mismatch at " << bad << " (token " << (bad >= 0 ? bad / E : -1) << ", expert "
                              << (bad >= 0 ? bad % E : -1) << "): emulated "
                              << (bad >= 0 ? got[bad] : 0.0f) << ", cpu "
                              << (bad >= 0 ? want[bad] : 0.0f));
    REQUIRE(bad == -1);
  }
}

// ---------------------------------------------------------------------------------------------
// Combine and permute backward

struct grid_combine_case {
  std::string name;
  routing_config cfg;
  bool padded;
};

std::vector<grid_combine_case> grid_combine_cases() {
  std::vector<grid_combine_case> v;
  v.push_back({"DeepSpeed top-2 padded, drops", presets::deepspeed_top2(8, 0.5, 1), true});
  v.push_back({"Switch residual padded, tight", presets::switch_top1(4, 0.5, 1), true});
  {
    auto c = presets::deepspeed_top2(6, 0.5, 1);
    c.dispatch.dropped = drop_policy::fallback;
    c.dispatch.fallback.expert = 0;
    v.push_back({"fallback to routed expert 0 (shared rows)", c, true});
  }
  {
    auto c = presets::deepspeed_top2(6, 0.5, 1);
    c.dispatch.dropped = drop_policy::fallback;
    c.dispatch.fallback.capacity = 3;
    v.push_back({"dedicated fallback expert, capacity 3", c, true});
  }
  {
    auto c = presets::deepspeed_top2(7, 0.5, 1);
    c.dispatch.dropped = drop_policy::next_choice;
    v.push_back({"next-choice reroute, compact", c, false});
  }
  v.push_back({"Mixtral compact (unbounded)", presets::mixtral(8, 2), false});
  {
    auto c = presets::deepspeed_topk(4, 4, 0.5, 1);
    c.dispatch.dropped = drop_policy::residual;
    v.push_back({"k = E = 4, residual, padded", c, true});
  }
  return v;
}

template <class Bits>
void check_grid_combine(const grid_combine_case& c, std::int64_t T, std::int64_t d,
                        bool accumulate) {
  using El = kernels::device_element_t<Bits>;
  INFO("case " << c.name << ", T = " << T << ", hidden = " << d << ", element "
               << element_name<Bits>() << ", permute accumulate " << accumulate);
  const auto x = grid_logits(T, c.cfg.num_experts, 21);
  const auto valid = grid_valid(T);
  const auto g = ref::gating(c.cfg, x, T, {}, valid);
  const auto dsp = ref::dispatch(c.cfg, g);
  const auto L = c.padded ? ref::layout(c.cfg, dsp, layout_kind::padded)
                          : ref::layout(c.cfg, dsp, layout_kind::compact, 4);
  const std::int32_t k = dsp.k;
  std::vector<Bits> eo(L.num_rows * d), dy(T * d);
  {
    const auto a = random_values(eo.size(), 22), b = random_values(dy.size(), 23);
    for (std::size_t i = 0; i < eo.size(); ++i) eo[i] = from_float<Bits>(a[i]);
    for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = from_float<Bits>(b[i]);
  }
  std::vector<Bits> w_eo(eo.size()), w_dx(dy.size());
  std::vector<float> w_dw(T * k);
  ref::combine_backward<Bits>(c.cfg, L, dsp, eo, d, dy, w_eo, w_dw, w_dx);
  std::vector<Bits> w_px = accumulate ? w_dx : std::vector<Bits>(dy.size(), from_float<Bits>(7.0f));
  ref::permute_backward<Bits>(c.cfg, L, dsp, w_eo, d, w_px, accumulate);

  device_buffer<Bits> d_eo(eo), d_dy(dy), g_eo(eo.size()), g_dx(dy.size()), g_px(dy.size());
  device_buffer<float> g_dw(T * k);
  const moeroute::test::device_layout forward(dsp, L);
  cuda::combine_backward_params<El> p;
  p.d_expert_out = as_device(d_eo);
  p.d_dy = as_device(d_dy);
  p.tokens = T;
  p.hidden = d;
  forward.attach(p);
  p.d_grad_expert_out = as_device(g_eo);
  p.d_grad_weight = g_dw.get();
  p.d_grad_x = as_device(g_dx);
  REQUIRE_OK(cuda::combine_backward(c.cfg, p));
  if (accumulate)  // on top of the residual part, as a training step does
    cuda::throw_if_cuda_error(
        cudaMemcpy(g_px.get(), g_dx.get(), dy.size() * sizeof(Bits), cudaMemcpyDeviceToDevice),
        "copy");
  else
    g_px.upload(std::vector<Bits>(dy.size(), from_float<Bits>(7.0f)));  // overwritten
  cuda::permute_backward_params<El> q;
  q.d_grad_buf = as_device(g_eo);
  q.tokens = T;
  q.hidden = d;
  forward.attach(q);
  q.accumulate = accumulate;
  q.d_grad_x = as_device(g_px);
  REQUIRE_OK(cuda::permute_backward(c.cfg, q));
  CHECK(same_bits(g_eo.download(), w_eo));
  CHECK(same_bits(g_dx.download(), w_dx));
  CHECK(same_bits(g_px.download(), w_px));
  const auto dw = g_dw.download();
  const auto bad = first_mismatch(dw, w_dw, 1e-5, 1e-6);
  INFO("d weight: first mismatch at " << bad << ": emulated " << (bad >= 0 ? dw[bad] : 0.0f)
                                      << ", cpu " << (bad >= 0 ? w_dw[bad] : 0.0f));
  CHECK(bad == -1);
  // without d x: the residual pass-through is skipped, the rest unchanged
  p.d_grad_x = nullptr;
  g_dw.fill_bytes(0xFF);
  REQUIRE_OK(cuda::combine_backward(c.cfg, p));
  CHECK(same_bits(g_dw.download(), dw));
}

}  // namespace

TEST_CASE("cuda backward grid: logit gradients over the config grid", "[cuda][backward][grid]") {
  const auto cases = grid_logit_cases();
  for (std::size_t i = 0; i < cases.size(); ++i)
    for (std::int64_t T : {0, 1, 7, 300}) {
      const auto seed = 100 + static_cast<std::uint32_t>(i * 7 + T);
      check_grid_logit_grads<float>(cases[i], T, seed);
      check_grid_logit_grads<half_bits>(cases[i], T, seed);
      check_grid_logit_grads<bf16_bits>(cases[i], T, seed);
    }
}

TEST_CASE("cuda backward grid: combine and permute backward over the config grid",
          "[cuda][backward][grid]") {
  for (const auto& c : grid_combine_cases())
    for (std::int64_t T : {0, 1, 7, 300}) {
      // hidden 1 (lanes without a column), 24, and 300 (more columns than threads)
      const std::vector<std::int64_t> hiddens =
          T == 300 ? std::vector<std::int64_t>{24} : std::vector<std::int64_t>{1, 24, 300};
      for (std::int64_t d : hiddens) {
        const bool acc = (d + T) % 2 == 0;
        check_grid_combine<float>(c, T, d, acc);
        check_grid_combine<half_bits>(c, T, d, !acc);
        check_grid_combine<bf16_bits>(c, T, d, acc);
      }
    }
}

TEST_CASE("cuda backward grid: expert-bias update over sizes and loads",
          "[cuda][backward][grid][bias]") {
  for (std::int32_t E : {1, 5, 37, 300, 8192})
    for (int loads = 0; loads < 3; ++loads)
      for (bool recenter : {false, true})
        for (float rate : {0.0f, 1e-3f, 0.25f}) {
          INFO("E = " << E << ", loads " << loads << ", recenter " << recenter << ", rate "
                      << rate);
          auto bias = random_values(E, 40 + E);
          std::vector<std::int64_t> load(E, 0);  // loads 0: all zero
          for (std::int32_t e = 0; e < E; ++e) {
            if (loads == 1) load[e] = 17;                                          // all equal
            if (loads == 2) load[e] = static_cast<std::int64_t>((e * 7919) % 23);  // mixed
          }
          device_buffer<float> d_bias(bias);
          device_buffer<std::int64_t> d_load(load);
          routing_config cfg;
          cfg.num_experts = E;
          cfg.top_k = 1;
          cfg.gating.bias_update = {rate, recenter};
          cuda::expert_bias_update_params p;
          p.d_bias = d_bias.get();
          p.d_load = d_load.get();
          REQUIRE_OK(cuda::expert_bias_update(cfg, p));
          ref::expert_bias_update(cfg, bias, load);
          CHECK(same_bits(d_bias.download(), bias));
        }
}

TEST_CASE("cuda backward grid: expert-bias rate accepted exactly when the reference accepts it",
          "[cuda][backward][grid][bias]") {
  device_buffer<float> d_bias(std::vector<float>{0.0f});
  device_buffer<std::int64_t> d_load(std::vector<std::int64_t>{0});
  cuda::expert_bias_update_params p;
  p.d_bias = d_bias.get();
  p.d_load = d_load.get();
  for (float rate :
       {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        0.0f, 3.1e38f, std::numeric_limits<float>::max()}) {
    INFO("rate " << rate);
    routing_config cfg;
    cfg.num_experts = 1;
    cfg.top_k = 1;
    cfg.gating.bias_update.rate = rate;
    bool ref_ok = true;
    std::vector<float> b{0.0f};
    try {
      ref::expert_bias_update(cfg, b, std::vector<std::int64_t>{0});
    } catch (const moeroute::error&) {
      ref_ok = false;
    }
    const auto st = cuda::expert_bias_update(cfg, p);
    CHECK(static_cast<bool>(st) == ref_ok);
    if (!ref_ok) CHECK(st.message.find("gating.bias_update.rate") != std::string::npos);
  }
}
