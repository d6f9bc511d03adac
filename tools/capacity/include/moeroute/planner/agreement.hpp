// SPDX-License-Identifier: Apache-2.0
// How often two routers disagree (routing replay, docs/replay.md): two dumps of router logits
// for the same tokens — a bf16 rollout engine and an fp32 trainer, or two checkpoints — routed
// with one config on the CPU backend, compared layer by layer. What an RL run on an MoE model
// needs to know before it trusts its importance ratios: how many tokens change experts, in how
// many layers, how much gate mass moves, and whether the flips sit on near-ties (numerics) or
// not (a real change of the router).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/cpu/gating.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/planner/cpu_route.hpp>
#include <moeroute/planner/npy_map.hpp>
#include <moeroute/status.hpp>

namespace moeroute::planner {

struct agreement_options {
  /// A flip is "near a tie" when, in dump A, the weakest chosen expert's logit is within this of
  /// the strongest unchosen one's (bf16 rounds logits near 1 by up to 2^-8).
  float tie_margin = 0.02f;
  std::int64_t batch_tokens = 4096;  ///< tokens gated per call (memory, not results)
  cpu::executor executor{};
  /// Called after each batch with (tokens done, total over all layers); may be empty.
  std::function<void(std::int64_t, std::int64_t)> progress;
};

/// One layer's comparison over every token.
struct layer_agreement {
  std::int64_t tokens = 0;         ///< tokens compared
  std::int64_t tokens_differ = 0;  ///< tokens whose set of k experts differs
  std::int64_t slots_differ = 0;   ///< experts of A's k missing from B's, over all tokens
  double gate_mass_moved = 0.0;    ///< sum over tokens of 0.5 * sum_e |gate_A(e) - gate_B(e)|
  std::int64_t near_ties = 0;      ///< differing tokens whose A margin is below tie_margin

  [[nodiscard]] double token_flip_rate() const noexcept {
    return tokens > 0 ? static_cast<double>(tokens_differ) / static_cast<double>(tokens) : 0.0;
  }
  [[nodiscard]] double slot_flip_rate(std::int32_t k) const noexcept {
    return tokens > 0 ? static_cast<double>(slots_differ) / static_cast<double>(tokens * k) : 0.0;
  }
  [[nodiscard]] double mean_gate_mass_moved() const noexcept {
    return tokens > 0 ? gate_mass_moved / static_cast<double>(tokens) : 0.0;
  }
  [[nodiscard]] double near_tie_share() const noexcept {
    return tokens_differ > 0 ? static_cast<double>(near_ties) / static_cast<double>(tokens_differ)
                             : 0.0;
  }
};

/// Every layer's comparison, and the tokens that differ in at least one layer.
struct agreement_report {
  std::int64_t tokens = 0;
  std::int32_t experts = 0, k = 0;
  std::vector<layer_agreement> layers;
  std::int64_t tokens_differ_any_layer = 0;

