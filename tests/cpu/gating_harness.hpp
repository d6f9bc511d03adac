// SPDX-License-Identifier: Apache-2.0
// Test harness for the CPU backend's gating: runs cpu::gating on host buffers and compares
// every output with reference::gating (common/gating_compare.hpp). Every call runs the
// backend three ways — serial, OpenMP, and a parallel-for hook that runs the tasks in
// reverse order — and requires the three to agree bit for bit before comparing; a fourth,
// lean serial run without the optional outputs must agree on everything else.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/cpu/gating.hpp>
#include <moeroute/reference/gating.hpp>

#include <moeroute/reference/views.hpp>

#include "../common/gating_cases.hpp"
#include "../common/gating_compare.hpp"
#include "reverse_order_run.hpp"

namespace moeroute::test {

/// Host buffers of one cpu::gating call.
template <class In>
struct cpu_gating_buffers {
  std::vector<In> logits;  // (+ misalign elements in front)
  std::vector<float> bias;
  std::vector<std::uint8_t> valid;
  gating_outputs g;
  std::vector<unsigned char> workspace;
  gating_params<In> p;

  cpu_gating_buffers(const routing_config& cfg, const std::vector<In>& h_logits, std::int64_t T,
                     const std::vector<float>& h_bias, const std::vector<std::uint8_t>& h_valid,
                     std::size_t misalign_elements)
      : logits(h_logits.size() + misalign_elements), bias(h_bias), valid(h_valid) {
    std::copy(h_logits.begin(), h_logits.end(), logits.begin() + misalign_elements);
    // every output the config has, per-token aux included, filled with garbage
    reference::resize_gating_outputs(g, cfg, T, {/*logsumexp=*/true, /*per_token_aux=*/true}, -7.0);
    workspace.assign(cpu::gating_workspace_bytes(cfg, T), 0xAB);
    p.d_logits = logits.data() + misalign_elements;
    p.tokens = T;
    p.d_bias = bias.empty() ? nullptr : bias.data();
    p.d_valid = valid.empty() ? nullptr : valid.data();
    p.out.d_ids = g.ids.data();
    p.out.d_gates = g.gates.data();
    p.out.d_reroute_ids = g.reroute_ids.data();
    p.out.d_logsumexp = g.logsumexp.data();
    p.out.d_token_priority = g.token_priority.data();
    p.out.d_second_skipped = g.second_skipped.data();
    p.out.d_aux_scores = g.aux_scores.data();
    p.out.d_aux_count_ids = g.aux_count_ids.data();
    p.out.sums = {g.aux_score_sum.data(), g.aux_count.data(), &g.valid_tokens,
                  &g.z_sum_squares,       &g.nonfinite,       g.seq_score_sum.data(),
                  g.seq_count.data(),     g.seq_tokens.data()};
  }

