// SPDX-License-Identifier: Apache-2.0
// A complete MoE layer forward on the CPU with moeroute::core and plain g++:
//   router (x @ W_r) -> gating (top-2) -> capacity (factor 1.25, residual) -> padded layout
//   -> permute -> one tiny ReLU FFN per expert -> combine
// and a check of the result against a direct per-token computation.
//
//   g++ -std=c++20 -O2 -ffp-contract=off -I include examples/cpu_only.cpp -o cpu_only
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <moeroute/reference.hpp>

namespace {

// Deterministic pseudo-random values in [-scale, scale) (a small LCG; no <random> needed).
struct lcg {
  std::uint64_t s;
  float next(float scale) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return scale * (static_cast<float>(s >> 40) / 8388608.0f - 1.0f);
  }
};

// out[n, m] = a[n, kdim] @ b[kdim, m]
void matmul(const float* a, const float* b, float* out, std::int64_t n, std::int64_t kdim,
            std::int64_t m) {
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < m; ++j) {
      float acc = 0.0f;
      for (std::int64_t p = 0; p < kdim; ++p) acc += a[i * kdim + p] * b[p * m + j];
      out[i * m + j] = acc;
    }
}

// One expert: y = relu(x @ W1) @ W2, x [n, d], W1 [d, f], W2 [f, d].
void expert_ffn(const float* x, const float* w1, const float* w2, float* y, std::int64_t n,
                std::int64_t d, std::int64_t f) {
  std::vector<float> h(static_cast<std::size_t>(n * f));
  matmul(x, w1, h.data(), n, d, f);
  for (float& v : h) v = v > 0.0f ? v : 0.0f;
  matmul(h.data(), w2, y, n, f, d);
}

}  // namespace

int main() {
  using namespace moeroute;
  const std::int64_t T = 64, d = 16, ffn = 32;
  const std::int32_t E = 8, k = 2;

  // Routing: DeepSpeed-style top-2 with capacity factor 1.25, and residual pass-through for
  // tokens that lose every choice.
  routing_config cfg = presets::deepspeed_topk(E, k, /*factor=*/1.25, /*min_capacity=*/0);
  cfg.dispatch.dropped = drop_policy::residual;

  // Weights and a batch whose tokens lean towards experts 0 and 1, so some get dropped.
  lcg rng{42};
  std::vector<float> x(T * d), w_router(d * E), w1(E * d * ffn), w2(E * ffn * d);
  for (auto& v : x) v = rng.next(1.0f);
  for (auto& v : w_router) v = rng.next(0.5f);
  for (auto& v : w1) v = rng.next(0.3f);
  for (auto& v : w2) v = rng.next(0.3f);
  for (std::int64_t t = 0; t < T; ++t) x[t * d + 0] += 1.5f;  // a shared direction
  for (std::int64_t p = 0; p < d; ++p) w_router[p * E + 0] += p == 0 ? 1.0f : 0.0f;

  // 1. router logits [T, E]
  std::vector<float> logits(T * E);
  matmul(x.data(), w_router.data(), logits.data(), T, d, E);

  // [snippet:cpu-layer]
  // 2-3. gating + capacity assignment + losses, then the padded [E, C, d] layout
  const reference::routing_result r = reference::route<float>(cfg, logits, T);
  const reference::layout_output L = reference::layout(cfg, r.dispatch, layout_kind::padded);

  // 4. permute tokens into expert rows
  std::vector<float> xe(L.num_rows * d);
  reference::permute<float>(cfg, L, x, T, d, xe);

  // 5. each expert runs on its own segment of rows (padding rows are zero and ignored)
  std::vector<float> ye(L.num_rows * d, 0.0f);
  for (std::int32_t e = 0; e < L.total_experts; ++e) {
    const std::int64_t first = L.offsets[e], used = L.rows_used[e];
    if (used == 0) continue;
    expert_ffn(&xe[first * d], &w1[e * d * ffn], &w2[e * ffn * d], &ye[first * d], used, d, ffn);
  }

  // 6. combine back into token order (weighted by the gates; residual for fully dropped tokens)
  std::vector<float> y(T * d);
  reference::combine<float>(cfg, L, r.dispatch, ye, d, x, y);
  // [/snippet]

  // Check against a direct per-token computation of the same routing.
  double max_err = 0.0;
  std::int64_t passthrough = 0;
  std::vector<float> one(d);
  for (std::int64_t t = 0; t < T; ++t) {
    std::vector<float> want(d, 0.0f);
    bool any = false;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      if (r.dispatch.fates[a] != fate::kept) continue;
      any = true;
      const std::int32_t e = r.dispatch.expert[a];
      expert_ffn(&x[t * d], &w1[e * d * ffn], &w2[e * ffn * d], one.data(), 1, d, ffn);
      for (std::int64_t c = 0; c < d; ++c) want[c] += r.dispatch.weight[a] * one[c];
    }
    if (!any) {
      ++passthrough;
      for (std::int64_t c = 0; c < d; ++c) want[c] = x[t * d + c];
    }
    for (std::int64_t c = 0; c < d; ++c)
      max_err = std::fmax(max_err, std::fabs(static_cast<double>(want[c]) - y[t * d + c]));
  }

  const auto s = reference::compute_stats(r.dispatch, L);
  std::printf(
      "moeroute CPU MoE layer: T=%lld tokens, d=%lld, E=%d experts, top-%d, capacity factor %.2f\n",
      static_cast<long long>(T), static_cast<long long>(d), E, k, cfg.capacity.factor);
  std::printf("  capacity per expert C = %lld  (padded buffer: %lld rows, %.1f%% padding)\n",
              static_cast<long long>(r.dispatch.capacity), static_cast<long long>(L.num_rows),
              100.0 * s.padding_waste);
  std::printf("  assignments %lld: kept %lld, dropped %lld (drop rate %.1f%%)\n",
              static_cast<long long>(s.assignments), static_cast<long long>(s.kept),
              static_cast<long long>(s.dropped), 100.0 * s.drop_rate);
  std::printf("  tokens with no expert (residual pass-through): %lld\n",
              static_cast<long long>(s.fully_dropped_tokens));
  std::printf("  requests per expert (capacity %lld):\n",
              static_cast<long long>(r.dispatch.capacity));
  for (std::int32_t e = 0; e < E; ++e) {
    std::printf("    expert %d: %3lld requested, %3lld kept  ", e,
                static_cast<long long>(r.dispatch.requested[e]),
                static_cast<long long>(r.dispatch.kept[e]));
    for (std::int64_t i = 0; i < r.dispatch.requested[e]; ++i)
      std::putchar(i < r.dispatch.kept[e] ? '#' : '.');
    std::putchar('\n');
  }
  std::printf("  aux loss %.4f (1.0 = balanced), z-loss %.4f\n", r.losses.aux.value,
              r.losses.z.value);
  std::printf(
      "  layer output vs direct per-token computation: max |diff| = %.3g (%lld pass-through)\n",
      max_err, static_cast<long long>(passthrough));
  if (max_err > 1e-5 || passthrough != s.fully_dropped_tokens) {
    std::printf("MISMATCH\n");
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
