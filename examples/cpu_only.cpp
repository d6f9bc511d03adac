// SPDX-License-Identifier: Apache-2.0
// Placeholder replaced by the examples work: routes one batch on the CPU and prints counts.
#include <cstdio>
#include <vector>

#include <moeroute/reference.hpp>

int main() {
  const auto cfg = moeroute::presets::mixtral();
  std::vector<float> logits(64 * 8);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 37) % 11) / 5.0f;
  const auto r = moeroute::reference::route<float>(cfg, logits, 64);
  std::printf("kept %lld of %lld assignments\n", static_cast<long long>(r.dispatch.total_kept),
              static_cast<long long>(r.dispatch.assignments()));
  return 0;
}