  gating_outputs run(const routing_config& cfg, const cpu::executor& ex) {
    g.st = cpu::gating(cfg, p, workspace.data(), workspace.size(), ex);
    return g;
  }
};

/// "" when two runs wrote the same bits everywhere.
inline std::string same_bits(const gating_outputs& a, const gating_outputs& b, const char* how) {
  const auto eq = [](const auto& x, const auto& y) {
    return x.size() == y.size() &&
           (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
  };
  const bool same = a.st.code == b.st.code && eq(a.ids, b.ids) && eq(a.gates, b.gates) &&
                    eq(a.reroute_ids, b.reroute_ids) && eq(a.logsumexp, b.logsumexp) &&
                    eq(a.token_priority, b.token_priority) &&
                    eq(a.second_skipped, b.second_skipped) && eq(a.aux_scores, b.aux_scores) &&
                    eq(a.aux_count_ids, b.aux_count_ids) && eq(a.aux_score_sum, b.aux_score_sum) &&
                    eq(a.aux_count, b.aux_count) && eq(a.seq_score_sum, b.seq_score_sum) &&
                    eq(a.seq_count, b.seq_count) && eq(a.seq_tokens, b.seq_tokens) &&
                    a.valid_tokens == b.valid_tokens && a.nonfinite == b.nonfinite &&
                    std::memcmp(&a.z_sum_squares, &b.z_sum_squares, sizeof(double)) == 0;
  return same ? "" : std::string("the ") + how + " run differs from the serial run";
}

/// The lean run: without the optional outputs (the logsumexp, the per-token aux rows and count
/// ids, and for a config without a z-loss the z sum), as an engine calls it. "" when it writes
/// none of them and the same bits as `serial` everywhere else.
template <class In>
std::string check_lean(const routing_config& cfg, cpu_gating_buffers<In>& b,
                       const gating_outputs& serial) {
  constexpr float unwritten = -7.0f;
  const bool no_z = cfg.loss.z_coefficient == 0.0f;
  b.g.logsumexp.assign(b.g.logsumexp.size(), unwritten);
  b.g.aux_scores.assign(b.g.aux_scores.size(), unwritten);
  b.g.aux_count_ids.assign(b.g.aux_count_ids.size(), -7);
  if (no_z) b.g.z_sum_squares = unwritten;
  const gating_params<In> full = b.p;
  b.p.out.d_logsumexp = nullptr;
  b.p.out.d_aux_scores = nullptr;
  b.p.out.d_aux_count_ids = nullptr;
  if (no_z) b.p.out.sums.d_z_sum_squares = nullptr;
  gating_outputs r = b.run(cfg, cpu::executor::serial());
  b.p = full;
  const auto untouched = [](const auto& v, auto mark) {
    for (const auto& x : v)
      if (std::memcmp(&x, &mark, sizeof x) != 0) return false;
    return true;
  };
  if (!untouched(r.logsumexp, unwritten)) return "logsumexp written with a null pointer";
  if (!untouched(r.aux_scores, unwritten)) return "aux_scores written with a null pointer";
  if (!untouched(r.aux_count_ids, std::int32_t{-7}))
    return "aux_count_ids written with a null pointer";
  if (no_z) {
    if (r.z_sum_squares != unwritten) return "z_sum_squares written with a null pointer";
    r.z_sum_squares = serial.z_sum_squares;
  }
  r.logsumexp = serial.logsumexp;
  r.aux_scores = serial.aux_scores;
  r.aux_count_ids = serial.aux_count_ids;
  return same_bits(serial, r, "lean");
}

/// Runs `b` serially, with OpenMP and through the reverse-order hook into `serial` (the
/// serial run's outputs); "" when the three wrote the same bits.
template <class In>
std::string run_three_ways(const routing_config& cfg, cpu_gating_buffers<In>& b,
                           gating_outputs& serial) {
  serial = b.run(cfg, cpu::executor::serial());
  if (auto m = same_bits(serial, b.run(cfg, cpu::executor{}), "OpenMP"); !m.empty()) return m;
  return same_bits(serial, b.run(cfg, cpu::executor{&reverse_order_run, nullptr, 0}),
                   "reverse-order");
}

/// Runs reference and CPU backend on the same inputs and compares; "" when they agree.
template <class In>
std::string check_gating(const routing_config& cfg, const std::vector<In>& logits, std::int64_t T,
                         const std::vector<float>& bias = {},
                         const std::vector<std::uint8_t>& valid = {},
                         std::size_t misalign_elements = 0) {
  const auto ref = reference_gating(cfg, logits, T, bias, valid);
  cpu_gating_buffers<In> b(cfg, logits, T, bias, valid, misalign_elements);
  gating_outputs serial;
  if (auto m = run_three_ways(cfg, b, serial); !m.empty()) return m;
  if (auto m = check_lean(cfg, b, serial); !m.empty()) return m;
  return compare(ref, serial);
}

}  // namespace moeroute::test
