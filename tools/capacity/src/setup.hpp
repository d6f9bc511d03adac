// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity, step 2 of 4 (check): the flags that need no input file, checked and
// turned into the preset and the sweep options. The routing config itself needs the input's
// expert count: load_inputs (inputs.hpp) completes it.
#pragma once

#include <cmath>
#include <optional>
#include <string>

#include <moeroute/cpu.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/planner/sweep.hpp>
#include <moeroute/presets.hpp>

#include "cli.hpp"

namespace moeroute::planner::tool {

/// The checked flags: the preset, and the sweep options (base config set by load_inputs).
struct tool_setup {
  const presets::preset_info* preset = nullptr;
  sweep_options so;
};

/// @brief Checks the flags that need no input. @throws usage_error naming the flag.
inline tool_setup check_options(const tool_options& o) {
  tool_setup s;
  s.preset = presets::find(o.preset_name);
  if (!s.preset)
    throw usage_error("--preset: unknown preset '" + o.preset_name +
                      "' (known: " + presets::names() + ")");
  if (o.format != "table" && o.format != "csv" && o.format != "json")
    throw usage_error("--format: '" + o.format + "' is not one of table, csv, json");
  const std::optional<dtype> bdt = parse_dtype(o.dtype_name);
  if (!bdt) throw usage_error("--dtype: '" + o.dtype_name + "' is not one of f32, f16, bf16");
  layout_choice lay;
  if (o.layout_name == "auto")
    lay = layout_choice::automatic;
  else if (o.layout_name == "padded")
    lay = layout_choice::padded;
  else if (o.layout_name == "compact")
    lay = layout_choice::compact;
  else
    throw usage_error("--layout: '" + o.layout_name + "' is not one of auto, padded, compact");
  if (o.block_size < 1 || o.block_size > (1 << 20))
    throw usage_error("--block-size must be in [1, 2^20]");
  if (o.repeats < 1 || o.repeats > 1000) throw usage_error("--repeat must be in [1, 1000]");
  if (o.backend != "cpu" && o.backend != "reference")
    throw usage_error("--backend: '" + o.backend + "' is not one of cpu, reference");
  if (o.check && o.backend != "cpu")
    throw usage_error("--check compares the cpu backend: --backend cpu");
  if (o.threads < 0 || o.threads > 4096) throw usage_error("--threads must be in [0, 4096]");
  if (o.hidden < 0 || o.hidden > max_hidden) throw usage_error("--hidden must be in [1, 2^20]");
  if (!std::isfinite(o.sp.zipf_s) || o.sp.zipf_s < 0 || o.sp.zipf_s > 100)
    throw usage_error("--zipf-s must be in [0, 100]");
  if (!(o.sp.collapse_share >= 0 && o.sp.collapse_share <= 1))
    throw usage_error("--collapse-share must be in [0, 1]");
  if (o.sp.mixed_sources < 1 || o.sp.mixed_sources > (1 << 20))
    throw usage_error("--mixed-sources must be in [1, 2^20]");
  if (!o.plot_path.empty()) {
    const auto ext = o.plot_path.size() >= 4 ? o.plot_path.substr(o.plot_path.size() - 4) : "";
    if (ext != ".png" && ext != ".svg")
      throw usage_error("--plot: the file must end in .png or .svg");
  }

  sweep_options& so = s.so;
  so.factors = parse_factors(o.factors);
  so.priorities = parse_choices<priority>(o.priorities, "--priorities", "priority");
  so.policies = parse_choices<drop_policy>(o.policies, "--policies", "drop policy");
  so.layout = lay;
  so.block_size = o.block_size;
  so.hidden = o.hidden > 0 ? o.hidden : s.preset->default_hidden;
  so.buffer_dtype = *bdt;
  so.repeats = o.repeats;
  so.reference_backend = o.backend == "reference";
  so.check = o.check;
  so.executor = cpu::executor::openmp(o.threads);
  return s;
}

}  // namespace moeroute::planner::tool
