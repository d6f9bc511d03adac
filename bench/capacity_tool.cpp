// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity: which capacity factor and drop policy for *my* traffic, and what does it
// cost? Routes router logits (from a .npy file or a synthetic scenario) on the CPU reference
// under every capacity factor x priority x drop policy, and prints drop rate, padding waste,
// load balance, buffer memory, losses and time per call as a table, CSV or JSON, plus a plot.
//
// Exit codes: 0 success, 2 bad arguments or a malformed .npy file, 1 anything else.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <moeroute/config_fields.hpp>
#include <moeroute/io/npy.hpp>
#include <moeroute/names.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include "ep_sim.hpp"
#include "plan_output.hpp"
#include "scenarios.hpp"
#include "sweep.hpp"

#ifndef MOEROUTE_PLOT_SCRIPT
#define MOEROUTE_PLOT_SCRIPT "plot_capacity.py"
#endif
#ifndef MOEROUTE_PLAN_PLOT_SCRIPT
#define MOEROUTE_PLAN_PLOT_SCRIPT "plot_plan.py"
#endif
#ifndef MOEROUTE_EP_PLOT_SCRIPT
#define MOEROUTE_EP_PLOT_SCRIPT "plot_ep.py"
#endif
#ifndef MOEROUTE_PYTHON
#define MOEROUTE_PYTHON "python3"
#endif

