// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity --agree A.npy B.npy: how often two routers disagree on the same tokens
// (moeroute/planner/agreement.hpp, docs/replay.md), written as table / CSV / JSON and a plot.
#pragma once

#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <moeroute/planner/agreement.hpp>
#include <moeroute/planner/npy_map.hpp>

#include "cli.hpp"
#include "inputs.hpp"
#include "output.hpp"
#include "setup.hpp"

namespace moeroute::planner::tool {

inline nlohmann::json agreement_json(const agreement_report& r, const std::string& preset,
                                     const tool_options& o) {
  nlohmann::json j;
  j["a"] = o.agree[0];
  j["b"] = o.agree[1];
  j["preset"] = preset;
  j["experts"] = r.experts;
  j["top_k"] = r.k;
  j["tokens"] = r.tokens;
  j["tie_margin"] = o.tie_margin;
  j["tokens_differ_any_layer"] = r.tokens_differ_any_layer;
  j["any_layer_flip_rate"] = r.any_layer_flip_rate();
  j["layers"] = nlohmann::json::array();
  for (std::size_t i = 0; i < r.layers.size(); ++i) {
    const layer_agreement& l = r.layers[i];
    j["layers"].push_back({{"layer", i},
                           {"tokens", l.tokens},
                           {"tokens_differ", l.tokens_differ},
                           {"token_flip_rate", l.token_flip_rate()},
                           {"slots_differ", l.slots_differ},
                           {"slot_flip_rate", l.slot_flip_rate(r.k)},
                           {"gate_mass_moved", l.mean_gate_mass_moved()},
                           {"near_ties", l.near_ties},
                           {"near_tie_share", l.near_tie_share()}});
  }
  return j;
}

inline int run_agree_mode(const tool_options& o, tool_setup& s) {
  mapped_logits a, b;
  for (int i = 0; i < 2; ++i)
    if (auto st = mapped_logits::open(o.agree[static_cast<std::size_t>(i)], i == 0 ? a : b); !st)
      throw usage_error("--agree: " + st.message);
  if (a.experts() > max_experts || a.experts() < 1)
    throw usage_error("--agree: " + o.agree[0] + " has E = " + std::to_string(a.experts()));
  const routing_config cfg = base_config(o, *s.preset, static_cast<std::int32_t>(a.experts()));
  if (!(o.tie_margin >= 0.0f)) throw usage_error("--tie-margin must be >= 0");
  agreement_options ao;
  ao.tie_margin = o.tie_margin;
  ao.executor = s.so.executor;
  agreement_report r;
  if (auto st = agreement(cfg, a, b, ao, r); !st) throw usage_error("--agree: " + st.message);
  const nlohmann::json j = agreement_json(r, std::string(s.preset->name), o);
  const auto table = [&](std::ostream& out) {
    out << fmt::format("agreement of {} and {}: {} tokens, E = {}, k = {}, preset {}\n", o.agree[0],
                       o.agree[1], r.tokens, r.experts, r.k, s.preset->name);
    out << fmt::format("{:>6} {:>12} {:>12} {:>14} {:>12}\n", "layer", "tokens flip", "slots flip",
                       "gate mass mvd", "near ties");
    for (std::size_t i = 0; i < r.layers.size(); ++i) {
      const layer_agreement& l = r.layers[i];
      out << fmt::format("{:>6} {:>11.3f}% {:>11.3f}% {:>14.5f} {:>11.1f}%\n", i,
                         100 * l.token_flip_rate(), 100 * l.slot_flip_rate(r.k),
                         l.mean_gate_mass_moved(), 100 * l.near_tie_share());
    }
    out << fmt::format("tokens differing in at least one layer: {} of {} ({:.3f}%)\n",
                       r.tokens_differ_any_layer, r.tokens, 100 * r.any_layer_flip_rate());
  };
  const auto csv = [&](std::ostream& out) {
    out << "layer,tokens,tokens_differ,token_flip_rate,slots_differ,slot_flip_rate,"
           "gate_mass_moved,near_ties,near_tie_share\n";
    for (const auto& l : j["layers"])
      out << fmt::format("{},{},{},{:.6g},{},{:.6g},{:.6g},{},{:.6g}\n", l["layer"].get<int>(),
                         l["tokens"].get<std::int64_t>(), l["tokens_differ"].get<std::int64_t>(),
                         l["token_flip_rate"].get<double>(), l["slots_differ"].get<std::int64_t>(),
                         l["slot_flip_rate"].get<double>(), l["gate_mass_moved"].get<double>(),
                         l["near_ties"].get<std::int64_t>(), l["near_tie_share"].get<double>());
  };
  write_outputs(o.format, o.out_path, o.csv_path, table, csv, [&] { return j.dump(2); });
  if (!o.json_path.empty()) write_file_whole(o.json_path, j.dump(2), "--json file");
  if (!o.plot_path.empty()) {
    const std::string data = o.plot_path + ".json";
    write_file_whole(data, j.dump(), "plot data");
    draw_plot(o.python, o.agree_plot_script, o.plot_path, data, false);
  }
  return 0;
}

}  // namespace moeroute::planner::tool
