// SPDX-License-Identifier: Apache-2.0
// The capacity tool at cluster scale (--ep R): a batch split over R ranks, each rank's slice
// routed with the CPU reference, and the expert-parallel plan of every capacity scope computed
// with ep::simulate_plan — the plan's arithmetic only, no communication, so R = 1024 runs on a
// laptop. Reports per-rank rows and bytes sent and received, the hotspot factor, the share of
// rows that cross ranks and the drops of each scope.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <moeroute/ep/local_dispatch.hpp>
#include <moeroute/ep/placement.hpp>
#include <moeroute/ep/plan.hpp>
#include <moeroute/reference.hpp>

#include <moeroute/planner/sweep.hpp>

namespace moeroute::planner {

/// One simulated (input, scope, factor).
struct ep_row {
  std::string input, scope, factor, placement;
  std::int32_t ranks = 0;
  std::int64_t tokens = 0, assignments = 0, dropped = 0, rows = 0, crossing = 0;
  std::int64_t capacity = 0;  ///< global C (global scope), rank 0's C (per_source), -1 none
  double hotspot = 0;
  std::vector<std::int64_t> sent, received;  ///< [R] rows
  std::int64_t row_bytes = 0;

  [[nodiscard]] double drop_rate() const {
    return assignments ? static_cast<double>(dropped) / static_cast<double>(assignments) : 0.0;
  }
  [[nodiscard]] double crossing_share() const {
    return rows ? static_cast<double>(crossing) / static_cast<double>(rows) : 0.0;
  }
  [[nodiscard]] static std::int64_t max_of(const std::vector<std::int64_t>& v) {
    return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
  }
  [[nodiscard]] static double mean_of(const std::vector<std::int64_t>& v) {
    double s = 0;
    for (auto x : v) s += static_cast<double>(x);
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  }
};

/// Parses --placement: contiguous, round-robin, or a file with one line per rank listing that
/// rank's experts (whitespace or commas between ids; '#' starts a comment).
inline ep::placement parse_placement(const std::string& spec, std::int32_t experts,
                                     std::int32_t ranks, std::string& label) {
  if (spec == "contiguous") {
    label = spec;
    return ep::placement::contiguous(experts, ranks);
  }
  if (spec == "round-robin" || spec == "round_robin") {
    label = "round-robin";
    return ep::placement::round_robin(experts, ranks);
  }
  std::ifstream f(spec);
  if (!f)
    throw std::invalid_argument("--placement: '" + spec +
                                "' is not contiguous, round-robin or a readable file");
  std::vector<std::vector<std::int32_t>> table;
  std::string line;
  while (std::getline(f, line)) {
    line = line.substr(0, line.find('#'));
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream in(line);
    std::vector<std::int32_t> ids;
    std::string tok;
    bool any = false;
    while (in >> tok) {
      any = true;
      std::size_t used = 0;
      long v = 0;
      try {
        v = std::stol(tok, &used);
      } catch (...) {
        used = 0;
      }
      if (used != tok.size())
        throw std::invalid_argument("--placement " + spec + ": '" + tok + "' is not an expert id");
      ids.push_back(static_cast<std::int32_t>(v));
    }
    if (any || !line.empty()) table.push_back(ids);
  }
  if (static_cast<std::int32_t>(table.size()) != ranks)
    throw std::invalid_argument("--placement " + spec + ": " + std::to_string(table.size()) +
                                " rank lines, but --ep " + std::to_string(ranks));
  label = spec;
  return ep::placement::from_table(experts, std::move(table));  // validates: each expert once
}

/// Simulates every scope for one input. Tokens are split into R contiguous blocks (the first
/// T % R ranks get one more), as a data-parallel batch would be.
inline std::vector<ep_row> simulate_ep(const routing_config& base, const sweep_input& in,
                                       const ep::placement& place, const std::string& place_label,
                                       const std::vector<factor_choice>& factors,
                                       const std::vector<std::string>& scopes,
                                       std::int64_t row_bytes) {
  const std::int32_t R = place.ranks(), E = base.num_experts;
  std::vector<std::int64_t> first(R + 1, 0);
  for (std::int32_t r = 0; r < R; ++r)
    first[r + 1] = first[r] + in.tokens / R + (r < in.tokens % R ? 1 : 0);
  std::vector<reference::gating_output> gates(R);
  // a zero expert bias, as the single-device sweep uses (the bias is training state)
  const std::vector<float> bias(base.gating.expert_bias ? E : 0, 0.0f);
  for (std::int32_t r = 0; r < R; ++r) {
    const std::int64_t n = first[r + 1] - first[r];
    gates[r] = reference::gating<float>(
        base,
        in.logits.subspan(static_cast<std::size_t>(first[r] * E), static_cast<std::size_t>(n * E)),
        n, bias);
  }
  std::vector<ep_row> out;
  const auto run = [&](const char* scope_name, ep::capacity_scope scope, const factor_choice& f) {
    routing_config cfg = base;
    if (f.dropless) {
      cfg.capacity.mode = capacity_mode::unbounded;
    } else {
      cfg.capacity.mode = capacity_mode::factor;
      cfg.capacity.factor = f.factor;
      cfg.capacity.eval_factor = f.factor;
    }
    ep::options opt;
    opt.scope = scope;
    if (!ep::validate(cfg, opt)) return;  // e.g. global with a score priority: not simulated
    std::vector<ep::local_dispatch_output> layouts;
    layouts.reserve(R);
    for (std::int32_t r = 0; r < R; ++r)
      layouts.push_back(ep::local_dispatch(cfg, place, opt, r, gates[r]));
    const ep::plan p = ep::simulate_plan(cfg, place, opt, layouts, 0);
    ep_row row;
    row.input = in.name;
    row.scope = scope_name;
    row.factor = f.label();
    row.placement = place_label;
    row.ranks = R;
    row.tokens = in.tokens;
    for (const auto& g : gates) row.assignments += g.valid_tokens * g.k;
    row.dropped = p.dropped();
    row.capacity = p.capacity;
    row.hotspot = p.hotspot();
    row.crossing = p.crossing_rows();
    row.row_bytes = row_bytes;
    row.sent.assign(R, 0);
    row.received.assign(R, 0);
    for (std::int32_t s = 0; s < R; ++s)
      for (std::int32_t d = 0; d < R; ++d) {
        row.sent[s] += p.send_matrix[s * R + d];
        row.received[d] += p.send_matrix[s * R + d];
        row.rows += p.send_matrix[s * R + d];
      }
    out.push_back(std::move(row));
  };
  for (const auto& s : scopes) {
    if (s == "dropless") {
      run("dropless", ep::capacity_scope::dropless, factor_choice{true, 0.0});
      continue;
    }
    for (const auto& f : factors) {
      if (f.dropless) continue;
      if (s == "per_source") run("per_source", ep::capacity_scope::per_source, f);
      if (s == "global") run("global", ep::capacity_scope::global, f);
    }
  }
  return out;
}

inline void write_ep_table(std::ostream& os, const std::vector<ep_row>& rows,
                           const std::string& setup) {
  os << "moeroute-capacity --ep: " << setup << "\n";
  os << fmt::format("{:<14} {:<10} {:>8} {:>6} {:>8} {:>7} {:>7} {:>12} {:>12} {:>11}\n", "input",
                    "scope", "factor", "C", "hotspot", "cross%", "drop%", "recv max", "recv mean",
                    "recv MB max");
  for (const auto& r : rows)
    os << fmt::format(
        "{:<14} {:<10} {:>8} {:>6} {:>8.3f} {:>7.1f} {:>7.2f} {:>12} {:>12.1f} "
        "{:>11.2f}\n",
        r.input, r.scope, r.factor, r.capacity < 0 ? std::string("-") : std::to_string(r.capacity),
        r.hotspot, 100 * r.crossing_share(), 100 * r.drop_rate(), ep_row::max_of(r.received),
        ep_row::mean_of(r.received),
        static_cast<double>(ep_row::max_of(r.received) * r.row_bytes) / 1e6);
  os << "hotspot = max / mean rows received over ranks; cross% = rows that leave their rank; "
        "drop% of valid assignments; MB = rows x d x dtype bytes, one direction.\n";
}

inline void write_ep_csv(std::ostream& os, const std::vector<ep_row>& rows) {
  os << "input,scope,factor,placement,ranks,tokens,capacity,hotspot,crossing_share,drop_rate,"
        "rows_received_max,rows_received_mean,rows_sent_max,bytes_received_max,bytes_sent_max\n";
  for (const auto& r : rows)
    os << fmt::format("{},{},{},{},{},{},{},{:.6f},{:.6f},{:.6f},{},{:.3f},{},{},{}\n", r.input,
                      r.scope, r.factor, r.placement, r.ranks, r.tokens, r.capacity, r.hotspot,
                      r.crossing_share(), r.drop_rate(), ep_row::max_of(r.received),
                      ep_row::mean_of(r.received), ep_row::max_of(r.sent),
                      ep_row::max_of(r.received) * r.row_bytes,
                      ep_row::max_of(r.sent) * r.row_bytes);
}

inline nlohmann::json ep_to_json(const std::vector<ep_row>& rows, nlohmann::json meta) {
  nlohmann::json j;
  j["meta"] = std::move(meta);
  j["rows"] = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json o;
    o["input"] = r.input;
    o["scope"] = r.scope;
    o["factor"] = r.factor;
    o["placement"] = r.placement;
    o["ranks"] = r.ranks;
    o["tokens"] = r.tokens;
    o["capacity"] = r.capacity;
    o["hotspot"] = r.hotspot;
    o["crossing_share"] = r.crossing_share();
    o["drop_rate"] = r.drop_rate();
    o["dropped"] = r.dropped;
    o["rows_sent"] = r.sent;
    o["rows_received"] = r.received;
    std::vector<std::int64_t> bs, br;
    for (auto v : r.sent) bs.push_back(v * r.row_bytes);
    for (auto v : r.received) br.push_back(v * r.row_bytes);
    o["bytes_sent"] = bs;
    o["bytes_received"] = br;
    j["rows"].push_back(std::move(o));
  }
  return j;
}

}  // namespace moeroute::planner
