// SPDX-License-Identifier: Apache-2.0
// GPU backward launchers against the CPU backward reference, on the forward's own decisions
// (ids, fates, layout, aux and sequence counts from the CPU reference, uploaded). Tolerances: logit
// gradients 1e-6 relative + 1e-9 absolute (both compute in double; device exp/log may differ by an
// ulp); d expert_out, d x and the bias update bitwise; d weight 1e-5 relative (warp dot order).
// Every launcher is run twice: the reruns must be bitwise identical. Every case is small and
// tagged [quick], so tests/gpu_check.sh runs them all under compute-sanitizer.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <moeroute/cuda/combine_backward.cuh>
#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/expert_bias_update.cuh>
#include <moeroute/cuda/gating_backward.cuh>
#include <moeroute/cuda/permute_backward.cuh>
#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include "../common/backward_cases.hpp"
#include "device_forward.cuh"

using namespace moeroute;
namespace ref = moeroute::reference;
using cuda::device_buffer;
using moeroute::test::random_logits;
using moeroute::test::random_values;

namespace {

struct logit_case {
  std::string name;
  routing_config cfg;
  std::int64_t T;
  std::vector<float> bias;
  std::vector<std::uint8_t> valid;
};

void check_logit_grads(const logit_case& c, std::uint32_t seed) {
  INFO("case " << c.name);
  const auto& cfg = c.cfg;
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;
  const auto x = random_logits(c.T, E, seed);
  const auto g = ref::gating(cfg, x, c.T, c.bias, c.valid);
  const auto d = ref::dispatch(cfg, g);
  const auto dw = random_values(c.T * k, seed + 1);
  std::vector<float> want(c.T * E, 0.5f);  // accumulate on top of a non-zero buffer
  gating_backward_weights w;
  w.routing = 0.75;
  w.aux = 2.0;
  w.sequence_aux = 3.0;
  w.z = 0.5;
  ref::gating_backward(cfg, x, g, d, dw, want, w);

  device_buffer<float> d_x(x), d_dw(dw), d_out(std::vector<float>(c.T * E, 0.5f));
  const moeroute::test::device_forward forward(g, d);
  cuda::gating_backward_params<float> p;
  p.d_logits = d_x.get();
  p.tokens = c.T;
  forward.attach(p);
  p.d_grad_weight = d_dw.get();
  p.weights = w;
  p.d_grad_logits = d_out.get();
  REQUIRE(cuda::gating_backward(cfg, p));
  cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
  const auto got = d_out.download();
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": gpu " << got[i] << ", cpu " << want[i]);
    REQUIRE(std::fabs(got[i] - want[i]) <= 1e-6 * std::fabs(want[i]) + 1e-9);
  }
  // rerun: bitwise identical
  d_out.upload(std::vector<float>(c.T * E, 0.5f));
  REQUIRE(cuda::gating_backward(cfg, p));
  cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
  const auto again = d_out.download();
  REQUIRE(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)) == 0);
  // overwrite mode ignores what was there
  d_out.upload(std::vector<float>(c.T * E, 123.0f));
  p.accumulate = false;
  REQUIRE(cuda::gating_backward(cfg, p));
  cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
  std::vector<float> want0(c.T * E, 0.0f);
  ref::gating_backward(cfg, x, g, d, dw, want0, w);
  const auto got0 = d_out.download();
  for (std::size_t i = 0; i < got0.size(); ++i)
    REQUIRE(std::fabs(got0[i] - want0[i]) <= 1e-6 * std::fabs(want0[i]) + 1e-9);
}

}  // namespace

