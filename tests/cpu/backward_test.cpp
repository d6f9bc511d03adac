// SPDX-License-Identifier: Apache-2.0
// The CPU backend's logit gradient (cpu::gating_backward) against reference::gating_backward
// on the backward config grid every backend runs (common/backward_cases.hpp: every score
// function, renormalisation and drop policy, noise, groups and bias, batch / sequence aux and
// z-loss terms, NaN / Inf and all-very-negative rows, f32 / f16 / bf16 logits), three passes
// each (weights, accumulate or overwrite, with and without the routing term): within 1e-6
// relative + 1e-9 absolute (both in double), serial and OpenMP bit-identical. The grid's rows
// take the row path; wide rows and many choices the element path (their own case below).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <moeroute/cpu/gating_backward.hpp>
#include <moeroute/reference.hpp>

#include "../common/backward_cases.hpp"

namespace moeroute::test {
namespace {

/// `padded`: the grid's padding tokens (grid_valid); without them every token is valid.
template <class Bits>
void check_logit_grads(const grid_logit_case& c, std::int64_t T, std::uint32_t seed,
                       bool repeat_ids = false, bool padded = true) {
  auto cfg = c.cfg;
  if (c.sequence) cfg.loss.sequence_length = T == 300 ? 60 : (T > 0 ? T : 1);
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;
  INFO("case " << c.name << ", T = " << T << ", element size " << sizeof(Bits));
  const auto x32 = grid_logits(T, E, seed, cfg.gating.score);
  std::vector<Bits> xb(x32.size());
  std::vector<float> x(x32.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    xb[i] = from_float<Bits>(x32[i]);
    x[i] = to_float(xb[i]);
  }
  std::vector<float> bias;
  if (c.bias) bias = random_values(E, seed + 7);
  for (auto& b : bias) b *= 0.1f;
  const auto valid = padded ? grid_valid(T) : std::vector<std::uint8_t>{};
  auto g = reference::gating<Bits>(cfg, std::span<const Bits>(xb), T, bias, valid);
  const auto d = reference::dispatch(cfg, g);
  // an engine's own ids may name an expert twice in a token (only dispatch rejects that):
  // every third token's second choice made its first, after dispatch
  if (repeat_ids && k >= 2)
    for (std::int64_t t = 0; t < T; t += 3)
      g.ids[static_cast<std::size_t>(t * k + 1)] = g.ids[static_cast<std::size_t>(t * k)];
  const auto dw = random_values(static_cast<std::size_t>(T * k), seed + 1);
  gating_backward_params<Bits> p;
  p.d_logits = xb.data();
  p.tokens = T;
  p.d_valid = valid.empty() ? nullptr : valid.data();
  p.gated = reference::view(g);
  p.dispatched.d_fate = d.fates.data();
  for (const auto& ps : backward_passes) {
    INFO("pass " << ps.name);
    std::vector<float> want(static_cast<std::size_t>(T * E), ps.accumulate ? 0.5f : 0.0f);
    reference::gating_backward(cfg, x, g, d, ps.routing ? dw : std::vector<float>{}, want, ps.w);
    std::vector<float> got(want.size(), ps.accumulate ? 0.5f : 123.0f), again(got);
    p.d_grad_weight = ps.routing ? dw.data() : nullptr;
    p.weights = ps.w;
    p.accumulate = ps.accumulate;
    p.d_grad_logits = got.data();
    const auto st = cpu::gating_backward(cfg, p, cpu::executor::serial());
    INFO(st.message);
    REQUIRE(st.ok());
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= 1e-6 * std::fabs(want[i]) + 1e-9))
        FAIL("d logits[" << i / E << ", " << i % E << "] = " << got[i] << ", reference "
                         << want[i]);
    p.d_grad_logits = again.data();
    REQUIRE(cpu::gating_backward(cfg, p).ok());  // OpenMP: the same bits
    REQUIRE(
        (got.empty() || std::memcmp(again.data(), got.data(), got.size() * sizeof(float)) == 0));
  }
}

}  // namespace

