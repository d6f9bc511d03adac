// SPDX-License-Identifier: Apache-2.0
// The capacity planner's results as a table, CSV and JSON (the plot script reads the JSON).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <moeroute/planner/plan.hpp>

namespace moeroute::planner {

/// Bytes for people: B, KiB, MiB or GiB.
inline std::string format_bytes(std::int64_t b) {
  const double v = static_cast<double>(b);
  if (v >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", v / (1024.0 * 1024 * 1024));
  if (v >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", v / (1024.0 * 1024));
  if (v >= 1024.0) return fmt::format("{:.1f} KiB", v / 1024.0);
  return fmt::format("{} B", b);
}

inline nlohmann::json to_json(const distribution& d) {
  return {{"mean", d.mean}, {"p50", d.p50}, {"p95", d.p95}, {"p99", d.p99}, {"max", d.max}};
}

inline nlohmann::json plan_to_json(const plan_result& r, const nlohmann::json& meta) {
  nlohmann::json j = meta;
  j["batches"] = r.batches;
  j["batch_tokens"] = r.batch_tokens;
  j["tokens_left_out"] = r.tokens_left_out;
  j["nonfinite_logits"] = r.nonfinite_logits;
  j["gating_seconds"] = r.gating_seconds;
  j["dispatch_seconds"] = r.dispatch_seconds;
  j["cells"] = nlohmann::json::array();
  for (const auto& c : r.cells) {
    nlohmann::json o;
    o["layer"] = c.layer;
    o["factor"] = c.factor;
    o["capacity"] = c.capacity;
    o["priority"] = c.priority_name;
    o["policy"] = c.policy_name;
    o["layout"] = c.layout_name;
    o["drop_rate"] = to_json(c.drop_rate);
    o["fully_dropped_tokens"] = to_json(c.fully_dropped);
    o["rerouted"] = to_json(c.rerouted);
    o["padding_waste"] = to_json(c.padding_waste);
    o["buffer_bytes"] = c.buffer_bytes;
    if (!c.rank_drop.empty()) {
      o["rank_drop_rate"] = nlohmann::json::array();
      for (const auto& d : c.rank_drop) o["rank_drop_rate"].push_back(to_json(d));
    }
    j["cells"].push_back(o);
  }
  j["expert_load"] = nlohmann::json::array();
  for (const auto& u : r.experts)
    j["expert_load"].push_back({{"layer", u.layer},
                                {"share", u.share},
                                {"min_share", u.min_share},
                                {"max_share", u.max_share},
                                {"gini", u.gini},
                                {"cold", u.cold},
                                {"dead", u.dead},
                                {"share_first_quarter", u.first},
                                {"share_last_quarter", u.last},
                                {"drift", u.drift}});
  j["recommendations"] = nlohmann::json::array();
  for (const auto& c : r.recommendations)
    j["recommendations"].push_back(
        {{"layer", c.layer < 0 ? nlohmann::json("model") : nlohmann::json(c.layer)},
         {"met", c.met},
         {"factor", c.met ? nlohmann::json(c.factor) : nlohmann::json(nullptr)},
         {"capacity", c.capacity},
         {"overflow_quantile", c.overflow_quantile},
         {"overflow_max", c.overflow_max},
         {"buffer_bytes", c.buffer_bytes},
         {"padding_waste", c.padding_waste},
         {"dropless_bytes", c.dropless_bytes},
         {"dropless_padding_waste", c.dropless_padding}});
  return j;
}

inline const char* plan_csv_header =
    "layer,factor,capacity,priority,policy,layout,drop_mean,drop_p50,drop_p95,drop_p99,drop_max,"
    "fully_dropped_mean,fully_dropped_max,rerouted_mean,rerouted_max,padding_waste_mean,"
    "buffer_bytes,worst_rank_drop_p99";

inline void write_plan_csv(std::ostream& os, const plan_result& r) {
  os << plan_csv_header << '\n';
  for (const auto& c : r.cells) {
    double worst = 0.0;
    for (const auto& d : c.rank_drop) worst = std::max(worst, d.p99);
    os << fmt::format(
        "{},{},{},{},{},{},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.3f},{},{:.3f},{},{:.6f},{},{}\n",
        c.layer, c.factor, c.capacity, c.priority_name, c.policy_name, c.layout_name,
        c.drop_rate.mean, c.drop_rate.p50, c.drop_rate.p95, c.drop_rate.p99, c.drop_rate.max,
        c.fully_dropped.mean, c.fully_dropped.max, c.rerouted.mean, c.rerouted.max,
        c.padding_waste.mean, c.buffer_bytes,
        c.rank_drop.empty() ? std::string() : fmt::format("{:.6f}", worst));
  }
}

/// The recommendations as CSV: one row per layer, then the model ("model").
inline void write_recommendations_csv(std::ostream& os, const plan_result& r) {
  os << "layer,met,factor,capacity,overflow_quantile,overflow_max,buffer_bytes,padding_waste,"
        "dropless_bytes,dropless_padding_waste\n";
  for (const auto& c : r.recommendations)
    os << fmt::format("{},{},{},{},{:.6f},{:.6f},{},{:.6f},{},{:.6f}\n",
                      c.layer < 0 ? std::string("model") : std::to_string(c.layer), c.met ? 1 : 0,
                      c.met ? fmt::format("{:.2f}", c.factor) : std::string(), c.capacity,
                      c.overflow_quantile, c.overflow_max, c.buffer_bytes, c.padding_waste,
                      c.dropless_bytes, c.dropless_padding);
}

/// The expert load over the dump as CSV: one row per layer and expert.
inline void write_experts_csv(std::ostream& os, const plan_result& r) {
  os << "layer,expert,share,share_first_quarter,share_last_quarter,cold,dead\n";
  for (const auto& u : r.experts)
    for (std::size_t e = 0; e < u.share.size(); ++e) {
      const auto id = static_cast<std::int32_t>(e);
      const bool cold = std::find(u.cold.begin(), u.cold.end(), id) != u.cold.end();
      const bool dead = std::find(u.dead.begin(), u.dead.end(), id) != u.dead.end();
      os << fmt::format("{},{},{:.8f},{:.8f},{:.8f},{},{}\n", u.layer, e, u.share[e], u.first[e],
                        u.last[e], cold ? 1 : 0, dead ? 1 : 0);
    }
}

inline void write_plan_table(std::ostream& os, const plan_result& r, const plan_options& o,
                             const std::string& setup) {
  os << fmt::format("\n== capacity plan | {} batches of {} tokens ({} left out) | {}\n", r.batches,
                    r.batch_tokens, r.tokens_left_out, setup);
  std::int64_t layer = -1;
  for (const auto& c : r.cells) {
    if (c.layer != layer) {
      layer = c.layer;
      os << fmt::format("\n-- layer {}: drop rate per batch (%)\n", layer);
      os << fmt::format(
          "{:>8} {:>6} {:>12} {:>11} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8} {:>8} "
          "{:>6} {:>10}{}\n",
          "factor", "C", "priority", "policy", "mean", "p50", "p95", "p99", "max", "tok.drop",
          "rerouted", "pad%", "buffer", o.ranks > 0 ? "  worst rank p99" : "");
    }
    double worst = 0.0;
    std::int32_t wr = 0;
    for (std::size_t i = 0; i < c.rank_drop.size(); ++i)
      if (c.rank_drop[i].p99 > worst) {
        worst = c.rank_drop[i].p99;
        wr = static_cast<std::int32_t>(i);
      }
    os << fmt::format(
        "{:>8} {:>6} {:>16} {:>11} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} {:>8.1f} {:>8.1f} "
        "{:>6.2f} {:>10}{}\n",
        c.factor, c.capacity < 0 ? std::string("inf") : std::to_string(c.capacity), c.priority_name,
        c.policy_name, 100 * c.drop_rate.mean, 100 * c.drop_rate.p50, 100 * c.drop_rate.p95,
        100 * c.drop_rate.p99, 100 * c.drop_rate.max, c.fully_dropped.mean, c.rerouted.mean,
        100 * c.padding_waste.mean, format_bytes(c.buffer_bytes),
        o.ranks > 0 ? fmt::format("  {:6.2f} (rank {})", 100 * worst, wr) : std::string());
  }
  os << "\n-- experts over the dump (routed choices, before capacity)\n";
  os << fmt::format("{:>6} {:>9} {:>9} {:>6} {:>6} {:>6} {:>7}  {}\n", "layer", "min share",
                    "max share", "gini", "cold", "dead", "drift", "cold / dead experts");
  const double fair = 1.0 / o.base.num_experts;
  for (const auto& u : r.experts) {
    std::string names;
    for (auto e : u.dead) names += fmt::format("{}{}", names.empty() ? "" : " ", e) + "(dead)";
    for (auto e : u.cold) names += fmt::format("{}{}", names.empty() ? "" : " ", e);
    os << fmt::format("{:>6} {:>8.2f}x {:>8.2f}x {:>6.3f} {:>6} {:>6} {:>7.3f}  {}\n", u.layer,
                      u.min_share / fair, u.max_share / fair, u.gini, u.cold.size(), u.dead.size(),
                      u.drift, names.empty() ? "-" : names);
  }
  os << fmt::format(
      "\n-- recommendation: the smallest factor whose p{:g} per-batch overflow <= {:g}%\n",
      100 * o.quantile, 100 * o.target_drop);
  os << fmt::format("{:>6} {:>7} {:>6} {:>9} {:>9} {:>10} {:>6} {:>14} {:>6}\n", "layer", "factor",
                    "C", "overflow", "worst", "buffer", "pad%", "dropless buf", "pad%");
  for (const auto& c : r.recommendations) {
    const std::string name = c.layer < 0 ? "model" : std::to_string(c.layer);
    if (!c.met) {
      os << fmt::format("{:>6} {:>7}\n", name, "none");
      continue;
    }
    os << fmt::format("{:>6} {:>7.2f} {:>6} {:>8.2f}% {:>8.2f}% {:>10} {:>6.2f} {:>14} {:>6.2f}\n",
                      name, c.factor, c.capacity, 100 * c.overflow_quantile, 100 * c.overflow_max,
                      format_bytes(c.buffer_bytes), 100 * c.padding_waste,
                      format_bytes(c.dropless_bytes), 100 * c.dropless_padding);
  }
  os << "\noverflow = assignments past their chosen expert's capacity, per batch (the drop rate\n"
        "of zero_weight / residual; fallback and next_choice reroute some of it). mean/p50/p95/\n"
        "p99/max are over batches (nearest-rank quantiles). buffer = padded [E, C, d] expert\n"
        "buffer; dropless buf = the largest block-aligned compact buffer any batch needs. The\n"
        "model row: one factor for every layer, buffers summed over layers.\n";
}

}  // namespace moeroute::planner