  [[nodiscard]] double any_layer_flip_rate() const noexcept {
    return tokens > 0 ? static_cast<double>(tokens_differ_any_layer) / static_cast<double>(tokens)
                      : 0.0;
  }
};

namespace detail {

/// Token t's comparison: adds to `l`, returns whether its expert sets differ.
inline bool compare_token(std::span<const float> xa, const std::int32_t* ia, const float* ga,
                          const std::int32_t* ib, const float* gb, std::int32_t k, float tie_margin,
                          layer_agreement& l) {
  std::int64_t missing = 0;
  double moved = 0.0;
  for (std::int32_t j = 0; j < k; ++j) {
    const std::int32_t* hit = std::find(ib, ib + k, ia[j]);
    if (hit == ib + k) {
      ++missing;
      moved += std::fabs(static_cast<double>(ga[j]));
    } else {
      moved += std::fabs(static_cast<double>(ga[j]) - static_cast<double>(gb[hit - ib]));
    }
  }
  for (std::int32_t j = 0; j < k; ++j)
    if (std::find(ia, ia + k, ib[j]) == ia + k) moved += std::fabs(static_cast<double>(gb[j]));
  ++l.tokens;
  l.slots_differ += missing;
  l.gate_mass_moved += 0.5 * moved;
  if (missing == 0) return false;
  ++l.tokens_differ;
  float weakest = FLT_MAX, strongest_out = -FLT_MAX;
  for (std::size_t e = 0; e < xa.size(); ++e) {
    const bool chosen = std::find(ia, ia + k, static_cast<std::int32_t>(e)) != ia + k;
    if (chosen) {
      weakest = std::min(weakest, xa[e]);
    } else {
      strongest_out = std::max(strongest_out, xa[e]);
    }
  }
  if (static_cast<double>(weakest) - static_cast<double>(strongest_out) < tie_margin) ++l.near_ties;
  return true;
}

}  // namespace detail

/// @brief Routes dumps `a` and `b` ([layers, T, E] or [T, E], the same shape) under `cfg` (E =
///        the dumps', no expert bias: a biased config routes with bias 0) and compares them.
/// @return success; invalid_argument naming what differs between the dumps or from cfg.
[[nodiscard]] inline status agreement(const routing_config& cfg, const mapped_logits& a,
                                      const mapped_logits& b, const agreement_options& o,
                                      agreement_report& out) {
  if (auto s = validate(cfg); !s) return s;
  if (a.layers() != b.layers() || a.tokens() != b.tokens() || a.experts() != b.experts())
    return status::make(status_code::invalid_argument,
                        "the two dumps differ in shape: [" + std::to_string(a.layers()) + ", " +
                            std::to_string(a.tokens()) + ", " + std::to_string(a.experts()) +
                            "] and [" + std::to_string(b.layers()) + ", " +
                            std::to_string(b.tokens()) + ", " + std::to_string(b.experts()) + "]");
  if (a.experts() != cfg.num_experts)
    return status::make(status_code::invalid_argument,
                        "the dumps have E = " + std::to_string(a.experts()) +
                            " experts, the config " + std::to_string(cfg.num_experts));
  if (o.batch_tokens < 1 || !(o.tie_margin >= 0.0f))
    return status::make(status_code::invalid_argument,
                        "agreement_options: batch_tokens >= 1 and tie_margin >= 0");
  const std::int64_t L = a.layers(), N = a.tokens();
  const std::int32_t E = cfg.num_experts, k = cfg.top_k;
  out = {};
  out.tokens = N;
  out.experts = E;
  out.k = k;
  out.layers.assign(static_cast<std::size_t>(L), {});
  std::vector<std::uint8_t> differ_any(static_cast<std::size_t>(N), 0);
  const std::vector<float> bias(cfg.gating.expert_bias ? static_cast<std::size_t>(E) : 0, 0.0f);
  std::vector<float> xa, xb;
  std::vector<std::int64_t> rows;
  std::int64_t done = 0;
  for (std::int64_t layer = 0; layer < L; ++layer) {
    layer_agreement& l = out.layers[static_cast<std::size_t>(layer)];
    for (std::int64_t t0 = 0; t0 < N; t0 += o.batch_tokens) {
      const std::int64_t T = std::min(o.batch_tokens, N - t0);
      rows.resize(static_cast<std::size_t>(T));
      for (std::int64_t i = 0; i < T; ++i) rows[static_cast<std::size_t>(i)] = t0 + i;
      xa.resize(static_cast<std::size_t>(T * E));
      xb.resize(static_cast<std::size_t>(T * E));
      a.gather(layer, rows, xa.data());
      b.gather(layer, rows, xb.data());
      const cpu_gated ra = cpu_gate(cfg, xa, T, bias, 1, o.executor);
      const cpu_gated rb = cpu_gate(cfg, xb, T, bias, 1, o.executor);
      if (!ra.st) return ra.st;
      if (!rb.st) return rb.st;
      for (std::int64_t t = 0; t < T; ++t) {
        const std::size_t at = static_cast<std::size_t>(t * k);
        const std::span<const float> row(xa.data() + t * E, static_cast<std::size_t>(E));
        if (detail::compare_token(row, &ra.g.ids[at], &ra.g.gates[at], &rb.g.ids[at],
                                  &rb.g.gates[at], k, o.tie_margin, l))
          differ_any[static_cast<std::size_t>(t0 + t)] = 1;
      }
      done += T;
      if (o.progress) o.progress(done, L * N);
    }
  }
  out.tokens_differ_any_layer =
      static_cast<std::int64_t>(std::count(differ_any.begin(), differ_any.end(), 1));
  return status::success();
}

}  // namespace moeroute::planner