TEST_CASE("cpu gating_backward equals the reference over the backward grid", "[cpu][backward]") {
  const auto cases = grid_logit_cases();
  for (std::size_t i = 0; i < cases.size(); ++i)
    for (std::int64_t T : {0, 1, 7, 300}) {
      const auto seed = 100 + static_cast<std::uint32_t>(i * 7 + static_cast<std::size_t>(T));
      check_logit_grads<float>(cases[i], T, seed);
      check_logit_grads<half_bits>(cases[i], T, seed);
      check_logit_grads<bf16_bits>(cases[i], T, seed);
    }
}

TEST_CASE("cpu gating_backward equals the reference with repeated ids in a token",
          "[cpu][backward]") {
  const auto cases = grid_logit_cases();
  for (std::size_t i = 0; i < cases.size(); ++i)
    check_logit_grads<float>(cases[i], 300, 500 + static_cast<std::uint32_t>(i), true);
}

// The column path (rows of at most 8 experts: softmax, no noise on the gates, no sequence
// aux loss) takes only groups of W tokens without padding, and the grid pads every fifth
// token: the grid's narrow cases again with every token valid, so that the column path meets
// the reference too (selection-only noise chooses experts other than a token's largest logit,
// whose gates then take their own exps; checked to fail with those exps scaled).
TEST_CASE("cpu gating_backward equals the reference without padding", "[cpu][backward]") {
  const auto cases = grid_logit_cases();
  for (std::size_t i = 0; i < cases.size(); ++i)
    if (cases[i].cfg.num_experts <= 8)
      check_logit_grads<float>(cases[i], 300, 700 + static_cast<std::uint32_t>(i), false, false);
}

// Rows wider than the row path's 512, and more than its 64 choices, take the element path:
// the same checks on a softmax + aux + z config, a sigmoid + bias one and an after-drop one.
TEST_CASE("cpu gating_backward equals the reference on the element path", "[cpu][backward]") {
  std::vector<grid_logit_case> cases;
  {
    auto c = presets::qwen_moe(520, 4);
    c.loss.aux_coefficient = 0.01f;
    c.loss.z_coefficient = 0.001f;
    cases.push_back({"softmax, E = 520", c});
  }
  {
    auto c = presets::deepseek_v3(544, 8, 8, 4);
    c.loss.aux_coefficient = 0.01f;
    c.loss.z_coefficient = 0.001f;
    cases.push_back({"sigmoid, groups, bias, E = 544", c, true});
  }
  cases.push_back({"after-drop, k = 66 of 70", presets::deepspeed_topk(70, 66, 0.5, 1)});
  for (std::size_t i = 0; i < cases.size(); ++i) {
    check_logit_grads<float>(cases[i], 37, 900 + static_cast<std::uint32_t>(i));
    check_logit_grads<bf16_bits>(cases[i], 37, 950 + static_cast<std::uint32_t>(i));
  }
}