namespace {

using namespace moeroute;
using namespace moeroute::bench;

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

std::string fmt_time(double us) {
  if (us >= 1e6) return fmt::format("{:.2f} s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:.2f} ms", us / 1e3);
  return fmt::format("{:.1f} us", us);
}

const char* csv_header =
    "scenario,tokens,experts,top_k,factor,capacity,priority,policy,layout,assignments,kept,"
    "rerouted,dropped,drop_rate,fully_dropped_tokens,rows,empty_rows,padding_waste,max_load,"
    "mean_load,max_over_mean,dead_experts,buffer_bytes,aux_loss,z_loss,cpu_us,gpu_us,gating_us,"
    "check";

void write_csv(std::ostream& os, const std::vector<sweep_row>& rows) {
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

nlohmann::json to_json(const std::vector<sweep_row>& rows, const nlohmann::json& meta) {
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

void write_table(std::ostream& os, const std::vector<sweep_row>& rows,
                 const std::map<std::string, std::string>& descriptions, const std::string& setup) {
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

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

/// Runs `script OUT DATA` with `python` to draw a plot; removes DATA unless `keep_data`.
void draw_plot(const std::string& python, const std::string& script, const std::string& plot_path,
               const std::string& data_path, bool keep_data) {
  const std::string cmd = shell_quote(python) + " " + shell_quote(script) + " " +
                          shell_quote(plot_path) + " " + shell_quote(data_path);
  const int rc = std::system(cmd.c_str());
  if (!keep_data) std::remove(data_path.c_str());
  if (rc != 0)
    throw std::runtime_error("plotting failed (" + cmd + " returned " + std::to_string(rc) +
                             "); needs python3 with matplotlib (Debian: python3-matplotlib)");
}

std::string file_stem(const std::string& path) {
  const auto slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const auto dot = base.rfind('.');
  return dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
}

/// What both modes write the same way: the --format output to stdout or --out, and --csv.
void write_outputs(const std::string& format, const std::string& out_path,
                   const std::string& csv_path, const std::function<void(std::ostream&)>& table,
                   const std::function<void(std::ostream&)>& csv,
                   const std::function<std::string()>& json) {
  std::ostringstream main_out;
  if (format == "table")
    table(main_out);
  else if (format == "csv")
    csv(main_out);
  else
    main_out << json() << '\n';
  if (out_path.empty()) {
    std::cout << main_out.str();
  } else {
    std::ofstream f(out_path);
    if (!(f << main_out.str()))
      throw std::runtime_error("cannot write --out file '" + out_path + "'");
  }
  if (!csv_path.empty()) {
    std::ofstream f(csv_path);
    csv(f);
    if (!f) throw std::runtime_error("cannot write --csv file '" + csv_path + "'");
  }
}

/// --ep: the cluster simulation of every input, written as table / CSV / JSON and a plot of
/// the rows each rank receives.
int run_cluster(std::int32_t R, const std::string& placement_spec, const std::string& scope_list,
                const sweep_options& so, const std::vector<sweep_input>& inputs,
                const std::string& format, const std::string& out_path, const std::string& csv_path,
                const std::string& json_path, const std::string& plot_path,
                const std::string& python, std::string_view preset_name) {
  if (R < 1 || R > (1 << 16)) throw usage_error("--ep must be in [1, 65536]");
  const auto scopes = split_list(scope_list);
  for (const auto& sc : scopes)
    if (sc != "dropless" && sc != "per_source" && sc != "global")
      throw usage_error("--scopes: '" + sc + "' is not one of dropless, per_source, global");
  std::string label;
  std::optional<ep::placement> place;
  try {
    place.emplace(parse_placement(placement_spec, so.base.num_experts, R, label));
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  } catch (const error& e) {
    throw usage_error("--placement: " + e.get_status().message);
  }
  const std::int64_t row_bytes = so.hidden * static_cast<std::int64_t>(size_of(so.buffer_dtype));
  std::vector<ep_row> rows;
  for (const auto& in : inputs) {
    auto r = simulate_ep(so.base, in, *place, label, so.factors, scopes, row_bytes);
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
      format, out_path, csv_path, [&](std::ostream& o) { write_ep_table(o, rows, setup); },
      [&](std::ostream& o) { write_ep_csv(o, rows); },
      [&] { return ep_to_json(rows, meta).dump(2); });
  std::string json_for_plot = json_path;
  if (json_for_plot.empty() && !plot_path.empty()) json_for_plot = plot_path + ".json";
  if (!json_for_plot.empty()) {
    std::ofstream f(json_for_plot);
    f << ep_to_json(rows, meta).dump(2) << '\n';
    if (!f) throw std::runtime_error("cannot write '" + json_for_plot + "'");
  }
  if (!plot_path.empty())
    draw_plot(python, MOEROUTE_EP_PLOT_SCRIPT, plot_path, json_for_plot, !json_path.empty());
  return 0;
}

/// What --batch-tokens plans with, besides the sweep options.
struct plan_args {
  std::string npy, group_ids, bias, batching = "consecutive",
                                    plot_script = MOEROUTE_PLAN_PLOT_SCRIPT;
  std::int64_t batch_tokens = 0;
  double target_drop = 0.01, quantile = 0.99, cold_share = 0.25;
  std::uint64_t seed = 0;
};

/// A progress bar with ETA on stderr (a line every 5% when stderr is not a terminal).
class progress_bar {
 public:
  explicit progress_bar(bool quiet) : quiet_(quiet), tty_(isatty(2) != 0) {}
  void operator()(std::int64_t done, std::int64_t total, const std::string& what) {
    if (quiet_ || total <= 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (done == 0) start_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double frac = static_cast<double>(done) / static_cast<double>(total);
    const int pct = static_cast<int>(100 * frac);
    if (!tty_ && pct < next_pct_ && done != total) return;
    next_pct_ = pct + 5;
    const double eta = done > 0 ? secs * (1.0 - frac) / frac : 0.0;
    constexpr int width = 30;
    const int fill = static_cast<int>(width * frac);
    const std::string bar = std::string(fill, '#') + std::string(width - fill, '.');
    std::fprintf(stderr, "%s[%s] %3d%% %s | %.0fs elapsed, ETA %.0fs%s", tty_ ? "\r\033[K" : "",
                 bar.c_str(), pct, what.c_str(), secs, eta, tty_ && done != total ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool quiet_, tty_;
  int next_pct_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// --batch-tokens: the capacity plan of a long dump (plan.hpp).
int run_planning(const plan_args& pa, const mapped_logits& dump, const sweep_options& so,
                 const presets::preset_info& preset, std::int32_t ep_ranks,
                 const std::string& placement_spec, const std::string& format,
                 const std::string& out_path, const std::string& csv_path,
                 const std::string& json_path, const std::string& plot_path,
                 const std::string& python, bool quiet) {
  const std::int64_t N = dump.tokens(), L = dump.layers();
  const std::int32_t E = so.base.num_experts;
  if (N == 0 || L == 0) throw usage_error(pa.npy + ": the dump is empty (no tokens)");
  if (pa.batch_tokens < 1 || pa.batch_tokens > max_tokens)
    throw usage_error("--batch-tokens must be in [1, 2^31 - 1]");
  if (pa.batch_tokens > N)
    throw usage_error("--batch-tokens " + std::to_string(pa.batch_tokens) +
                      " is larger than the dump (" + std::to_string(N) + " tokens)");
  if (auto s = validate_tokens(so.base, pa.batch_tokens); !s)
    throw usage_error("--batch-tokens: " + s.message);
  if (!(pa.target_drop >= 0.0 && pa.target_drop <= 1.0))
    throw usage_error("--target-drop must be in [0, 1]");
  if (!(pa.quantile >= 0.0 && pa.quantile <= 1.0))
    throw usage_error("--quantile must be in [0, 1]");
  if (!(pa.cold_share >= 0.0 && pa.cold_share <= 1.0))
    throw usage_error("--cold-share must be in [0, 1]");
  const std::optional<batching> how_given = parse_batching(pa.batching);
  if (!how_given)
    throw usage_error("--batching: '" + pa.batching +
                      "' is not one of consecutive, shuffled, grouped");
  const batching how = *how_given;
  io::npy_numeric ids;
  if (!pa.group_ids.empty()) {
    if (auto s = io::read_npy_numeric(pa.group_ids, ids); !s) throw usage_error(s.message);
    if (ids.shape.size() != 1 || ids.shape[0] != N)
      throw usage_error("--group-ids " + pa.group_ids + ": shape " +
                        fmt::format("{}", fmt::join(ids.shape, "x")) + ", expected [" +
                        std::to_string(N) + "] (one id per token of the dump)");
    for (double v : ids.values)
      if (!std::isfinite(v)) throw usage_error("--group-ids: ids must be finite numbers");
  } else if (how == batching::grouped) {
    throw usage_error("--batching grouped needs --group-ids (a .npy of one id per token)");
  }
  std::vector<float> bias;
  if (!pa.bias.empty()) {
    if (!so.base.gating.expert_bias)
      throw usage_error(
          "--bias: the preset routes without an expert bias; add --set "
          "gating.expert_bias=true (or use a biased preset such as deepseek_v3)");
    io::npy_numeric b;
    if (auto s = io::read_npy_numeric(pa.bias, b); !s) throw usage_error(s.message);
    const bool per_layer = b.shape.size() == 2 && b.shape[0] == L && b.shape[1] == E;
    const bool shared = b.shape.size() == 1 && b.shape[0] == E;
    if (!per_layer && !shared)
      throw usage_error("--bias " + pa.bias + ": shape " +
                        fmt::format("{}", fmt::join(b.shape, "x")) + ", expected [" +
                        std::to_string(E) + "] or [" + std::to_string(L) + ", " +
                        std::to_string(E) + "] (layers, experts)");
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int32_t e = 0; e < E; ++e) {
        const double v = b.values[static_cast<std::size_t>(per_layer ? l * E + e : e)];
        if (!std::isfinite(v)) throw usage_error("--bias: every bias must be finite");
        bias.push_back(static_cast<float>(v));
      }
  }
  if (bias.empty() && so.base.gating.expert_bias && !quiet)
    std::fprintf(stderr,
                 "moeroute-capacity: note: preset %s selects with an expert bias; routing with "
                 "bias 0 (give the router's bias with --bias, [E] or [layers, E])\n",
                 std::string(preset.name).c_str());
  plan_options po;
  po.base = so.base;
  po.factors = so.factors;
  po.priorities = so.priorities;
  po.policies = so.policies;
  po.batch_tokens = pa.batch_tokens;
  po.block_size = so.block_size;
  po.hidden = so.hidden;
  po.buffer_dtype = so.buffer_dtype;
  po.target_drop = pa.target_drop;
  po.quantile = pa.quantile;
  po.cold_share = pa.cold_share;
  po.executor = so.executor;
  std::string placement_label;
  if (ep_ranks != 0) {
    if (ep_ranks < 1 || ep_ranks > E) throw usage_error("--ep must be in [1, experts]");
    try {
      const ep::placement place = parse_placement(placement_spec, E, ep_ranks, placement_label);
      for (std::int32_t e = 0; e < E; ++e) po.owner.push_back(place.owner(ep::global_expert_id{e}));
    } catch (const std::invalid_argument& e) {
      throw usage_error(e.what());
    } catch (const error& e) {
      throw usage_error("--placement: " + e.get_status().message);
    }
    po.ranks = ep_ranks;
  }
  dump.advise(how == batching::consecutive);
  const auto order = batch_order(N, how, pa.seed, ids.values);
  progress_bar bar(quiet);
  const plan_result r = run_plan(po, dump, order, bias, std::ref(bar));
  if (r.nonfinite_logits > 0)
    std::fprintf(stderr,
                 "moeroute-capacity: warning: the planned batches hold %lld non-finite logits "
                 "(routed as NaN -> -FLT_MAX, +-Inf -> +-FLT_MAX; docs/numerics.md)\n",
                 static_cast<long long>(r.nonfinite_logits));
  const std::string setup = fmt::format(
      "{} {} | preset {} E={} k={} | batching {}{} | d={} {}{}", pa.npy,
      io::to_string(dump.dtype()), preset.name, E, so.base.top_k, pa.batching,
      how == batching::shuffled ? fmt::format(" (seed {})", pa.seed) : std::string(), so.hidden,
      to_string(so.buffer_dtype),
      ep_ranks ? fmt::format(" | EP {} ranks, {}", ep_ranks, placement_label) : std::string());
  nlohmann::json meta;
  meta["tool"] = "moeroute-capacity --batch-tokens";
  meta["input"] = pa.npy;
  meta["preset"] = std::string(preset.name);
  meta["config"] = to_string(so.base);
  meta["experts"] = E;
  meta["top_k"] = so.base.top_k;
  meta["layers"] = L;
  meta["tokens"] = N;
  meta["batching"] = pa.batching;
  meta["seed"] = pa.seed;
  meta["hidden"] = so.hidden;
  meta["dtype"] = to_string(so.buffer_dtype);
  meta["target_drop"] = pa.target_drop;
  meta["quantile"] = pa.quantile;
  meta["ranks"] = ep_ranks;
  const auto json = [&] { return plan_to_json(r, meta).dump(2); };
  write_outputs(
      format, out_path, csv_path, [&](std::ostream& o) { write_plan_table(o, r, po, setup); },
      [&](std::ostream& o) { write_plan_csv(o, r); }, json);
  if (!csv_path.empty()) {  // beside the cells: the recommendations and the expert load
    const std::string stem = csv_path.size() > 4 && csv_path.ends_with(".csv")
                                 ? csv_path.substr(0, csv_path.size() - 4)
                                 : csv_path;
    std::ofstream recs(stem + ".recommendations.csv"), experts(stem + ".experts.csv");
    write_recommendations_csv(recs, r);
    write_experts_csv(experts, r);
    if (!recs || !experts)
      throw std::runtime_error("cannot write the CSV files beside '" + csv_path + "'");
  }
  std::string json_for_plot = json_path;
  if (json_for_plot.empty() && !plot_path.empty()) json_for_plot = plot_path + ".json";
  if (!json_for_plot.empty()) {
    std::ofstream f(json_for_plot);
    f << json() << '\n';
    if (!f) throw std::runtime_error("cannot write '" + json_for_plot + "'");
  }
  if (!plot_path.empty()) {
    draw_plot(python, pa.plot_script, plot_path, json_for_plot, !json_path.empty());
    if (!quiet) std::fprintf(stderr, "plot written to %s\n", plot_path.c_str());
  }
  return 0;
}

int run(int argc, char** argv) {
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

  std::string npy, scenario_list = "uniform,zipf,collapsed,homogeneous,mixed",
                   preset_name = "deepspeed_topk", set_fields_text;
  std::string factors = "0.5,0.75,1.0,1.25,1.5,2.0,dropless", priorities = "preset",
              policies = "preset";
  std::string format = "table", out_path, csv_path, json_path, plot_path, dtype_name = "bf16";
  std::string layout_name = "auto", python = MOEROUTE_PYTHON, plot_script = MOEROUTE_PLOT_SCRIPT;
  std::int64_t tokens = 4096, hidden = 0, block_size = 16, layer = -1;
  std::int32_t experts = 0, top_k = 0;
  scenario_params sp;
  int repeats = 1, threads = 0;
  bool quiet = false, check = false;
  std::string backend = "cpu";
  std::int32_t ep_ranks = 0;
  std::string placement_spec = "contiguous", ep_scopes = "dropless,per_source,global";

  auto* o_npy = app.add_option(
      "--npy", npy, "router logits from np.save: float32/float16, [T,E] or [layers,T,E]");
  auto* o_scn =
      app.add_option(
             "--scenario", scenario_list,
             "synthetic batches (comma list): uniform, zipf, collapsed, homogeneous, mixed, all")
          ->capture_default_str();
  app.add_option("--layer", layer, "with a 3-D .npy: sweep only this layer (default: every layer)");
  auto* o_tok =
      app.add_option("--tokens", tokens, "tokens per synthetic batch")->capture_default_str();
  auto* o_exp =
      app.add_option("--experts", experts, "routed experts E (default: the preset's model)");
  auto* o_k = app.add_option("--top-k", top_k, "experts per token k (default: the preset's model)");
  app.add_option("--preset", preset_name, "routing preset: " + presets::names())
      ->capture_default_str();
  app.add_option("--set", set_fields_text,
                 "config fields on top of the preset, as name=value pairs separated by spaces "
                 "(e.g. \"gating.score=sigmoid capacity.min_capacity=4\"; names as in "
                 "moeroute/config_fields.hpp). The sweep then sets the factor, priority and "
                 "policy of each row");
  app.add_option("--factors", factors, "capacity factors (comma list; 'dropless' = no capacity)")
      ->capture_default_str();
  app.add_option("--priorities", priorities,
                 "priority modes: preset, all, " + known_names<priority>())
      ->capture_default_str();
  app.add_option(
         "--policies", policies,
         "drop policies: preset, all, zero_weight, residual, fallback (shared expert), next_choice")
      ->capture_default_str();
  app.add_option("--zipf-s", sp.zipf_s, "Zipf exponent s of the zipf scenario")
      ->capture_default_str();
  app.add_option("--collapse-share", sp.collapse_share,
                 "share p of tokens on expert 0 in the collapsed scenario")
      ->capture_default_str();
  app.add_option("--mixed-sources", sp.mixed_sources, "documents interleaved in the mixed scenario")
      ->capture_default_str();
  app.add_option("--seed", sp.seed, "seed of the synthetic scenarios")->capture_default_str();
  app.add_option("--hidden", hidden,
                 "hidden size d for the buffer memory (default: the preset's model)");
  app.add_option("--dtype", dtype_name, "buffer element type: f32, f16, bf16")
      ->capture_default_str();
  app.add_option(
         "--layout", layout_name,
         "expert buffer layout: auto (padded for factors, compact for dropless), padded, compact")
      ->capture_default_str();
  app.add_option("--block-size", block_size,
                 "compact layout segment alignment (grouped-GEMM tile rows)")
      ->capture_default_str();
  app.add_option("--repeat", repeats, "timed routing calls per row (minimum reported)")
      ->capture_default_str();
  app.add_option("--backend", backend,
                 "route on the fast CPU backend (cpu: gating once per batch) or the reference")
      ->capture_default_str();
  app.add_flag("--check", check,
               "cpu backend: also route every row on the reference: the same gating ids, gates "
               "within 1e-5, and exactly the reference's dispatch and layout on that gating "
               "(else exit 1); the 'check' column also counts fates that differ end to end");
  app.add_option("--threads", threads, "cpu backend threads (0 = all, with OpenMP)")
      ->capture_default_str();
  app.add_option("--format", format, "stdout/--out format: table, csv, json")
      ->capture_default_str();
  app.add_option("--out", out_path, "write the --format output to this file instead of stdout");
  app.add_option("--csv", csv_path, "also write CSV to this file");
  app.add_option("--json", json_path, "also write JSON to this file");
  app.add_option("--plot", plot_path, "draw drop rate and padding waste vs factor (.png or .svg)");
  app.add_option("--python", python, "python3 with matplotlib, for --plot")->capture_default_str();
  app.add_option("--plot-script", plot_script, "the plotting script")->capture_default_str();
  app.add_flag("-q,--quiet", quiet, "no progress line on stderr");
  app.add_option("--ep", ep_ranks,
                 "cluster mode: split each batch over R expert-parallel ranks and report per-rank "
                 "rows and bytes, the hotspot factor, cross-rank share and drops per scope "
                 "(simulated plan, no communication; R up to 65536)");
  app.add_option("--placement", placement_spec,
                 "--ep: contiguous, round-robin, or a file with one line of expert ids per rank")
      ->capture_default_str();
  app.add_option("--scopes", ep_scopes, "--ep: capacity scopes (dropless, per_source, global)")
      ->capture_default_str();
  plan_args pa;
  auto* o_bt = app.add_option(
      "--batch-tokens", pa.batch_tokens,
      "planning mode: cut a long --npy dump ([layers, N, E], memory-mapped) into batches of this "
      "many tokens and report per-batch drop-rate distributions, a recommended factor, and "
      "cold / dead / drifting experts");
  app.add_option("--batching", pa.batching,
                 "planning: consecutive (as served), shuffled (--seed), grouped (--group-ids)")
      ->capture_default_str();
  app.add_option("--group-ids", pa.group_ids,
                 "planning: .npy of N request / document ids; batches then hold whole requests "
                 "(implies --batching grouped)");
  app.add_option("--bias", pa.bias,
                 "planning: expert bias .npy, [E] or [layers, E], for biased routers "
                 "(DeepSeek-V3); default zero");
  app.add_option("--target-drop", pa.target_drop,
                 "planning: the per-batch overflow (drop) rate to stay under")
      ->capture_default_str();
  app.add_option("--quantile", pa.quantile,
                 "planning: which quantile of the batches must meet --target-drop")
      ->capture_default_str();
  app.add_option("--cold-share", pa.cold_share,
                 "planning: an expert is cold below this fraction of its fair share 1/E")
      ->capture_default_str();
  app.add_option("--plan-plot-script", pa.plot_script, "planning: the plotting script")
      ->capture_default_str();
  o_npy->excludes(o_scn)->excludes(o_tok)->excludes(o_exp);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "moeroute-capacity: " << e.what() << "\n(run with --help for usage)\n";
    return 2;
  }

  // ---- check the arguments
  const presets::preset_info* preset = presets::find(preset_name);
  if (!preset)
    throw usage_error("--preset: unknown preset '" + preset_name + "' (known: " + presets::names() +
                      ")");
  if (format != "table" && format != "csv" && format != "json")
    throw usage_error("--format: '" + format + "' is not one of table, csv, json");
  const std::optional<dtype> bdt = parse_dtype(dtype_name);
  if (!bdt) throw usage_error("--dtype: '" + dtype_name + "' is not one of f32, f16, bf16");
  layout_choice lay;
  if (layout_name == "auto")
    lay = layout_choice::automatic;
  else if (layout_name == "padded")
    lay = layout_choice::padded;
  else if (layout_name == "compact")
    lay = layout_choice::compact;
  else
    throw usage_error("--layout: '" + layout_name + "' is not one of auto, padded, compact");
  if (block_size < 1 || block_size > (1 << 20))
    throw usage_error("--block-size must be in [1, 2^20]");
  if (repeats < 1 || repeats > 1000) throw usage_error("--repeat must be in [1, 1000]");
  if (backend != "cpu" && backend != "reference")
    throw usage_error("--backend: '" + backend + "' is not one of cpu, reference");
  if (check && backend != "cpu")
    throw usage_error("--check compares the cpu backend: --backend cpu");
  if (threads < 0 || threads > 4096) throw usage_error("--threads must be in [0, 4096]");
  if (hidden < 0 || hidden > max_hidden) throw usage_error("--hidden must be in [1, 2^20]");
  if (!std::isfinite(sp.zipf_s) || sp.zipf_s < 0 || sp.zipf_s > 100)
    throw usage_error("--zipf-s must be in [0, 100]");
  if (!(sp.collapse_share >= 0 && sp.collapse_share <= 1))
    throw usage_error("--collapse-share must be in [0, 1]");
  if (sp.mixed_sources < 1 || sp.mixed_sources > (1 << 20))
    throw usage_error("--mixed-sources must be in [1, 2^20]");
  if (!plot_path.empty()) {
    const auto ext = plot_path.size() >= 4 ? plot_path.substr(plot_path.size() - 4) : "";
    if (ext != ".png" && ext != ".svg")
      throw usage_error("--plot: the file must end in .png or .svg");
  }

  sweep_options so;
  so.factors = parse_factors(factors);
  so.priorities = parse_choices<priority>(priorities, "--priorities", "priority");
  so.policies = parse_choices<drop_policy>(policies, "--policies", "drop policy");
  so.layout = lay;
  so.block_size = block_size;
  so.hidden = hidden > 0 ? hidden : preset->default_hidden;
  so.buffer_dtype = *bdt;
  so.repeats = repeats;
  so.reference_backend = backend == "reference";
  so.check = check;
  so.executor = cpu::executor::openmp(threads);

  // ---- inputs
  std::vector<sweep_input> inputs;
  std::vector<std::vector<float>> storage;
  std::map<std::string, std::string> descriptions;
  io::npy_array arr;
  mapped_logits dump;  // --batch-tokens: the dump to plan on, mapped, not read
  if (o_exp->count() > 0 && (experts < 1 || experts > max_experts))
    throw usage_error("--experts must be in [1, 8192]");
  if (o_k->count() > 0 && (top_k < 1 || top_k > max_top_k))
    throw usage_error("--top-k must be >= 1");
  std::int32_t E = experts > 0 ? experts : preset->default_experts;
  if (o_bt->count() > 0) {
    // planning: the dump stays memory-mapped; here its shape gives E
    if (npy.empty()) throw usage_error("--batch-tokens plans a dump: give it with --npy");
    if (layer >= 0) throw usage_error("--layer: planning covers every layer of the dump");
    if (auto s = mapped_logits::open(npy, dump); !s) throw usage_error(s.message);
    if (dump.experts() < 1 || dump.experts() > max_experts)
      throw usage_error(npy + ": the last dimension (experts) is " +
                        std::to_string(dump.experts()) + ", must be in [1, 8192]");
    E = static_cast<std::int32_t>(dump.experts());
  } else if (!npy.empty()) {
    if (auto s = io::read_npy(npy, arr); !s) throw usage_error(s.message);
    if (arr.experts() < 1 || arr.experts() > max_experts)
      throw usage_error(npy + ": the last dimension (experts) is " + std::to_string(arr.experts()) +
                        ", must be in [1, 8192]");
    E = static_cast<std::int32_t>(arr.experts());
    const std::int64_t L = arr.layers(), T = arr.tokens();
    if (layer >= L)
      throw usage_error("--layer " + std::to_string(layer) + ": the file has " + std::to_string(L) +
                        " layer(s)");
    const std::string stem = file_stem(npy);
    for (std::int64_t l = 0; l < L; ++l) {
      if (layer >= 0 && l != layer) continue;
      sweep_input in;
      in.name = arr.shape.size() == 3 ? fmt::format("{}[{}]", stem, l) : stem;
      in.description = fmt::format(
          "{} {} {}", npy, io::to_string(arr.dtype),
          arr.shape.size() == 3 ? fmt::format("layer {} of {}", l, L) : std::string("[T,E]"));
      in.tokens = T;
      in.logits =
          std::span<const float>(arr.values)
              .subspan(static_cast<std::size_t>(l * T * E), static_cast<std::size_t>(T * E));
      descriptions[in.name] = in.description;
      inputs.push_back(in);
    }
  } else {
    if (layer >= 0) throw usage_error("--layer needs --npy");
    if (tokens < 0 || tokens > (std::int64_t{1} << 22))
      throw usage_error("--tokens must be in [0, 4194304]");
    if (E < 1 || E > max_experts) throw usage_error("--experts must be in [1, 8192]");
    if (tokens * E > (std::int64_t{1} << 28))
      throw usage_error("--tokens x --experts exceeds 2^28 logits");
    auto names = split_list(scenario_list);
    if (names.size() == 1 && names[0] == "all")
      names = {"uniform", "zipf", "collapsed", "homogeneous", "mixed"};
    if (names.empty()) throw usage_error("--scenario: the list is empty");
    for (const auto& n : names) {
      scenario_kind kind;
      if (!parse_scenario(n, kind))
        throw usage_error("--scenario: unknown scenario '" + n +
                          "' (known: uniform, zipf, collapsed, homogeneous, mixed, all)");
      storage.push_back(make_logits(kind, tokens, E, sp));
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      sweep_input in;
      in.name = names[i];
      scenario_kind kind = scenario_kind::uniform;
      parse_scenario(names[i], kind);
      switch (kind) {
        case scenario_kind::uniform:
          in.description = "iid N(0,1) logits, balanced";
          break;
        case scenario_kind::zipf:
          in.description = fmt::format("Zipf-skewed popularity, s={:g}", sp.zipf_s);
          break;
        case scenario_kind::collapsed:
          in.description =
              fmt::format("{:g}% of tokens collapse onto expert 0", 100 * sp.collapse_share);
          break;
        case scenario_kind::homogeneous:
          in.description = "near-identical tokens (one document)";
          break;
        case scenario_kind::mixed:
          in.description = fmt::format("{} documents interleaved", sp.mixed_sources);
          break;
      }
      in.tokens = tokens;
      in.logits = storage[i];
      descriptions[in.name] = in.description;
      inputs.push_back(in);
    }
  }
  const std::int32_t k = top_k > 0 ? top_k : std::min(preset->default_k, E);
  try {
    so.base = presets::by_name(preset->name, E, k);
  } catch (const error& e) {
    throw usage_error(e.get_status().message);
  }
  if (auto s = set_fields(so.base, set_fields_text); !s) throw usage_error("--set: " + s.message);
  if (so.base.num_experts != E || so.base.top_k != k)
    throw usage_error("--set: num_experts and top_k come from --experts / --top-k (and the input)");
  if (auto s = validate(so.base); !s)
    throw usage_error("--preset " + preset_name + (set_fields_text.empty() ? "" : " --set") +
                      " with E=" + std::to_string(E) + " k=" + std::to_string(k) + ": " +
                      s.message);

  for (const auto& in : inputs) {
    std::int64_t bad = 0;
    for (float v : in.logits) bad += std::isfinite(v) ? 0 : 1;
    if (bad)
      std::fprintf(
          stderr,
          "moeroute-capacity: warning: %s has %lld non-finite logits (routed as NaN -> -FLT_MAX, "
          "+-Inf -> +-FLT_MAX; see docs/numerics.md)\n",
          in.name.c_str(), static_cast<long long>(bad));
  }

  if (o_bt->count() > 0) {
    pa.npy = npy;
    pa.seed = sp.seed;
    if (!pa.group_ids.empty() && pa.batching == "consecutive") pa.batching = "grouped";
    return run_planning(pa, dump, so, *preset, ep_ranks, placement_spec, format, out_path, csv_path,
                        json_path, plot_path, python, quiet);
  }
  if (ep_ranks != 0)
    return run_cluster(ep_ranks, placement_spec, ep_scopes, so, inputs, format, out_path, csv_path,
                       json_path, plot_path, python, preset->name);

  // ---- sweep
  const bool tty = isatty(2) != 0;
  std::size_t skipped = 0;
  const auto progress = [&](std::size_t i, std::size_t n, const std::string& what) {
    if (quiet) return;
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
    if (!quiet) std::fprintf(stderr, "%sskipped %s\n", tty ? "\r\033[K" : "", why.c_str());
  };
  const auto rows = run_sweep(so, inputs, progress, skip);

  // ---- output
  const std::string setup =
      fmt::format("preset {} | d={} {} | backend {}{} | layout {}", preset->name, so.hidden,
                  to_string(*bdt), backend, check ? " (checked against the reference)" : "",
                  layout_name == "auto"
                      ? "padded (factors) / compact/" + std::to_string(block_size) + " (dropless)"
                      : layout_name);
  nlohmann::json meta;
  meta["tool"] = "moeroute-capacity";
  meta["preset"] = std::string(preset->name);
  meta["config"] = to_string(so.base);  // the preset with --set applied, before the sweep
  meta["experts"] = E;
  meta["top_k"] = k;
  meta["hidden"] = so.hidden;
  meta["dtype"] = to_string(*bdt);
  meta["input"] = npy.empty() ? "synthetic" : npy;
  meta["gpu"] = "not measured (CPU only)";
  meta["backend"] = backend;
  meta["skipped"] = skipped;

  write_outputs(
      format, out_path, csv_path,
      [&](std::ostream& o) { write_table(o, rows, descriptions, setup); },
      [&](std::ostream& o) { write_csv(o, rows); }, [&] { return to_json(rows, meta).dump(2); });
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << to_json(rows, meta).dump(2) << '\n';
    if (!f) throw std::runtime_error("cannot write --json file '" + json_path + "'");
  }
  if (check) {
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
    if (!quiet)
      std::fprintf(stderr,
                   "moeroute-capacity: --check: all %zu rows decide as the reference does on "
                   "the same gating; %zu of them rank some near-equal gates differently end to "
                   "end (the 'check' column counts the fates)\n",
                   rows.size(), near);
  }
  if (!plot_path.empty()) {
    std::string csv_for_plot = csv_path;
    if (csv_for_plot.empty()) {
      csv_for_plot = plot_path + ".csv";
      std::ofstream f(csv_for_plot);
      write_csv(f, rows);
      if (!f) throw std::runtime_error("cannot write '" + csv_for_plot + "'");
    }
    draw_plot(python, plot_script, plot_path, csv_for_plot, !csv_path.empty());
    if (!quiet) std::fprintf(stderr, "plot written to %s\n", plot_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const usage_error& e) {
    std::cerr << "moeroute-capacity: error: " << e.what() << "\n";
    return 2;
  } catch (const moeroute::error& e) {
    std::cerr << "moeroute-capacity: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "moeroute-capacity: error: " << e.what() << "\n";
    return 1;
  }
}