TEST_CASE("cuda backward: logit gradients equal the CPU reference", "[cuda][backward][quick]") {
  std::vector<logit_case> cases;
  presets::megatron_options mo;
  mo.capacity_factor = 1.0;
  cases.push_back({"Megatron top-2 softmax after top-k, capacity 1.0",
                   presets::megatron(8, 2, mo),
                   64,
                   {},
                   {}});
  mo.pre_softmax = true;
  cases.push_back({"Megatron top-2 pre-softmax", presets::megatron(8, 2, mo), 64, {}, {}});
  cases.push_back({"DeepSpeed top-2 after drop", presets::deepspeed_top2(8, 0.5), 64, {}, {}});
  cases.push_back({"DeepSeek-V3 sigmoid, groups, bias",
                   presets::deepseek_v3(16, 4, 4, 2),
                   48,
                   std::vector<float>(16, 0.01f),
                   {}});
  {
    auto c = presets::qwen_moe(12, 3, true);
    c.gating.score = score_function::sqrt_softplus;
    cases.push_back({"sqrt-softplus, E = 12", c, 40, {}, {}});
  }
  {
    auto c = presets::mixtral(6, 2);
    c.gating.noise.kind = noise_kind::gaussian;
    c.gating.noise.scale = 0.3f;
    c.gating.noise.seed = 9;
    c.gating.noise.target = noise_target::selection_and_gates;
    std::vector<std::uint8_t> valid(32, 1);
    valid[3] = valid[17] = 0;
    cases.push_back({"Mixtral, noisy gates, padding", c, 32, {}, valid});
  }
  cases.push_back({"Switch top-1 residual", presets::switch_top1(5, 0.5), 30, {}, {}});
  {
    auto c = presets::deepseek_v3(8, 2, 4, 2);
    c.loss.sequence_length = 8;  // sequence-level aux (DeepSeek-V2/V3)
    std::vector<std::uint8_t> valid(32, 1);
    for (int t = 24; t < 32; ++t) valid[t] = 0;  // the last sequence is all padding
    valid[5] = 0;
    cases.push_back(
        {"DeepSeek-V3 sequence aux, padding", c, 32, std::vector<float>(8, 0.0f), valid});
    auto m = presets::mixtral(6, 2);
    m.loss.sequence_length = 5;
    cases.push_back({"Mixtral sequence aux (softmax P)", m, 30, {}, {}});
  }
  for (std::size_t i = 0; i < cases.size(); ++i)
    check_logit_grads(cases[i], 10 + static_cast<std::uint32_t>(i));
}

TEST_CASE("cuda backward: ids outside [0, E) skip their token's routing term and are counted",
          "[cuda][backward][quick]") {
  // the CPU backends refuse such ids; the kernel cannot without a sync, so it must not read a
  // logit at one (compute-sanitizer runs this case in tests/gpu_check.sh) and must say how
  // many tokens it skipped: the reference's gradient with those tokens' d weight zeroed
  presets::megatron_options mo;
  mo.capacity_factor = 1.0;
  for (const routing_config& cfg : {presets::megatron(8, 2, mo), presets::mixtral(24, 2)}) {
    const std::int32_t E = cfg.num_experts, k = cfg.top_k;
    INFO("E = " << E);
    const std::int64_t T = 32;
    const auto x = random_logits(T, E, 5);
    std::vector<std::uint8_t> valid(T, 1);
    valid[12] = 0;
    const auto g = ref::gating(cfg, x, T, {}, valid);
    const auto d = ref::dispatch(cfg, g);
    const auto dw = random_values(T * k, 6);
    std::vector<std::int32_t> bad_ids = g.ids;
    bad_ids[3 * k + 1] = -1;
    bad_ids[7 * k] = E;
    bad_ids[20 * k + 1] = 1 << 30;
    bad_ids[12 * k] = 99;  // a padding token: not read, not counted
    std::vector<float> dw_skipped = dw;
    for (const std::int64_t t : {3, 7, 20})
      for (std::int32_t j = 0; j < k; ++j) dw_skipped[t * k + j] = 0.0f;
    gating_backward_weights w;
    w.routing = 1.0;
    w.aux = 2.0;
    w.z = 0.5;
    std::vector<float> want(T * E, 0.0f);
    ref::gating_backward(cfg, x, g, d, dw_skipped, want, w);

    device_buffer<float> d_x(x), d_dw(dw), d_out(std::vector<float>(T * E, 0.0f));
    device_buffer<std::int32_t> d_bad_ids(bad_ids);
    device_buffer<std::int64_t> d_invalid(std::vector<std::int64_t>{-5});
    const moeroute::test::device_forward forward(g, d);
    cuda::gating_backward_params<float> p;
    p.d_logits = d_x.get();
    p.tokens = T;
    forward.attach(p);
    p.gated.d_ids = d_bad_ids.get();
    p.d_grad_weight = d_dw.get();
    p.weights = w;
    p.d_grad_logits = d_out.get();
    p.d_invalid_ids = d_invalid.get();
    REQUIRE(cuda::gating_backward(cfg, p));
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
    CHECK(d_invalid.download()[0] == 3);
    const auto got = d_out.download();
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i << ": gpu " << got[i] << ", cpu " << want[i]);
      REQUIRE(std::fabs(got[i] - want[i]) <= 1e-6 * std::fabs(want[i]) + 1e-9);
    }
    // the count restarts at every call; without the routing term no id is read or counted
    p.weights.routing = 0.0;
    REQUIRE(cuda::gating_backward(cfg, p));
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
    CHECK(d_invalid.download()[0] == 0);
  }
}

