// SPDX-License-Identifier: Apache-2.0
// The capacity tool's router on the fast CPU backend (moeroute::cpu): a batch is gated once
// per gating-relevant variant of the sweep's configs (the reroute candidates R and whether
// token priorities are needed), and each sweep row then runs dispatch, layout and the losses
// on that gating. Outputs land in the reference's owning structs (zero copy: the backend
// writes into their vectors), so reference::compute_stats and the --check comparison read them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <moeroute/cpu.hpp>
#include <moeroute/reference.hpp>
#include <moeroute/reference/views.hpp>

namespace moeroute::planner {

/// What makes two configs of one sweep gate a batch differently (the rest is the preset).
struct gating_variant {
  std::int32_t reroute_candidates = 0;
  bool prioritized = false;
  bool z_loss = false;  ///< the logsumexp and z sum are computed
  friend bool operator==(const gating_variant&, const gating_variant&) = default;
};
inline gating_variant variant_of(const routing_config& cfg) {
  return {cfg.reroute_candidates(), cfg.dispatch.prio == priority::batch_prioritized,
          cfg.loss.z_coefficient != 0.0f};
}

/// One cpu::gating of a batch, owning its outputs.
struct cpu_gated {
  gating_variant variant;
  std::int64_t tokens = 0;
  reference::gating_output g;  // ids, gates, reroute ids, lse, priorities, sums (valid all 1)
  double z_sum = 0.0;
  std::int64_t nonfinite = 0;
  double us = 0.0;  ///< best time of one cpu::gating call, microseconds
  status st;

  /// The outputs: the logsumexp and z sum only with a z-loss (else g.logsumexp is empty and
  /// the pointers null, as an engine without one passes them).
  [[nodiscard]] gating_result outputs() { return outputs_of(*this); }
  [[nodiscard]] const_gating_result view() const { return outputs_of(*this); }

