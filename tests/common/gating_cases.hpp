// SPDX-License-Identifier: Apache-2.0
// The config variants, k lists and padding masks the gating grids of every backend share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/reference/gating.hpp>

namespace moeroute::test {

/// Variant v of a config: cycles score function, select mode, stage and renormalisation so a
/// shape grid exercises all of them without a full cartesian product.
inline routing_config variant(std::int32_t E, std::int32_t k, int v) {
  routing_config c;
  c.num_experts = E;
  c.top_k = k;
  switch (v % 6) {
    case 0:  // softmax before top-k, select scores, renormalise (Qwen3)
      c.gating.select = select_from::scores;
      c.gating.renorm = renormalize::before_drop;
      break;
    case 1:  // softmax after top-k (Mixtral)
      c.gating.select = select_from::logits;
      c.gating.stage = softmax_stage::after_topk;
      break;
    case 2:  // sigmoid, select scores, renormalise with epsilon, scaling
      c.gating.score = score_function::sigmoid;
      c.gating.select = select_from::scores;
      c.gating.renorm = renormalize::before_drop;
      c.gating.renorm_epsilon = 1e-20f;
      c.gating.scaling_factor = 2.5f;
      break;
    case 3:  // sqrt-softplus on logits, no renormalisation
      c.gating.score = score_function::sqrt_softplus;
      c.gating.select = select_from::logits;
      break;
    case 4:  // softmax on logits, renormalise after drop (scaling deferred)
      c.gating.select = select_from::logits;
      c.gating.renorm = renormalize::after_drop;
      c.gating.scaling_factor = 1.5f;
      break;
    default:  // sqrt-softplus on scores, renormalise, fresh all-k counts
      c.gating.score = score_function::sqrt_softplus;
      c.gating.select = select_from::scores;
      c.gating.renorm = renormalize::before_drop;
      c.loss.counts = aux_counts::all_k;
      c.loss.count_source = aux_count_source::fresh_topk;
      break;
  }
  if (v % 2 == 1) c.loss.counts = aux_counts::all_k;
  return c;
}

inline std::vector<std::int32_t> ks_for(std::int32_t E) {
  std::vector<std::int32_t> ks;
  for (std::int32_t k : {1, 2, 4, 8, E})
    if (k <= E && std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
  return ks;
}

/// Valid mask with every 5th token (and token 3) padding.
inline std::vector<std::uint8_t> some_padding(std::int64_t T) {
  std::vector<std::uint8_t> v(static_cast<std::size_t>(T), 1);
  for (std::int64_t t = 0; t < T; ++t)
    if (t % 5 == 2 || t == 3) v[t] = 0;
  return v;
}

/// reference::gating on a harness's vector inputs: what every backend's check_gating compares
/// with.
template <class In>
reference::gating_output reference_gating(const routing_config& cfg, const std::vector<In>& logits,
                                          std::int64_t T, const std::vector<float>& bias,
                                          const std::vector<std::uint8_t>& valid) {
  return reference::gating<In>(cfg, std::span<const In>(logits), T, std::span<const float>(bias),
                               std::span<const std::uint8_t>(valid));
}

}  // namespace moeroute::test