TEST_CASE("cuda backward: zero tokens and bad params", "[cuda][backward][quick]") {
  const auto cfg = presets::mixtral(8, 2);
  cuda::gating_backward_params<float> p;
  CHECK(cuda::gating_backward(cfg, p));  // T = 0
  p.tokens = 4;
  CHECK(cuda::gating_backward(cfg, p).code == status_code::invalid_argument);
  auto seq = cfg;
  seq.loss.sequence_length = 2;
  float dummy = 0;
  std::int64_t cnt = 0;
  p.d_logits = &dummy;
  p.d_grad_logits = &dummy;
  p.gated.sums.d_aux_count = &cnt;
  const auto st = cuda::gating_backward(seq, p);
  CHECK(st.code == status_code::invalid_argument);
  CHECK(st.message.find("gated.sums.d_seq_count") != std::string::npos);
  cuda::permute_backward_params<float> pp;
  pp.hidden = 4;
  CHECK(cuda::permute_backward(cfg, pp));
  pp.tokens = 3;
  CHECK(cuda::permute_backward(cfg, pp).code == status_code::invalid_argument);
  // T = 0 with a padded layout: rows = E * C > 0 (min_capacity), every one padding; the
  // [T, .] inputs are empty (null) and d expert_out must come out 0
  device_buffer<std::int32_t> rt(std::vector<std::int32_t>(6, -1));
  device_buffer<float> eo(std::vector<float>(6 * 4, 1.0f)), geo(6 * 4);
  geo.fill_bytes(0x7F);
  cuda::combine_backward_params<float> cp;
  cp.d_expert_out = eo.get();
  cp.layout.d_row_token = rt.get();
  cp.rows = 6;
  cp.hidden = 4;
  cp.d_grad_expert_out = geo.get();
  REQUIRE(cuda::combine_backward(cfg, cp));
  cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
  CHECK(geo.download() == std::vector<float>(6 * 4, 0.0f));
}

