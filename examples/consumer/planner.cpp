// SPDX-License-Identifier: Apache-2.0
// The capacity planner as a library (moeroute::planner), from another CMake project: one
// synthetic Zipf batch swept over three capacity factors on the CPU backend.
#include <cstdio>
#include <vector>

#include <moeroute/planner/scenarios.hpp>
#include <moeroute/planner/sweep.hpp>

int main() {
  namespace mp = moeroute::planner;
  const std::int64_t T = 256;
  const std::vector<float> logits =
      mp::make_logits(mp::scenario_kind::zipf, T, /*experts=*/16, mp::scenario_params{});
  mp::sweep_options o;
  o.base = moeroute::presets::deepspeed_top2(16, 1.0);
  o.factors = {{false, 1.0}, {false, 2.0}, {true, 0.0}};
  o.priorities = {std::nullopt};
  o.policies = {std::nullopt};
  const auto rows = mp::run_sweep(o, {{"zipf", "Zipf-skewed", T, logits}});
  for (const auto& r : rows)
    std::printf("factor %-8s C=%-5lld drop rate %.3f\n", r.factor.c_str(),
                static_cast<long long>(r.capacity), r.stats.drop_rate);
  // more capacity never drops more, and dropless drops nothing
  const bool ok = rows.size() == 3 && rows[1].stats.dropped <= rows[0].stats.dropped &&
                  rows[2].stats.dropped == 0;
  return ok ? 0 : 1;
}
