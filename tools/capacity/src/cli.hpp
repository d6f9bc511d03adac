// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity, step 1 of 4 (parse): the command line into `tool_options`, and the small
// parsers of its list arguments. A bad argument is a usage_error (exit code 2, main.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <moeroute/cpu/isa.hpp>
#include <moeroute/names.hpp>
#include <moeroute/planner/scenarios.hpp>
#include <moeroute/planner/sweep.hpp>
#include <moeroute/presets.hpp>

#include "scripts.hpp"

namespace moeroute::planner::tool {

/// A bad argument: message, exit code 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',' || c == ' ') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::vector<factor_choice> parse_factors(const std::string& s) {
  std::vector<factor_choice> out;
  for (const auto& item : split_list(s)) {
    if (item == "dropless") {
      out.push_back({true, 0.0});
      continue;
    }
    char* end = nullptr;
    const double f = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end != '\0' || !std::isfinite(f) || f <= 0.0 || f > 1e6)
      throw usage_error("--factors: '" + item +
                        "' is not a capacity factor (a number in (0, 1e6] or 'dropless')");
    out.push_back({false, f});
  }
  if (out.empty()) throw usage_error("--factors: the list is empty");
  return out;
}

/// A --priorities / --policies list: "preset" (the preset's own), "all", or the enum's names
/// (moeroute/names.hpp; aliases such as "score" for score_per_expert are accepted).
template <class Enum>
std::vector<std::optional<Enum>> parse_choices(const std::string& s, const char* flag,
                                               const char* noun) {
  std::vector<std::optional<Enum>> out;
  for (const auto& item : split_list(s)) {
    if (item == "preset") {
      out.emplace_back();
    } else if (item == "all") {
      for (const auto& [name, value] : enum_names<Enum>::table)
        if (to_string(value) == name) out.emplace_back(value);
    } else if (const auto v = parse<Enum>(item)) {
      out.emplace_back(*v);
    } else {
      throw usage_error(std::string(flag) + ": unknown " + noun + " '" + item +
                        "' (known: preset, all, " + known_names<Enum>() + ")");
    }
  }
  if (out.empty()) throw usage_error(std::string(flag) + ": the list is empty");
  return out;
}

/// What --batch-tokens plans with, besides the sweep options.
struct plan_args {
  std::string npy, group_ids, bias, batching = "consecutive",
                                    plot_script = script_path("plot_plan.py");
  std::int64_t batch_tokens = 0;
  double target_drop = 0.01, quantile = 0.99, cold_share = 0.25;
  std::uint64_t seed = 0;
};

/// Every flag as given (checked later, by check_options / load_inputs).
struct tool_options {
  std::string npy, scenario_list = "uniform,zipf,collapsed,homogeneous,mixed",
                   preset_name = "deepspeed_topk", set_fields_text;
  std::string factors = "0.5,0.75,1.0,1.25,1.5,2.0,dropless", priorities = "preset",
              policies = "preset";
  std::string format = "table", out_path, csv_path, json_path, plot_path, dtype_name = "bf16";
  std::string layout_name = "auto", python = MOEROUTE_PYTHON,
              plot_script = script_path("plot_capacity.py");
  std::int64_t tokens = 4096, hidden = 0, block_size = 16, layer = -1;
  std::int32_t experts = 0, top_k = 0;
  scenario_params sp;
  int repeats = 1, threads = 0;
  bool quiet = false, check = false;
  std::string backend = "cpu";
  std::int32_t ep_ranks = 0;
  std::string placement_spec = "contiguous", ep_scopes = "dropless,per_source,global";
  plan_args pa;
  std::vector<std::string> agree;  ///< --agree A.npy B.npy
  float tie_margin = 0.02f;
  std::string agree_plot_script = script_path("plot_agree.py");
  bool experts_given = false, top_k_given = false, planning = false;  ///< flags seen
};

/// What `--version` says of the vector level: this build's and the CPU's (isa_dispatch.hpp).
inline std::string isa_description() {
  return std::string(cpu::isa_name(cpu::compiled_isa())) + " build; this CPU runs " +
         std::string(cpu::isa_name(cpu::host_isa()));
}

