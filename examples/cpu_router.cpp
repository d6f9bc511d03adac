// SPDX-License-Identifier: Apache-2.0
// One MoE layer, forward and backward, on the fast CPU backend's owning router
// (moeroute::cpu::router): it holds every buffer for up to T tokens of D columns, and routes,
// permutes, combines and differentiates with one call each. The same layer on the CPU reference
// must give the same experts and slots for every assignment and the output within 1e-5 (the
// backend's exp may round an ulp away from libm's). Prints OK, or MISMATCH and exits 1.
//
//   g++ -std=c++20 -O3 -march=native -fopenmp -I include examples/cpu_router.cpp
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include <moeroute/cpu/router.hpp>
#include <moeroute/reference.hpp>

namespace mr = moeroute;

int main() {
  const std::int64_t T = 512, D = 32;
  std::vector<float> logits(T * 16), x(T * D);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = float((i * 7919) % 97) / 24.0f;
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 31) % 17) / 8.0f - 1.0f;

  // [snippet:readme-cpu]
  mr::presets::megatron_options mo;
  mo.capacity_factor = 1.25;  // Megatron-Core's routing with a capacity: some tokens drop
  const auto cfg = mr::presets::megatron(/*experts=*/16, /*k=*/2, mo);
  mr::cpu::router<float> router(cfg, /*max_tokens=*/T, /*hidden=*/D);  // owns every buffer
  std::span<float> expert_in, y;
  if (auto s = router.route(logits); !s) return std::puts(s.message.c_str()), 1;
  if (auto s = router.permute(x, expert_in); !s) return std::puts(s.message.c_str()), 1;
  const auto offsets = router.offsets();  // expert e owns rows [offsets[e], offsets[e + 1])
  for (std::int32_t e = 0; e < cfg.num_experts; ++e)  // your experts; here: scale by 1 + e/8
    for (std::int64_t i = offsets[e] * D; i < offsets[e + 1] * D; ++i)
      expert_in[i] *= 1.0f + float(e) / 8.0f;
  if (auto s = router.combine(expert_in, x, y); !s) return std::puts(s.message.c_str()), 1;
  // [/snippet]

  // backward of L = sum(y): d expert_out, then d x through the (linear) experts, d logits
  const std::vector<float> expert_out(expert_in.begin(), expert_in.end()), dy(T * D, 1.0f);
  std::span<float> d_expert_out, d_x, d_logits;
  if (auto s = router.combine_backward(dy, expert_out, d_expert_out); !s)
    return std::puts(s.message.c_str()), 1;
  for (std::int32_t e = 0; e < cfg.num_experts; ++e)
    for (std::int64_t i = offsets[e] * D; i < offsets[e + 1] * D; ++i)
      d_expert_out[i] *= 1.0f + float(e) / 8.0f;
  if (auto s = router.permute_backward(d_expert_out, d_x); !s)
    return std::puts(s.message.c_str()), 1;
  if (auto s = router.gating_backward(logits, d_logits); !s) return std::puts(s.message.c_str()), 1;

  // the same layer on the reference
  const auto r = mr::reference::route<float>(cfg, logits, T);
  const auto L = mr::reference::layout(cfg, r.dispatch, mr::layout_kind::padded);
  std::vector<float> rbuf(L.num_rows * D), ry(T * D);
  mr::reference::permute<float>(cfg, L, x, T, D, rbuf);
  for (std::int32_t e = 0; e < cfg.num_experts; ++e)
    for (std::int64_t row = L.offsets[e]; row < L.offsets[e + 1]; ++row)
      for (std::int64_t c = 0; c < D; ++c) rbuf[row * D + c] *= 1.0f + float(e) / 8.0f;
  mr::reference::combine<float>(cfg, L, r.dispatch, rbuf, D, x, ry);
  const auto& got = router.dispatched();
  bool same = router.totals().dropped == r.dispatch.total_dropped && router.rows() == L.num_rows;
  for (std::int64_t a = 0; a < T * cfg.top_k; ++a)
    same = same && got.d_expert[a] == r.dispatch.expert[a] && got.d_slot[a] == r.dispatch.slot[a];
  for (std::int64_t i = 0; i < T * D; ++i)
    same = same && std::fabs(y[i] - ry[i]) <= 1e-5f * (1.0f + std::fabs(ry[i]));
  // d x of sum(y): the sum of each token's kept weights times its experts' scales
  for (std::int64_t t = 0; t < T && same; ++t) {
    float want = 0.0f;
    for (std::int32_t j = 0; j < cfg.top_k; ++j) {
      const std::int64_t a = t * cfg.top_k + j;
      if (r.dispatch.fates[a] == mr::fate::kept)
        want += r.dispatch.weight[a] * (1.0f + float(r.dispatch.expert[a]) / 8.0f);
    }
    same = std::fabs(d_x[t * D] - want) <= 1e-5f * (1.0f + std::fabs(want));
  }
  double grad_norm = 0.0;
  for (float g : d_logits) grad_norm += double(g) * g;
  const auto losses = router.losses();
  same = same && std::fabs(losses.aux - r.losses.aux.value) <= 1e-9 * (1.0 + r.losses.aux.value) &&
         grad_norm > 0.0 && std::isfinite(grad_norm);
  std::printf(
      "C=%lld kept=%lld dropped=%lld aux=%.5f (reference %.5f) |d logits|^2=%.4g, %zu bytes\n",
      (long long)router.totals().capacity, (long long)router.totals().kept,
      (long long)router.totals().dropped, losses.aux, r.losses.aux.value, grad_norm,
      router.bytes());
  std::puts(same ? "OK" : "MISMATCH");
  return same ? 0 : 1;
}