// The row path's bits are fixed: fixed lanes, no libm, no contraction (docs/numerics.md), so
// every ISA build (cpu_tests: SSE2, cpu_avx2_tests, cpu_native_tests) gives the same d logits.
// A hash of them on softmax and sigmoid configs, with every term, pinned here: a change to the
// row path's arithmetic must change this constant on purpose.
namespace {
/// cpu::gating_backward's params over T rows of logits x, the reference's gating g and
/// dispatch d, and the d weights dw of the routing term, onto out.
template <class Gated, class Dispatched>
gating_backward_params<float> params_of(const std::vector<float>& x, std::int64_t T, const Gated& g,
                                        const Dispatched& d, const std::vector<float>& dw,
                                        float* out, bool accumulate) {
  gating_backward_params<float> p;
  p.d_logits = x.data();
  p.tokens = T;
  p.gated = reference::view(g);
  p.dispatched.d_fate = d.fates.data();
  p.d_grad_weight = dw.data();
  p.accumulate = accumulate;
  p.d_grad_logits = out;
  return p;
}

/// FNV-1a over the d logits' bits of `cfgs` (every term, accumulated onto 0.25) on T = 96
/// tokens of logits in [-3, 3]; `wide`: a quarter of the rows with one logit 750 below the
/// rest, and rows whose smallest logit lies 699.9 / 700.1 below their largest (either side
/// of the bound under which exps_row leaves exp's clamp and subnormal scaling out);
/// `repeat_ids`: every third token names its first choice's expert again as its second.
std::uint64_t row_path_hash(std::vector<routing_config> cfgs, bool wide, bool repeat_ids = false) {
  std::uint64_t hash = 1469598103934665603ULL;
  for (auto& cfg : cfgs) {
    cfg.loss.aux_coefficient = 0.01f;
    cfg.loss.z_coefficient = 0.001f;
    const std::int64_t T = 96;
    const std::int32_t E = cfg.num_experts, k = cfg.top_k;
    // inputs from integers (std::normal_distribution's own float math contracts on FMA builds)
    std::uint64_t state = 77;
    const auto next = [&state](int span) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<float>(static_cast<int>((state >> 33) % (2 * span + 1)) - span);
    };
    std::vector<float> x(static_cast<std::size_t>(T * E));
    for (auto& v : x) v = next(1000) * 0.003f;
    for (std::int64_t t = 0; wide && t < T; ++t) {
      float* row = x.data() + t * E;
      const std::int64_t a = t % E, b = (t / 4 + 1) % E;
      if (t % 4 == 1) row[a] = -750.0f;
      if (t % 4 >= 2 && a != b) {
        row[a] = 3.0f;  // the largest, so the smallest is 699.9 or 700.1 below it
        row[b] = t % 4 == 2 ? -696.9f : -697.1f;
      }
    }
    const std::vector<float> bias(cfg.gating.expert_bias ? E : 0, 0.05f);
    auto g = reference::gating<float>(cfg, std::span<const float>(x), T, bias, {});
    const auto d = reference::dispatch(cfg, g);
    if (repeat_ids)  // every third token's second choice made its first (after dispatch)
      for (std::int64_t t = 0; t < T; t += 3)
        g.ids[static_cast<std::size_t>(t * k + 1)] = g.ids[static_cast<std::size_t>(t * k)];
    std::vector<float> dw(static_cast<std::size_t>(T * k));
    for (auto& v : dw) v = next(64) * (1.0f / 64);
    std::vector<float> out(static_cast<std::size_t>(T * E), 0.25f);
    const auto p = params_of(x, T, g, d, dw, out.data(), true);
    REQUIRE(cpu::gating_backward(cfg, p, cpu::executor::serial()).ok());
    for (const float v : out) {
      hash ^= std::bit_cast<std::uint32_t>(v);
      hash *= 1099511628211ULL;
    }
  }
  return hash;
}
}  // namespace

TEST_CASE("cpu gating_backward row path: the same bits on every ISA build", "[cpu][backward]") {
  CHECK(row_path_hash({presets::qwen_moe(64, 8), presets::deepseek_v3(64, 8, 8, 4),
                       presets::mixtral(8, 2), presets::switch_top1(29, 1.0, 1)},
                      false) == 0x7391559832d4f475ULL);
}

// Rows spread over more than 700 take exp's full path and narrower ones leave its clamp and
// subnormal scaling out (exps_row's `moderate`): pinned to the bits the full path gave for
// every row before that split (cc5b55b's tree), on Megatron's (64, 2), a 29-expert row with a
// tail vector, Qwen3's (128, 8) and Mixtral's column path (which splits the same way per group
// of W tokens). Checked to fail with the bound moved to -800, in the row path and in the column
// path, on AVX2 (AVX-512's vscalefpd makes the moderate path exact beyond the bound too).
TEST_CASE("cpu gating_backward row path: wide rows keep their bits", "[cpu][backward]") {
  CHECK(row_path_hash({presets::megatron(64, 2), presets::mixtral(8, 2),
                       presets::switch_top1(29, 1.0, 1), presets::qwen_moe(128, 8)},
                      true) == 0x96f08804ab03a0eeULL);
}

// An expert named twice in a token (an engine's own ids) gets both choices' routing parts,
// added in choice order before the row's other terms: pinned to the bits of the tree before
// the chosen parts were made after the row's last pass (a626373), with a tail vector (29),
// a row of two blocks (16), the dense part of a softmax before top-k (Qwen), without it
// (Megatron) and a sigmoid score (DeepSeek-V3).
TEST_CASE("cpu gating_backward row path: repeated ids keep their bits", "[cpu][backward]") {
  CHECK(row_path_hash({presets::megatron(64, 2), presets::qwen_moe(64, 8), presets::qwen_moe(29, 4),
                       presets::megatron(16, 4), presets::deepseek_v3(64, 8, 8, 4)},
                      false, true) == 0x5a18d737dad731bdULL);
}

