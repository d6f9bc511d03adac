// SPDX-License-Identifier: Apache-2.0
// Smallest program that uses moeroute from another CMake project.
#include <cstdio>
#include <vector>

#include <moeroute/reference.hpp>

int main() {
  const auto cfg = moeroute::presets::switch_top1(/*experts=*/4, /*factor=*/1.0);
  std::vector<float> logits = {3, 0, 0, 0,  3, 0, 0, 0,  0, 3, 0, 0,  3, 0, 0, 0};  // [4 tokens, 4 experts]
  const auto r = moeroute::reference::route<float>(cfg, logits, 4);
  std::printf("moeroute consumer: capacity %lld, kept %lld, dropped %lld\n",
              static_cast<long long>(r.dispatch.capacity),
              static_cast<long long>(r.dispatch.total_kept),
              static_cast<long long>(r.dispatch.total_dropped));
  return r.dispatch.total_kept + r.dispatch.total_dropped == 4 ? 0 : 1;
}
