// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity --ep R: the inputs split over R expert-parallel ranks (ep_sim.hpp), written
// as table / CSV / JSON and a plot of the rows each rank receives.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <moeroute/ep/placement.hpp>

#include "cli.hpp"
#include "ep_sim.hpp"
#include "inputs.hpp"
#include "output.hpp"
#include "scripts.hpp"
#include "setup.hpp"

namespace moeroute::planner::tool {

/// --ep: the cluster simulation of every input, written as table / CSV / JSON and a plot of
/// the rows each rank receives.
inline int run_cluster_mode(const tool_options& o, const tool_setup& s, const tool_inputs& in) {
  const std::int32_t R = o.ep_ranks;
  const sweep_options& so = s.so;
  const std::string_view preset_name = s.preset->name;
  if (R < 1 || R > (1 << 16)) throw usage_error("--ep must be in [1, 65536]");
  const auto scopes = split_list(o.ep_scopes);
  for (const auto& sc : scopes)
    if (sc != "dropless" && sc != "per_source" && sc != "global")
      throw usage_error("--scopes: '" + sc + "' is not one of dropless, per_source, global");
  std::string label;
  std::optional<ep::placement> place;
  try {
    place.emplace(parse_placement(o.placement_spec, so.base.num_experts, R, label));
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  } catch (const error& e) {
    throw usage_error("--placement: " + e.get_status().message);
  }
  const std::int64_t row_bytes = so.hidden * static_cast<std::int64_t>(size_of(so.buffer_dtype));
  std::vector<ep_row> rows;
  for (const auto& input : in.inputs) {
    auto r = simulate_ep(so.base, input, *place, label, so.factors, scopes, row_bytes);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  const std::string setup =
      fmt::format("R={} placement {} | preset {} | d={} {} | {}", R, label, preset_name, so.hidden,
                  to_string(so.buffer_dtype), to_string(so.base));
  nlohmann::json meta;
  meta["tool"] = "moeroute-capacity --ep";
  meta["ranks"] = R;
  meta["placement"] = label;
  meta["preset"] = std::string(preset_name);
  meta["config"] = to_string(so.base);
  meta["hidden"] = so.hidden;
  meta["dtype"] = to_string(so.buffer_dtype);
  write_outputs(
      o.format, o.out_path, o.csv_path, [&](std::ostream& os) { write_ep_table(os, rows, setup); },
      [&](std::ostream& os) { write_ep_csv(os, rows); },
      [&] { return ep_to_json(rows, meta).dump(2); });
  std::string json_for_plot = o.json_path;
  if (json_for_plot.empty() && !o.plot_path.empty()) json_for_plot = o.plot_path + ".json";
  if (!json_for_plot.empty())
    write_file_whole(json_for_plot, ep_to_json(rows, meta).dump(2) + '\n', "--json file");
  if (!o.plot_path.empty())
    draw_plot(o.python, script_path("plot_ep.py"), o.plot_path, json_for_plot,
              !o.json_path.empty());
  return 0;
}

}  // namespace moeroute::planner::tool
