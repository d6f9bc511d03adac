// SPDX-License-Identifier: Apache-2.0
// The capacity sweep's rows (one batch x factor x priority x policy) as a table, CSV and JSON.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <moeroute/planner/sweep.hpp>

#include "plan_output.hpp"  // format_bytes

namespace moeroute::planner::tool {

inline std::string fmt_time(double us) {
  if (us >= 1e6) return fmt::format("{:.2f} s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:.2f} ms", us / 1e3);
  return fmt::format("{:.1f} us", us);
}

inline const char* const csv_header =
    "scenario,tokens,experts,top_k,factor,capacity,priority,policy,layout,assignments,kept,"
    "rerouted,dropped,drop_rate,fully_dropped_tokens,rows,empty_rows,padding_waste,max_load,"
    "mean_load,max_over_mean,dead_experts,buffer_bytes,aux_loss,z_loss,cpu_us,gpu_us,gating_us,"
    "check";

inline void write_csv(std::ostream& os, const std::vector<sweep_row>& rows) {
  os << csv_header << '\n';
  for (const auto& r : rows) {
    const auto& s = r.stats;
    os << fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6f},{},{},{},{:.6f},{},{:.3f},{:.4f},{},{},{:."
        "6g},{:.6g},{:.2f},,{:.2f},{}\n",
        r.scenario, r.tokens, r.experts, r.top_k, r.factor, r.capacity, r.priority_name,
        r.policy_name, r.layout_name, s.assignments, s.kept, s.rerouted, s.dropped, s.drop_rate,
        s.fully_dropped_tokens, s.rows, s.empty_rows, s.padding_waste, s.max_load, s.mean_load,
        r.max_over_mean, s.dead_experts, r.buffer_bytes, r.aux_loss, r.z_loss, r.cpu_us,
        r.gating_us, r.check);
  }
}

inline nlohmann::json to_json(const std::vector<sweep_row>& rows, const nlohmann::json& meta) {
  nlohmann::json j = meta;
  j["rows"] = nlohmann::json::array();
  for (const auto& r : rows) {
    const auto& s = r.stats;
    nlohmann::json o;
    o["scenario"] = r.scenario;
    o["tokens"] = r.tokens;
    o["experts"] = r.experts;
    o["top_k"] = r.top_k;
    o["factor"] = r.factor;
    o["capacity"] = r.capacity;
    o["priority"] = r.priority_name;
    o["policy"] = r.policy_name;
    o["layout"] = r.layout_name;
    o["assignments"] = s.assignments;
    o["kept"] = s.kept;
    o["rerouted"] = s.rerouted;
    o["dropped"] = s.dropped;
    o["drop_rate"] = s.drop_rate;
    o["fully_dropped_tokens"] = s.fully_dropped_tokens;
    o["rows"] = s.rows;
    o["empty_rows"] = s.empty_rows;
    o["padding_waste"] = s.padding_waste;
    o["max_load"] = s.max_load;
    o["mean_load"] = s.mean_load;
    o["max_over_mean"] = r.max_over_mean;
    o["dead_experts"] = s.dead_experts;
    o["buffer_bytes"] = r.buffer_bytes;
    o["aux_loss"] = r.aux_loss;
    o["z_loss"] = r.z_loss;
    o["cpu_us"] = r.cpu_us;
    o["gpu_us"] = nullptr;
    o["gating_us"] = r.gating_us;
    if (!r.check.empty()) o["check"] = r.check;
    j["rows"].push_back(o);
  }
  return j;
}

inline void write_table(std::ostream& os, const std::vector<sweep_row>& rows,
                        const std::map<std::string, std::string>& descriptions,
                        const std::string& setup) {
  std::string current;
  for (const auto& r : rows) {
    if (r.scenario != current) {
      current = r.scenario;
      const auto it = descriptions.find(r.scenario);
      os << fmt::format("\n== {} — {} | T={} E={} k={} | {}\n", r.scenario,
                        it != descriptions.end() ? it->second : "", r.tokens, r.experts, r.top_k,
                        setup);
      os << fmt::format(
          "{:>8} {:>7} {:>12} {:>11} {:>7} {:>9} {:>8} {:>7} {:>8} {:>5} {:>10} {:>9} {:>9} "
          "{:>10}\n",
          "factor", "C", "priority", "policy", "drop%", "tok.drop", "rerouted", "pad%", "max/mean",
          "dead", "buffer", "aux", "z-loss", "cpu/call");
    }
    const auto& s = r.stats;
    os << fmt::format(
        "{:>8} {:>7} {:>12} {:>11} {:>7.2f} {:>9} {:>8} {:>7.2f} {:>8.2f} {:>5} {:>10} {:>9.4g} "
        "{:>9.4g} {:>10}\n",
        r.factor, r.capacity < 0 ? std::string("inf") : std::to_string(r.capacity), r.priority_name,
        r.policy_name, 100.0 * s.drop_rate, s.fully_dropped_tokens, s.rerouted,
        100.0 * s.padding_waste, r.max_over_mean, s.dead_experts, format_bytes(r.buffer_bytes),
        r.aux_loss, r.z_loss, fmt_time(r.cpu_us));
  }
  os << "\ndrop% = dropped / routed assignments; tok.drop = tokens with no expert at all;\n"
        "pad% = empty rows / buffer rows of the layout; buffer = layout rows x hidden x dtype;\n"
        "cpu/call = one routing call on this CPU: gating + dispatch + layout + losses on the CPU\n"
        "backend (gating is computed once per batch and shared by the rows), or reference::route\n"
        "+ layout with --backend reference.\n"
        "GPU column: not measured — this tool times the CPU only; GPU kernel timings\n"
        "come from bench_kernels_cuda (docs/performance.md).\n";
}

}  // namespace moeroute::planner::tool
