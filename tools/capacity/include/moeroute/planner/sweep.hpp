// SPDX-License-Identifier: Apache-2.0
// The capacity sweep: one batch of router logits, routed under every (capacity factor,
// priority, drop policy) on the fast CPU backend (gating once per batch and gating variant,
// cpu_route.hpp) or on the reference, measured with reference::compute_stats; --check routes
// every row on both and requires the same decisions.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/names.hpp>
#include <moeroute/reference.hpp>

#include <moeroute/planner/cpu_route.hpp>

namespace moeroute::planner {

/// A capacity choice: a factor, or dropless (capacity_mode::unbounded).
struct factor_choice {
  bool dropless = false;
  double factor = 1.0;
  [[nodiscard]] std::string label() const {
    if (dropless) return "dropless";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", factor);
    return buf;
  }
};

enum class layout_choice { automatic, padded, compact };

/// One batch to sweep: a name and [T, E] logits.
struct sweep_input {
  std::string name;         ///< scenario name, or the .npy file / layer
  std::string description;  ///< e.g. "zipf s=1.2"
  std::int64_t tokens = 0;
  std::span<const float> logits;  ///< [T, E]
};

struct sweep_options {
  routing_config base;  ///< the preset (E and k set)
  std::vector<factor_choice> factors;
  std::vector<std::optional<priority>> priorities;   ///< nullopt = the preset's own
  std::vector<std::optional<drop_policy>> policies;  ///< nullopt = the preset's own
  layout_choice layout = layout_choice::automatic;
  std::int64_t block_size = 16;  ///< compact layout segment alignment
  std::int64_t hidden = 4096;
  dtype buffer_dtype = dtype::bf16;
  int repeats = 1;                 ///< timed calls per row; the minimum is reported
  bool reference_backend = false;  ///< route on reference:: instead of the CPU backend
  bool check = false;              ///< also route on the reference and compare (CPU backend)
  cpu::executor executor{};        ///< the CPU backend's threads
};

/// One row of the result table.
struct sweep_row {
  std::string scenario;
  std::int64_t tokens = 0;
  std::int32_t experts = 0, top_k = 0;
  std::string factor;         ///< "1.25" or "dropless"
  double factor_value = NAN;  ///< NaN for dropless
  std::int64_t capacity = 0;  ///< per routed expert; -1 = unbounded
  std::string priority_name, policy_name, layout_name;
  reference::routing_stats stats;
  double max_over_mean = 0.0;
  std::int64_t buffer_bytes = 0;  ///< layout rows * hidden * element size
  double aux_loss = 0.0, z_loss = 0.0;
  double cpu_us = 0.0;     ///< one routing call (gating + dispatch + layout + losses), microseconds
  double gating_us = 0.0;  ///< of which gating (once per batch and gating variant)
  std::string check;       ///< --check: "ok", or what differs from the reference
};

/// @brief The config of one sweep row: `base` with the factor (or dropless), and the priority
///        and drop policy when given (nullopt: the base's own).
/// @return the config, or an error status for a combination validate() rejects.
inline status sweep_config(const routing_config& base, const factor_choice& f,
                           const std::optional<priority>& p, const std::optional<drop_policy>& d,
                           routing_config& out) {
  out = base;
  out.training = true;
  if (f.dropless) {
    out.capacity.mode = capacity_mode::unbounded;
    out.capacity.group_tokens = 0;  // nothing is bounded, per group or not
  } else {
    out.capacity.mode = capacity_mode::factor;
    out.capacity.factor = f.factor;
    out.capacity.eval_factor = std::numeric_limits<double>::quiet_NaN();
  }
  if (p) out.dispatch.prio = *p;
  if (d) {
    out.dispatch.dropped = *d;
    if (*d == drop_policy::fallback) out.dispatch.fallback = {-1, -1};  // shared expert, unbounded
  }
  return validate(out);
}

/// @brief Routes one input under one config and measures it; `gated` is the input's CPU
///        gating for cfg's gating variant (unused with the reference backend).
inline sweep_row run_one(const sweep_options& o, const sweep_input& in, const routing_config& cfg,
                         const factor_choice& f, const cpu_gated& gated) {
  sweep_row r;
  r.scenario = in.name;
  r.tokens = in.tokens;
  r.experts = cfg.num_experts;
  r.top_k = cfg.top_k;
  r.factor = f.label();
  r.factor_value = f.dropless ? NAN : f.factor;
  r.priority_name = std::string(to_string(cfg.dispatch.prio));
  r.policy_name = std::string(to_string(cfg.dispatch.dropped));
  const bool padded =
      o.layout == layout_choice::padded || (o.layout == layout_choice::automatic && !f.dropless);
  r.layout_name = padded ? "padded" : "compact/" + std::to_string(o.block_size);
  const std::vector<float> bias(cfg.gating.expert_bias ? cfg.num_experts : 0, 0.0f);

  if (!o.reference_backend) {
    const cpu_gated& g = gated;
    if (!g.st) throw error(g.st);
    const cpu_routed c = cpu_route_rest(cfg, g, padded, o.block_size, o.repeats, o.executor);
    if (!c.st) throw error(c.st);
    r.gating_us = g.us;
    r.cpu_us = g.us + c.us;
    r.capacity = c.dispatch.capacity;
    r.stats = reference::compute_stats(c.dispatch, c.layout);
    r.aux_loss = c.aux_loss;
    r.z_loss = c.z_loss;
    if (o.check) {
      const auto want = reference::route<float>(cfg, in.logits, in.tokens, bias);
      r.check = check_against_reference(cfg, g, c, want, padded, o.block_size);
    }
  } else {
    reference::routing_result res;
    reference::layout_output L;
    double best = INFINITY;
    for (int rep = 0; rep < (o.repeats < 1 ? 1 : o.repeats); ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      res = reference::route<float>(cfg, in.logits, in.tokens, bias);
      L = padded ? reference::layout(cfg, res.dispatch, layout_kind::padded)
                 : reference::layout(cfg, res.dispatch, layout_kind::compact, o.block_size);
      const auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    r.cpu_us = best;
    r.capacity = res.dispatch.capacity;
    r.stats = reference::compute_stats(res.dispatch, L);
    r.aux_loss = res.losses.aux.value;
    r.z_loss = res.losses.z.value;
  }
  r.max_over_mean = r.stats.mean_load > 0 ? r.stats.max_load / r.stats.mean_load : 0.0;
  r.buffer_bytes = r.stats.rows * o.hidden * static_cast<std::int64_t>(size_of(o.buffer_dtype));
  return r;
}

/// Called before each routing call with (index, total, what).
using progress_fn = std::function<void(std::size_t, std::size_t, const std::string&)>;
/// Called for each combination validate() rejects (it is skipped).
using skip_fn = std::function<void(const std::string&)>;

/// @brief The whole sweep over inputs x factors x priorities x policies.
inline std::vector<sweep_row> run_sweep(const sweep_options& o,
                                        const std::vector<sweep_input>& inputs,
                                        const progress_fn& progress = {},
                                        const skip_fn& skipped = {}) {
  std::vector<sweep_row> rows;
  const std::size_t total =
      inputs.size() * o.factors.size() * o.priorities.size() * o.policies.size();
  std::size_t i = 0;
  for (const auto& in : inputs) {
    // the CPU backend gates each batch once per gating variant of the sweep's configs
    std::deque<cpu_gated> gatings;  // stable references
    const auto gating_for = [&](const routing_config& cfg) -> const cpu_gated& {
      for (const auto& g : gatings)
        if (g.variant == variant_of(cfg)) return g;
      const std::vector<float> bias(cfg.gating.expert_bias ? cfg.num_experts : 0, 0.0f);
      gatings.push_back(cpu_gate(cfg, in.logits, in.tokens, bias, o.repeats, o.executor));
      return gatings.back();
    };
    static const cpu_gated none{};
    for (const auto& f : o.factors)
      for (const auto& p : o.priorities)
        for (const auto& d : o.policies) {
          routing_config cfg;
          const std::string what = in.name + " factor " + f.label() + " " +
                                   std::string(p ? to_string(*p) : "preset") + "/" +
                                   std::string(d ? to_string(*d) : "preset");
          if (progress) progress(i, total, what);
          ++i;
          if (auto s = sweep_config(o.base, f, p, d, cfg); !s) {
            if (skipped) skipped(what + ": " + s.message);
            continue;
          }
          rows.push_back(run_one(o, in, cfg, f, o.reference_backend ? none : gating_for(cfg)));
        }
  }
  if (progress) progress(total, total, "done");
  return rows;
}

}  // namespace moeroute::planner