// A token's gradient must not depend on where it sits in the batch: rows of at most 8
// experts go W tokens at a time through the column path (groups start where a task does),
// the rest of a task and any group with a padding token or a NaN through the row path. The
// same rows shifted by three tokens (the same sums: the batch is the same) land in other
// groups and paths; every token's bits must match.
TEST_CASE("cpu gating_backward: a token's bits do not depend on its position in the batch",
          "[cpu][backward]") {
  std::vector<routing_config> cfgs = {presets::mixtral(8, 2), presets::seed_reference(8, 2, 0.75),
                                      presets::deepspeed_top2(5, 0.5, 1),
                                      presets::deepspeed_topk(6, 6, 0.5, 1), presets::olmoe(64, 8)};
  {  // choices other than a token's largest logit: their gates take their own exps
    auto c = presets::mixtral(8, 2);
    c.gating.noise.kind = noise_kind::gaussian;
    c.gating.noise.scale = 1.0f;
    c.gating.noise.target = noise_target::selection_only;
    cfgs.push_back(c);
  }
  for (auto cfg : cfgs) {
    cfg.loss.aux_coefficient = 0.01f;
    cfg.loss.z_coefficient = 0.001f;
    INFO("E = " << cfg.num_experts << ", k = " << cfg.top_k);
    const std::int64_t T = 203;
    const std::int32_t E = cfg.num_experts, k = cfg.top_k;
    auto x = random_logits(T, E, 31);
    x[static_cast<std::size_t>(40 * E + 1)] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::uint8_t> valid(static_cast<std::size_t>(T), 1);
    valid[77] = 0;
    const auto g = reference::gating<float>(cfg, std::span<const float>(x), T, {}, valid);
    const auto d = reference::dispatch(cfg, g);
    const auto dw = random_values(static_cast<std::size_t>(T * k), 32);
    for (const bool accumulate : {false, true}) {
      std::vector<float> full(static_cast<std::size_t>(T * E), 0.5f), shifted(full);
      auto p = params_of(x, T, g, d, dw, full.data(), accumulate);
      p.d_valid = valid.data();
      REQUIRE(cpu::gating_backward(cfg, p, cpu::executor::serial()).ok());
      constexpr std::int64_t s = 3;
      p.d_logits += s * E;
      p.tokens = T - s;
      p.d_valid += s;
      p.gated.d_ids += s * k;
      p.gated.d_gates += s * k;
      p.dispatched.d_fate += s * k;
      p.d_grad_weight += s * k;
      p.d_grad_logits = shifted.data() + s * E;
      REQUIRE(cpu::gating_backward(cfg, p, cpu::executor::serial()).ok());
      for (std::size_t i = static_cast<std::size_t>(s * E); i < full.size(); ++i)
        if (std::bit_cast<std::uint32_t>(full[i]) != std::bit_cast<std::uint32_t>(shifted[i]))
          FAIL("token " << i / E << ", expert " << i % E << ": " << full[i] << " in the batch, "
                        << shifted[i] << " shifted by " << s);
    }
  }
}

