// SPDX-License-Identifier: Apache-2.0
// Smallest program that uses moeroute from another CMake project (the README's first example).
#include <cstdio>
#include <vector>

#include <moeroute/reference.hpp>

int main() {
  // [snippet:readme]
  namespace mr = moeroute;
  const mr::routing_config cfg =
      mr::presets::deepspeed_top2(/*experts=*/8, /*capacity factor=*/1.0);
  const std::int64_t T = 64;
  std::vector<float> logits(T * cfg.num_experts);  // [T, E] from your router
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = float((i * 37) % 11) / 4.0f;

  const auto r = mr::reference::route<float>(cfg, logits, T);  // gating + capacity + losses
  const auto layout = mr::reference::layout(cfg, r.dispatch, mr::layout_kind::padded);  // [E, C, d]
  const auto stats = mr::reference::compute_stats(r.dispatch, layout);

  std::printf("C=%lld kept=%lld dropped=%lld drop rate=%.3f aux=%.4f z=%.4f\n",
              (long long)r.dispatch.capacity, (long long)r.dispatch.total_kept,
              (long long)r.dispatch.total_dropped, stats.drop_rate, r.losses.aux.value,
              r.losses.z.value);
  // [/snippet]
  // every assignment is accounted for
  return r.dispatch.total_kept + r.dispatch.total_dropped == T * cfg.top_k ? 0 : 1;
}