 private:
  template <class Self>
  static basic_gating_result<std::is_const_v<Self>> outputs_of(Self& s) {
    auto& g = s.g;
    const bool z = s.variant.z_loss;
    return {g.ids.data(),
            g.gates.data(),
            g.reroute_ids.data(),
            z ? g.logsumexp.data() : nullptr,
            {g.aux_score_sum.data(), g.aux_count.data(), &g.valid_tokens, z ? &s.z_sum : nullptr,
             &s.nonfinite, g.seq_score_sum.data(), g.seq_count.data(), g.seq_tokens.data()},
            g.token_priority.data(),
            g.second_skipped.data()};
  }
};

template <class F>
double best_us(int repeats, F&& f) {
  double best = INFINITY;
  for (int rep = 0; rep < std::max(repeats, 1); ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return best;
}

/// One batch's gating on the CPU backend with its outputs and workspace allocated once, as an
/// engine holds them from step to step: run() calls cpu::gating again on the same buffers.
class cpu_gating_call {
 public:
  cpu_gating_call(const routing_config& cfg, std::span<const float> logits, std::int64_t T,
                  std::span<const float> bias)
      : cfg_(cfg) {
    r_.variant = variant_of(cfg);
    r_.tokens = T;
    reference::gating_output& g = r_.g;
    const std::int64_t L = cfg.loss.sequence_length;
    g.tokens = T;
    g.experts = cfg.num_experts;
    g.k = cfg.top_k;
    g.reroute_candidates = r_.variant.reroute_candidates;
    g.sequences = L > 0 ? T / L : 0;
    // the buffers cpu::gating writes for this config (shapes.hpp): the logsumexp only with a
    // z-loss, as an engine without one passes none
    reference::resize_gating_outputs(g, cfg, T, {/*logsumexp=*/r_.variant.z_loss, false});
    g.valid.assign(static_cast<std::size_t>(T), 1);
    p_.d_logits = logits.data();
    p_.tokens = T;
    p_.d_bias = bias.empty() ? nullptr : bias.data();
    ws_.resize(cpu::gating_workspace_bytes(cfg, T));
  }

  /// One cpu::gating call; returns its time in microseconds (the status is result().st).
  double run(const cpu::executor& ex) {
    p_.out = r_.outputs();  // (r_ holds the sums the pointers name: set after any move)
    const auto t0 = std::chrono::steady_clock::now();
    r_.st = cpu::gating(cfg_, p_, ws_.data(), ws_.size(), ex);
    const auto t1 = std::chrono::steady_clock::now();
    r_.g.nonfinite_logits = r_.nonfinite;
    return std::chrono::duration<double, std::micro>(t1 - t0).count();
  }

  [[nodiscard]] const cpu_gated& result() const noexcept { return r_; }
  [[nodiscard]] cpu_gated take() { return std::move(r_); }

 private:
  routing_config cfg_;
  cpu_gated r_;
  gating_params<float> p_;
  std::vector<std::byte> ws_;
};

/// @brief Gates `logits` [T, E] under `cfg` with the CPU backend (timed, best of `repeats`).
inline cpu_gated cpu_gate(const routing_config& cfg, std::span<const float> logits, std::int64_t T,
                          std::span<const float> bias, int repeats, const cpu::executor& ex) {
  cpu_gating_call call(cfg, logits, T, bias);
  double best = INFINITY;
  for (int rep = 0; rep < std::max(repeats, 1); ++rep) best = std::min(best, call.run(ex));
  cpu_gated r = call.take();
  r.us = best;
  return r;
}

/// The stages after gating for one sweep row.
struct cpu_routed {
  reference::dispatch_output dispatch;
  reference::layout_output layout;
  double aux_loss = 0.0, z_loss = 0.0;
  double us = 0.0;  ///< best time of dispatch + layout + losses, microseconds
  status st;
};

/// @brief Dispatch, layout (padded, or compact with `block`) and losses of `gated` under `cfg`.
inline cpu_routed cpu_route_rest(const routing_config& cfg, const cpu_gated& gated, bool padded,
                                 std::int64_t block, int repeats, const cpu::executor& ex) {
  cpu_routed r;
  const std::int64_t T = gated.tokens, n = T * cfg.top_k;
  const std::int32_t E = cfg.num_experts, ET = cfg.total_experts();
  reference::dispatch_output& d = r.dispatch;
  d.tokens = T;
  d.k = cfg.top_k;
  d.experts = E;
  d.total_experts = ET;
  for (auto* v : {&d.expert, &d.slot}) v->resize(static_cast<std::size_t>(n));
  d.weight.resize(static_cast<std::size_t>(n));
  d.fates.resize(static_cast<std::size_t>(n));
  for (auto* v : {&d.requested, &d.kept, &d.rerouted, &d.dropped})
    v->resize(static_cast<std::size_t>(E));
  for (auto* v : {&d.received, &d.load}) v->resize(static_cast<std::size_t>(ET));
  dispatch_totals totals{};
  dispatch_params dp;
  dp.tokens = T;
  dp.gated = gated.view();
  dp.out = {
      d.expert.data(), d.slot.data(),     d.weight.data(),  d.fates.data(),    d.requested.data(),
      d.kept.data(),   d.rerouted.data(), d.dropped.data(), d.received.data(), d.load.data(),
      &totals};
  std::vector<std::byte> ws(cpu::dispatch_workspace_bytes(cfg, T));
  reference::layout_output& L = r.layout;
  const layout_kind kind = padded ? layout_kind::padded : layout_kind::compact;
  const std::int64_t bs = padded ? 1 : block;
  const std::int64_t max_rows = layout_max_rows(cfg, T, kind, bs);
  L.kind = kind;
  L.total_experts = ET;
  L.block_size = bs;
  L.offsets.resize(static_cast<std::size_t>(ET) + 1);
  L.rows_used.resize(static_cast<std::size_t>(ET));
  L.row_token.resize(static_cast<std::size_t>(std::max<std::int64_t>(max_rows, 0)));
  L.assignment_row.resize(static_cast<std::size_t>(n));
  L.block_expert.resize(padded ? 0 : L.row_token.size() / static_cast<std::size_t>(bs));
  layout_params lp;
  lp.kind = kind;
  lp.block_size = bs;
  lp.tokens = T;
  lp.max_rows = max_rows;
  lp.dispatched = dp.out;
  lp.out = {L.offsets.data(),
            L.rows_used.data(),
            L.row_token.data(),
            L.assignment_row.data(),
            padded ? nullptr : L.block_expert.data(),
            &L.num_rows};
  loss_params sp;
  sp.tokens = T;
  sp.sums = gated.view().sums;
  sp.d_aux_loss = &r.aux_loss;
  sp.d_z_loss = &r.z_loss;
  r.us = best_us(repeats, [&] {
    r.st = cpu::dispatch(cfg, dp, ws.data(), ws.size(), ex);
    if (r.st) r.st = cpu::layout(cfg, lp, ex);
    if (r.st) r.st = cpu::losses(cfg, sp, ex);
  });
  d.capacity = totals.capacity;
  d.fallback_capacity = totals.fallback_capacity;
  d.total_kept = totals.kept;
  d.total_rerouted = totals.rerouted;
  d.total_dropped = totals.dropped;
  d.total_masked = totals.masked;
  d.reroute_rounds = totals.reroute_rounds;
  L.row_token.resize(static_cast<std::size_t>(L.num_rows));
  L.block_expert.resize(padded ? 0 : static_cast<std::size_t>(L.num_rows / bs));
  return r;
}

/// @brief The --check of one sweep row: the CPU backend against the reference.
///        Required (else the message names what differs): the same gating ids and reroute ids
///        as reference::gating, gates within 1e-5, and — on the CPU backend's own gating —
///        exactly reference::dispatch's experts, slots, fates, counts, weights and
///        reference::layout's rows. Reported: how many assignments end with another fate than
///        the reference's own end-to-end routing; they can differ only where a priority ranks by
///        gate and two gates lie within their last-bit rounding (docs/numerics.md).
/// @return "ok", "ok, N fates differ end to end (gates within rounding)", or the failure
///         (which starts with "differs: ").
inline std::string check_against_reference(const routing_config& cfg, const cpu_gated& gated,
                                           const cpu_routed& got,
                                           const reference::routing_result& want, bool padded,
                                           std::int64_t block) {
  if (gated.g.ids != want.gating.ids) return "differs: gating ids";
  if (gated.g.reroute_ids != want.gating.reroute_ids) return "differs: gating reroute ids";
  for (std::size_t i = 0; i < gated.g.gates.size(); ++i)
    if (std::fabs(gated.g.gates[i] - want.gating.gates[i]) >
        1e-5f * std::fabs(want.gating.gates[i]) + 1e-30f)
      return "differs: gate[" + std::to_string(i) + "]";
  // the decisions, on the same gating: bit for bit
  const auto same = reference::dispatch(cfg, gated.g);
  const auto& d = got.dispatch;
  if (d.expert != same.expert || d.slot != same.slot || d.fates != same.fates)
    return "differs: dispatch fates / slots";
  if (d.requested != same.requested || d.kept != same.kept || d.dropped != same.dropped ||
      d.rerouted != same.rerouted || d.received != same.received || d.load != same.load ||
      d.capacity != same.capacity || d.totals().kept != same.totals().kept)
    return "differs: dispatch counts";
  if (d.weight.size() != same.weight.size() ||
      (!d.weight.empty() &&
       std::memcmp(d.weight.data(), same.weight.data(), d.weight.size() * sizeof(float)) != 0))
    return "differs: dispatch weights";
  const auto L = padded ? reference::layout(cfg, same, layout_kind::padded)
                        : reference::layout(cfg, same, layout_kind::compact, block);
  if (got.layout.num_rows != L.num_rows || got.layout.offsets != L.offsets ||
      got.layout.row_token != L.row_token || got.layout.assignment_row != L.assignment_row)
    return "differs: layout";
  std::int64_t moved = 0;
  for (std::size_t a = 0; a < d.fates.size(); ++a)
    moved += d.fates[a] != want.dispatch.fates[a] ? 1 : 0;
  return moved == 0
             ? "ok"
             : "ok, " + std::to_string(moved) + " fates differ end to end (gates within rounding)";
}

}  // namespace moeroute::planner