TEST_CASE("cuda backward: combine and permute backward equal the CPU reference",
          "[cuda][backward][quick]") {
  struct cc {
    const char* name;
    routing_config cfg;
    bool padded;
    std::int64_t d = 24;
  };
  auto fb = presets::deepspeed_top2(6, 0.5, 1);
  fb.dispatch.dropped = drop_policy::fallback;
  fb.dispatch.fallback.expert = 0;
  const cc cases[] = {{"DeepSpeed top-2 padded", presets::deepspeed_top2(8, 0.5), true},
                      {"Mixtral compact", presets::mixtral(8, 2), false},
                      {"Switch residual padded", presets::switch_top1(4, 0.5, 1), true},
                      {"fallback to routed expert 0 (shared rows)", fb, true},
                      // d = 0: the [., d] buffers are empty, d weight is still written (0)
                      {"Switch residual padded, d = 0", presets::switch_top1(4, 0.5, 1), true, 0}};
  for (const auto& c : cases) {
    INFO("case " << c.name);
    const std::int64_t T = 40, d = c.d;
    const auto x = random_logits(T, c.cfg.num_experts, 3);
    const auto g = ref::gating(c.cfg, x, T);
    const auto dsp = ref::dispatch(c.cfg, g);
    const auto L = c.padded ? ref::layout(c.cfg, dsp, layout_kind::padded)
                            : ref::layout(c.cfg, dsp, layout_kind::compact, 8);
    const std::int32_t k = dsp.k;
    const auto eo = random_values(L.num_rows * d, 4), dy = random_values(T * d, 5);
    std::vector<float> w_eo(L.num_rows * d), w_dw(T * k), w_dx(T * d);
    ref::combine_backward(c.cfg, L, dsp, eo, d, dy, w_eo, w_dw, w_dx);
    std::vector<float> w_px = w_dx;
    ref::permute_backward(c.cfg, L, dsp, w_eo, d, w_px, true);

    device_buffer<float> d_eo(eo), d_dy(dy), g_eo(L.num_rows * d), g_dw(T * k), g_dx(T * d);
    const moeroute::test::device_layout forward(dsp, L);
    cuda::combine_backward_params<float> p;
    p.d_expert_out = d_eo.get();
    p.d_dy = d_dy.get();
    p.tokens = T;
    p.hidden = d;
    forward.attach(p);
    p.d_grad_expert_out = g_eo.get();
    p.d_grad_weight = g_dw.get();
    p.d_grad_x = g_dx.get();
    REQUIRE(cuda::combine_backward(c.cfg, p));
    cuda::permute_backward_params<float> q;
    q.d_grad_buf = g_eo.get();
    q.tokens = T;
    q.hidden = d;
    forward.attach(q);
    q.accumulate = true;
    device_buffer<float> g_px(T * d);
    REQUIRE(cuda::combine_backward(c.cfg, p));
    if (d > 0)
      cuda::throw_if_cuda_error(
          cudaMemcpy(g_px.get(), g_dx.get(), T * d * sizeof(float), cudaMemcpyDeviceToDevice),
          "copy");
    q.d_grad_x = g_px.get();
    REQUIRE(cuda::permute_backward(c.cfg, q));
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
    CHECK(g_eo.download() == w_eo);
    CHECK(g_dx.download() == w_dx);
    CHECK(g_px.download() == w_px);
    const auto dw = g_dw.download();
    for (std::size_t i = 0; i < dw.size(); ++i)
      REQUIRE(dw[i] == Approx(w_dw[i]).epsilon(1e-5).margin(1e-6));
    // rerun: bitwise
    REQUIRE(cuda::combine_backward(c.cfg, p));
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
    CHECK(g_dw.download() == dw);
  }
}

TEST_CASE("cuda backward: expert-bias update equals the CPU reference bitwise",
          "[cuda][backward][bias][quick]") {
  std::vector<float> bias = random_values(37, 8);
  std::vector<std::int64_t> load(37);
  for (std::size_t e = 0; e < load.size(); ++e)
    load[e] = static_cast<std::int64_t>((e * 7919) % 23);
  device_buffer<float> d_bias(bias);
  device_buffer<std::int64_t> d_load(load);
  auto cfg = presets::deepseek_v3(37, 2, 0, 0);
  cfg.gating.bias_update = {0.01f, true};
  cuda::expert_bias_update_params p;
  p.d_bias = d_bias.get();
  p.d_load = d_load.get();
  REQUIRE(cuda::expert_bias_update(cfg, p));
  cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
  ref::expert_bias_update(cfg, bias, load);
  CHECK(d_bias.download() == bias);
}
