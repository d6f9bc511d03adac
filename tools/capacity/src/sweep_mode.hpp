// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity's default mode: every input batch routed under every (factor, priority,
// policy) of the sweep (moeroute/planner/sweep.hpp), written as table / CSV / JSON and a plot;
// with --check, every row compared with the reference (exit 1 when one differs).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <moeroute/planner/sweep.hpp>

#include "cli.hpp"
#include "inputs.hpp"
#include "output.hpp"
#include "setup.hpp"
#include "sweep_output.hpp"

namespace moeroute::planner::tool {

/// @brief The sweep of `in` under `s`; returns the exit code.
inline int run_sweep_mode(const tool_options& o, const tool_setup& s, const tool_inputs& in) {
  const sweep_options& so = s.so;
  const presets::preset_info* preset = s.preset;
  const bool tty = isatty(2) != 0;
  std::size_t skipped = 0;
  const auto progress = [&](std::size_t i, std::size_t n, const std::string& what) {
    if (o.quiet) return;
    if (tty) {
      std::fprintf(stderr, "\r\033[K[%zu/%zu] %s", i, n, what.c_str());
      if (i == n) std::fprintf(stderr, "\n");
    } else if (i == n || i % 25 == 0) {
      std::fprintf(stderr, "[%zu/%zu] %s\n", i, n, what.c_str());
    }
    std::fflush(stderr);
  };
  const auto skip = [&](const std::string& why) {
    ++skipped;
    if (!o.quiet) std::fprintf(stderr, "%sskipped %s\n", tty ? "\r\033[K" : "", why.c_str());
  };
  const auto rows = run_sweep(so, in.inputs, progress, skip);

  const std::string setup = fmt::format(
      "preset {} | d={} {} | backend {}{} | layout {}", preset->name, so.hidden,
      to_string(so.buffer_dtype), o.backend, o.check ? " (checked against the reference)" : "",
      o.layout_name == "auto"
          ? "padded (factors) / compact/" + std::to_string(o.block_size) + " (dropless)"
          : o.layout_name);
  nlohmann::json meta;
  meta["tool"] = "moeroute-capacity";
  meta["preset"] = std::string(preset->name);
  meta["config"] = to_string(so.base);  // the preset with --set applied, before the sweep
  meta["experts"] = so.base.num_experts;
  meta["top_k"] = so.base.top_k;
  meta["hidden"] = so.hidden;
  meta["dtype"] = to_string(so.buffer_dtype);
  meta["input"] = o.npy.empty() ? "synthetic" : o.npy;
  meta["gpu"] = "not measured (CPU only)";
  meta["backend"] = o.backend;
  meta["skipped"] = skipped;

  write_outputs(
      o.format, o.out_path, o.csv_path,
      [&](std::ostream& os) { write_table(os, rows, in.descriptions, setup); },
      [&](std::ostream& os) { write_csv(os, rows); }, [&] { return to_json(rows, meta).dump(2); });
  if (!o.json_path.empty())
    write_file_whole(o.json_path, to_json(rows, meta).dump(2) + '\n', "--json file");
  if (o.check) {
    std::size_t bad = 0;
    std::size_t near = 0;
    for (const auto& r : rows) near += r.check.rfind("ok,", 0) == 0 ? 1 : 0;
    for (const auto& r : rows)
      if (r.check.rfind("ok", 0) != 0) {
        if (bad++ == 0)
          std::fprintf(stderr,
                       "moeroute-capacity: --check: %s factor %s %s/%s: the cpu backend differs "
                       "from the reference in %s\n",
                       r.scenario.c_str(), r.factor.c_str(), r.priority_name.c_str(),
                       r.policy_name.c_str(), r.check.c_str());
      }
    if (bad > 0) {
      std::fprintf(stderr, "moeroute-capacity: --check: %zu of %zu rows differ\n", bad,
                   rows.size());
      return 1;
    }
    if (!o.quiet)
      std::fprintf(stderr,
                   "moeroute-capacity: --check: all %zu rows decide as the reference does on "
                   "the same gating; %zu of them rank some near-equal gates differently end to "
                   "end (the 'check' column counts the fates)\n",
                   rows.size(), near);
  }
  if (!o.plot_path.empty()) {
    std::string csv_for_plot = o.csv_path;
    if (csv_for_plot.empty()) {
      csv_for_plot = o.plot_path + ".csv";
      std::ostringstream csv;
      write_csv(csv, rows);
      write_file_whole(csv_for_plot, csv.str(), "plot data");
    }
    draw_plot(o.python, o.plot_script, o.plot_path, csv_for_plot, !o.csv_path.empty());
    if (!o.quiet) std::fprintf(stderr, "plot written to %s\n", o.plot_path.c_str());
  }
  return 0;
}

}  // namespace moeroute::planner::tool