// Writing the gradient (accumulate = false) takes shortcuts that hold only for a row that
// starts at +0 (the routing term's + 0 left out of a written row's vectors); accumulating onto
// rows of +0 takes none. The two must agree bit for bit, -0 included, on every path: rows
// (softmax before and after top-k, sigmoid, a tail vector), columns (Mixtral), elements.
TEST_CASE("cpu gating_backward: writing equals accumulating onto +0, bit for bit",
          "[cpu][backward]") {
  std::vector<routing_config> cfgs = {
      presets::olmoe(64, 8),  presets::megatron(64, 2),         presets::deepseek_v3(64, 8, 8, 4),
      presets::mixtral(8, 2), presets::switch_top1(29, 1.0, 1), presets::qwen_moe(520, 4)};
  for (auto cfg : cfgs)
    for (const bool losses : {true, false}) {  // (without them a routing term's -0 shows)
      cfg.loss.aux_coefficient = losses ? 0.01f : 0.0f;
      cfg.loss.z_coefficient = losses ? 0.001f : 0.0f;
      INFO("E = " << cfg.num_experts << ", k = " << cfg.top_k << ", losses " << losses);
      const std::int64_t T = 67;
      const std::int32_t E = cfg.num_experts, k = cfg.top_k;
      auto x = random_logits(T, E, 41);
      for (std::int64_t t = 0; t < T; t += 5)  // rows whose terms are exact zeros
        std::fill(x.begin() + t * E, x.begin() + (t + 1) * E, -0.0f);
      for (std::int64_t t = 1; t < T; t += 3)  // exps that underflow to 0: terms of -0 and +0
        for (std::int32_t e = 1; e < E; e += 2) x[static_cast<std::size_t>(t * E + e)] = -800.0f;
      const std::vector<float> bias(cfg.gating.expert_bias ? E : 0, 0.0f);
      const auto g = reference::gating<float>(cfg, std::span<const float>(x), T, bias, {});
      const auto d = reference::dispatch(cfg, g);
      auto dw = random_values(static_cast<std::size_t>(T * k), 42);
      for (std::size_t i = 0; i < dw.size(); i += 3) dw[i] = -0.0f;
      std::vector<float> written(static_cast<std::size_t>(T * E), 123.0f),
          accumulated(written.size(), 0.0f);
      auto p = params_of(x, T, g, d, dw, written.data(), false);
      REQUIRE(cpu::gating_backward(cfg, p, cpu::executor::serial()).ok());
      p.accumulate = true;
      p.d_grad_logits = accumulated.data();
      REQUIRE(cpu::gating_backward(cfg, p, cpu::executor::serial()).ok());
      for (std::size_t i = 0; i < written.size(); ++i)
        if (std::bit_cast<std::uint32_t>(written[i]) !=
            std::bit_cast<std::uint32_t>(accumulated[i]))
          FAIL("token " << i / E << ", expert " << i % E << ": " << written[i] << " written, "
                        << accumulated[i] << " accumulated onto +0");
    }
}

TEST_CASE("cpu gating_backward: bad params name the field", "[cpu][backward]") {
  const routing_config cfg = presets::mixtral(8, 2);
  std::vector<float> x(16 * 8), out(16 * 8);
  gating_backward_params<float> p;
  p.d_logits = x.data();
  p.tokens = 16;
  p.d_grad_logits = out.data();
  const std::vector<float> dw(32);
  p.d_grad_weight = dw.data();  // the routing term needs ids and fates
  const auto st = cpu::gating_backward(cfg, p);
  REQUIRE(st.code == status_code::invalid_argument);
  REQUIRE(st.message.find("gated.d_ids") != std::string::npos);
  // an id outside [0, E) in a valid token is named (the routing term indexes rows by it);
  // in a padding token it is not read
  std::vector<std::int32_t> ids(32, 1);
  const std::vector<fate> fates(32, fate::kept);
  p.gated.d_ids = ids.data();
  p.dispatched.d_fate = fates.data();
  p.weights = {1.0, 0.0, 0.0, 0.0};  // the routing term alone (no loss sums given)
  std::int64_t invalid_ids = 7;
  p.d_invalid_ids = &invalid_ids;  // the CUDA backend's count: 0 here, which refuses instead
  REQUIRE(cpu::gating_backward(cfg, p).ok());
  CHECK(invalid_ids == 0);
  ids[13] = 8;
  const auto bad = cpu::gating_backward(cfg, p);
  REQUIRE(bad.code == status_code::invalid_argument);
  REQUIRE(bad.message.find("gated.d_ids[13] = 8") != std::string::npos);
  ids[13] = -1;
  REQUIRE(cpu::gating_backward(cfg, p).code == status_code::invalid_argument);
  std::vector<std::uint8_t> valid(16, 1);
  valid[6] = 0;  // token 6 holds ids 12 and 13
  p.d_valid = valid.data();
  REQUIRE(cpu::gating_backward(cfg, p).ok());
  p.weights.routing = 0.0;  // no routing term: the ids are not read
  p.d_valid = nullptr;
  REQUIRE(cpu::gating_backward(cfg, p).ok());
  p.tokens = 0;
  REQUIRE(cpu::gating_backward(cfg, p).ok());
}

}  // namespace moeroute::test