/// @brief Parses the command line into `o`.
/// @return an exit code when the run ends here (--help, --version: 0; a parse error: 2), else
/// nullopt.
inline std::optional<int> parse_command_line(int argc, char** argv, tool_options& o) {
  CLI::App app{
      "moeroute-capacity: compare capacity factors, priorities and drop policies on your "
      "router logits (CPU reference)"};
  app.footer(
      "Examples:\n"
      "  # your logits: np.save('logits.npy', router_logits.float().cpu().numpy())  # [T,E] or "
      "[L,T,E]\n"
      "  moeroute-capacity --npy logits.npy --top-k 2 --preset mixtral --plot cap.png\n"
      "  # synthetic, a DeepSeek-V3-sized layer, CSV out:\n"
      "  moeroute-capacity --scenario uniform,zipf,collapsed --preset deepseek_v3 --tokens 4096 "
      "\\\n"
      "      --factors 1.0,1.25,dropless --policies zero_weight,fallback --format csv --out "
      "sweep.csv\n"
      "  # the same traffic on 64 expert-parallel ranks: per-rank load, hotspot, drops per scope\n"
      "  moeroute-capacity --npy logits.npy --top-k 8 --preset deepseek_v3 --ep 64 "
      "--placement round-robin --plot ep.png\n"
      "Exit codes: 0 ok, 2 bad arguments or malformed .npy, 1 other errors.");

  auto* o_npy = app.add_option(
      "--npy", o.npy, "router logits from np.save: float32/float16, [T,E] or [layers,T,E]");
  auto* o_scn =
      app.add_option(
             "--scenario", o.scenario_list,
             "synthetic batches (comma list): uniform, zipf, collapsed, homogeneous, mixed, all")
          ->capture_default_str();
  app.add_option("--layer", o.layer,
                 "with a 3-D .npy: sweep only this layer (default: every layer)");
  auto* o_tok =
      app.add_option("--tokens", o.tokens, "tokens per synthetic batch")->capture_default_str();
  auto* o_exp =
      app.add_option("--experts", o.experts, "routed experts E (default: the preset's model)");
  auto* o_k =
      app.add_option("--top-k", o.top_k, "experts per token k (default: the preset's model)");
  app.add_option("--preset", o.preset_name, "routing preset: " + presets::names())
      ->capture_default_str();
  app.add_option("--set", o.set_fields_text,
                 "config fields on top of the preset, as name=value pairs separated by spaces "
                 "(e.g. \"gating.score=sigmoid capacity.min_capacity=4\"; names as in "
                 "moeroute/config_fields.hpp). The sweep then sets the factor, priority and "
                 "policy of each row");
  app.add_option("--factors", o.factors, "capacity factors (comma list; 'dropless' = no capacity)")
      ->capture_default_str();
  app.add_option("--priorities", o.priorities,
                 "priority modes: preset, all, " + known_names<priority>())
      ->capture_default_str();
  app.add_option(
         "--policies", o.policies,
         "drop policies: preset, all, zero_weight, residual, fallback (shared expert), next_choice")
      ->capture_default_str();
  app.add_option("--zipf-s", o.sp.zipf_s, "Zipf exponent s of the zipf scenario")
      ->capture_default_str();
  app.add_option("--collapse-share", o.sp.collapse_share,
                 "share p of tokens on expert 0 in the collapsed scenario")
      ->capture_default_str();
  app.add_option("--mixed-sources", o.sp.mixed_sources,
                 "documents interleaved in the mixed scenario")
      ->capture_default_str();
  app.add_option("--seed", o.sp.seed, "seed of the synthetic scenarios")->capture_default_str();
  app.add_option("--hidden", o.hidden,
                 "hidden size d for the buffer memory (default: the preset's model)");
  app.add_option("--dtype", o.dtype_name, "buffer element type: f32, f16, bf16")
      ->capture_default_str();
  app.add_option(
         "--layout", o.layout_name,
         "expert buffer layout: auto (padded for factors, compact for dropless), padded, compact")
      ->capture_default_str();
  app.add_option("--block-size", o.block_size,
                 "compact layout segment alignment (grouped-GEMM tile rows)")
      ->capture_default_str();
  app.add_option("--repeat", o.repeats, "timed routing calls per row (minimum reported)")
      ->capture_default_str();
  app.add_option("--backend", o.backend,
                 "route on the fast CPU backend (cpu: gating once per batch) or the reference")
      ->capture_default_str();
  app.add_flag("--check", o.check,
               "cpu backend: also route every row on the reference: the same gating ids, gates "
               "within 1e-5, and exactly the reference's dispatch and layout on that gating "
               "(else exit 1); the 'check' column also counts fates that differ end to end");
  app.add_option("--threads", o.threads, "cpu backend threads (0 = all, with OpenMP)")
      ->capture_default_str();
  app.add_option("--format", o.format, "stdout/--out format: table, csv, json")
      ->capture_default_str();
  app.add_option("--out", o.out_path, "write the --format output to this file instead of stdout");
  app.add_option("--csv", o.csv_path, "also write CSV to this file");
  app.add_option("--json", o.json_path, "also write JSON to this file");
  app.add_option("--plot", o.plot_path,
                 "draw drop rate and padding waste vs factor (.png or .svg)");
  app.add_option("--python", o.python, "python3 with matplotlib, for --plot")
      ->capture_default_str();
  app.add_option("--plot-script", o.plot_script, "the plotting script")->capture_default_str();
  app.add_flag("-q,--quiet", o.quiet, "no progress line on stderr");
  app.set_version_flag("--version", std::string("moeroute-capacity ") + MOEROUTE_TOOL_VERSION +
                                        " (" + isa_description() + ")");
  app.add_option("--ep", o.ep_ranks,
                 "cluster mode: split each batch over R expert-parallel ranks and report per-rank "
                 "rows and bytes, the hotspot factor, cross-rank share and drops per scope "
                 "(simulated plan, no communication; R up to 65536)");
  app.add_option("--placement", o.placement_spec,
                 "--ep: contiguous, round-robin, or a file with one line of expert ids per rank")
      ->capture_default_str();
  app.add_option("--scopes", o.ep_scopes, "--ep: capacity scopes (dropless, per_source, global)")
      ->capture_default_str();
  auto* o_bt = app.add_option(
      "--batch-tokens", o.pa.batch_tokens,
      "planning mode: cut a long --npy dump ([layers, N, E], memory-mapped) into batches of this "
      "many tokens and report per-batch drop-rate distributions, a recommended factor, and "
      "cold / dead / drifting experts");
  app.add_option("--batching", o.pa.batching,
                 "planning: consecutive (as served), shuffled (--seed), grouped (--group-ids)")
      ->capture_default_str();
  app.add_option("--group-ids", o.pa.group_ids,
                 "planning: .npy of N request / document ids; batches then hold whole requests "
                 "(implies --batching grouped)");
  app.add_option("--bias", o.pa.bias,
                 "planning: expert bias .npy, [E] or [layers, E], for biased routers "
                 "(DeepSeek-V3); default zero");
  app.add_option("--target-drop", o.pa.target_drop,
                 "planning: the per-batch overflow (drop) rate to stay under")
      ->capture_default_str();
  app.add_option("--quantile", o.pa.quantile,
                 "planning: which quantile of the batches must meet --target-drop")
      ->capture_default_str();
  app.add_option("--cold-share", o.pa.cold_share,
                 "planning: an expert is cold below this fraction of its fair share 1/E")
      ->capture_default_str();
  app.add_option("--plan-plot-script", o.pa.plot_script, "planning: the plotting script")
      ->capture_default_str();
  auto* o_agree = app.add_option(
      "--agree", o.agree,
      "agreement mode: route two dumps of router logits for the same tokens (A.npy B.npy, e.g. "
      "a bf16 rollout and an fp32 trainer; [T,E] or [layers,T,E]) with one config and report "
      "per layer the tokens and slots whose experts differ, the tokens that differ in any "
      "layer, the gate mass moved and the flips on near-ties");
  o_agree->expected(2);
  app.add_option("--tie-margin", o.tie_margin,
                 "--agree: a flip is near a tie when A's weakest chosen logit is within this of "
                 "its strongest unchosen one")
      ->capture_default_str();
  app.add_option("--agree-plot-script", o.agree_plot_script, "--agree: the plotting script")
      ->capture_default_str();
  o_npy->excludes(o_scn)->excludes(o_tok)->excludes(o_exp);
  o_agree->excludes(o_npy)->excludes(o_scn)->excludes(o_tok)->excludes(o_exp);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);  // the version on stdout, exit 0
  } catch (const CLI::ParseError& e) {
    std::cerr << "moeroute-capacity: " << e.what() << "\n(run with --help for usage)\n";
    return 2;
  }

  o.experts_given = o_exp->count() > 0;
  o.top_k_given = o_k->count() > 0;
  o.planning = o_bt->count() > 0;
  o.pa.npy = o.npy;
  o.pa.seed = o.sp.seed;
  if (!o.pa.group_ids.empty() && o.pa.batching == "consecutive") o.pa.batching = "grouped";
  return std::nullopt;
}

}  // namespace moeroute::planner::tool
