// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity --batch-tokens: the capacity plan of a long, memory-mapped dump
// (moeroute/planner/plan.hpp): batching, group ids and bias checked, the plan run with a
// progress bar, written as table / CSV / JSON (plan_output.hpp) and a plot.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <moeroute/ep/placement.hpp>
#include <moeroute/planner/npy.hpp>
#include <moeroute/planner/plan.hpp>

#include "cli.hpp"
#include "ep_sim.hpp"  // parse_placement
#include "inputs.hpp"
#include "output.hpp"
#include "plan_output.hpp"
#include "resources.hpp"
#include "setup.hpp"

namespace moeroute::planner::tool {

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

/// @brief --batch-tokens: the capacity plan of a long dump (moeroute/planner/plan.hpp).
inline int run_planning_mode(const tool_options& o, const tool_setup& s, const tool_inputs& in) {
  const plan_args& pa = o.pa;
  const mapped_logits& dump = in.dump;
  const sweep_options& so = s.so;
  const presets::preset_info& preset = *s.preset;
  const std::int32_t ep_ranks = o.ep_ranks;
  const bool quiet = o.quiet;
  const std::int64_t N = dump.tokens(), L = dump.layers();
  const std::int32_t E = so.base.num_experts;
  if (N == 0 || L == 0) throw usage_error(pa.npy + ": the dump is empty (no tokens)");
  if (pa.batch_tokens < 1 || pa.batch_tokens > max_tokens)
    throw usage_error("--batch-tokens must be in [1, 2^31 - 1]");
  if (pa.batch_tokens > N)
    throw usage_error("--batch-tokens " + std::to_string(pa.batch_tokens) +
                      " is larger than the dump (" + std::to_string(N) + " tokens)");
  if (auto st = validate_tokens(so.base, pa.batch_tokens); !st)
    throw usage_error("--batch-tokens: " + st.message);
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
    if (auto st = io::read_npy_numeric(pa.group_ids, ids); !st) throw usage_error(st.message);
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
    if (auto st = io::read_npy_numeric(pa.bias, b); !st) throw usage_error(st.message);
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
      const ep::placement place = parse_placement(o.placement_spec, E, ep_ranks, placement_label);
      for (std::int32_t e = 0; e < E; ++e) po.owner.push_back(place.owner(ep::global_expert_id{e}));
    } catch (const std::invalid_argument& e) {
      throw usage_error(e.what());
    } catch (const error& e) {
      throw usage_error("--placement: " + e.get_status().message);
    }
    po.ranks = ep_ranks;
  }
  dump.advise(how == batching::consecutive);
  // consecutive batches need no [N] order array (run_plan cuts them itself)
  const auto order = how == batching::consecutive ? std::vector<std::int64_t>{}
                                                  : batch_order(N, how, pa.seed, ids.values);
  progress_bar bar(quiet);
  const plan_result r = run_plan(po, dump, order, bias, std::ref(bar));
  const memory_use mem = current_memory_use();
  if (!quiet)
    std::fprintf(stderr,
                 "moeroute-capacity: memory: peak resident %.1f MiB (counts the mapped dump's "
                 "pages, which the kernel reclaims), anonymous %.1f MiB now; kept per-batch "
                 "counts %.1f MiB, batch order %.1f MiB, dump %.1f MiB mapped\n",
                 static_cast<double>(mem.peak_resident_bytes) / 1048576.0,
                 static_cast<double>(mem.anonymous_bytes) / 1048576.0,
                 static_cast<double>(r.state_bytes) / 1048576.0,
                 static_cast<double>(order.size() * sizeof(std::int64_t)) / 1048576.0,
                 static_cast<double>(dump.mapped_bytes()) / 1048576.0);
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
  meta["memory"] = {{"peak_resident_bytes", mem.peak_resident_bytes},
                    {"anonymous_bytes", mem.anonymous_bytes},
                    {"per_batch_counts_bytes", r.state_bytes},
                    {"batch_order_bytes", order.size() * sizeof(std::int64_t)},
                    {"dump_mapped_bytes", dump.mapped_bytes()}};
  const auto json = [&] { return plan_to_json(r, meta).dump(2); };
  write_outputs(
      o.format, o.out_path, o.csv_path,
      [&](std::ostream& os) { write_plan_table(os, r, po, setup); },
      [&](std::ostream& os) { write_plan_csv(os, r); }, json);
  if (!o.csv_path.empty()) {  // beside the cells: the recommendations and the expert load
    const std::string stem = o.csv_path.size() > 4 && o.csv_path.ends_with(".csv")
                                 ? o.csv_path.substr(0, o.csv_path.size() - 4)
                                 : o.csv_path;
    std::ostringstream recs, experts;
    write_recommendations_csv(recs, r);
    write_experts_csv(experts, r);
    write_file_whole(stem + ".recommendations.csv", recs.str(), "--csv file");
    write_file_whole(stem + ".experts.csv", experts.str(), "--csv file");
  }
  std::string json_for_plot = o.json_path;
  if (json_for_plot.empty() && !o.plot_path.empty()) json_for_plot = o.plot_path + ".json";
  if (!json_for_plot.empty()) write_file_whole(json_for_plot, json() + '\n', "--json file");
  if (!o.plot_path.empty()) {
    draw_plot(o.python, pa.plot_script, o.plot_path, json_for_plot, !o.json_path.empty());
    if (!quiet) std::fprintf(stderr, "plot written to %s\n", o.plot_path.c_str());
  }
  return 0;
}

}  // namespace moeroute::planner::tool
