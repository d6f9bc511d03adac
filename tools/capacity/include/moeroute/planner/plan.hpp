// SPDX-License-Identifier: Apache-2.0
// Capacity planning on real traffic: a long router-logit dump cut into the batches the user
// runs (consecutive as served, shuffled, or grouped by request), each batch gated once per
// layer on the CPU backend and dispatched under every (factor, priority, drop policy); the
// per-batch numbers become distributions (mean, p50, p95, p99, max), the smallest factor that
// keeps a quantile of the per-batch overflow under a target is found exactly from the
// per-expert request counts, and the experts' load over the dump shows cold, dead and
// drifting experts. docs/capacity-tuning.md explains how to read the output.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <moeroute/capacity.hpp>
#include <moeroute/cpu.hpp>
#include <moeroute/layout_rows.hpp>
#include <moeroute/names.hpp>

#include <moeroute/planner/cpu_route.hpp>
#include <moeroute/planner/npy_map.hpp>
#include <moeroute/planner/sweep.hpp>

namespace moeroute::planner {

/// How the dump's tokens are cut into batches.
enum class batching {
  consecutive,  ///< in dump (arrival) order, as served
  shuffled,     ///< a seeded random permutation first (the training-mix view)
  grouped,      ///< sorted by a request / document id first (homogeneous batches)
};

/// The batching named `s` (consecutive, shuffled, grouped), or nothing.
[[nodiscard]] inline std::optional<batching> parse_batching(std::string_view s) {
  if (s == "consecutive") return batching::consecutive;
  if (s == "shuffled") return batching::shuffled;
  if (s == "grouped") return batching::grouped;
  return std::nullopt;
}

/// @brief The token order the batches cut: batch b is order[b*B, (b+1)*B). Tokens past the last
///        whole batch are left out (N mod B of them). Portable: the shuffle draws from
///        std::mt19937_64 (fully specified) with its own unbiased bounded draw; the grouping is
///        a stable sort by id, so ties keep arrival order.
inline std::vector<std::int64_t> batch_order(std::int64_t N, batching how, std::uint64_t seed,
                                             std::span<const double> group_ids = {}) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(N));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  if (how == batching::shuffled) {
    std::mt19937_64 rng(seed);
    for (std::int64_t i = N - 1; i > 0; --i) {
      const std::uint64_t n = static_cast<std::uint64_t>(i) + 1;
      const std::uint64_t limit =
          std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % n;
      std::uint64_t r;
      do r = rng();
      while (r >= limit);
      std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(r % n)]);
    }
  } else if (how == batching::grouped) {
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return group_ids[static_cast<std::size_t>(a)] < group_ids[static_cast<std::size_t>(b)];
    });
  }
  return order;
}

/// Mean, exact nearest-rank quantiles and max of per-batch values.
struct distribution {
  double mean = 0.0, p50 = 0.0, p95 = 0.0, p99 = 0.0, max = 0.0;
};

/// @brief The nearest-rank q-quantile: the ceil(q * n)-th smallest value (the smallest for
///        q = 0). Always one of the values, so it is exact and reproducible.
inline double nearest_rank(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto n = static_cast<double>(v.size());
  auto rank = static_cast<std::size_t>(std::ceil(q * n));
  rank = std::clamp<std::size_t>(rank, 1, v.size());
  return v[rank - 1];
}

inline distribution summarize(const std::vector<double>& v) {
  distribution d;
  if (v.empty()) return d;
  double s = 0.0;
  for (double x : v) s += x;
  d.mean = s / static_cast<double>(v.size());
  d.p50 = nearest_rank(v, 0.50);
  d.p95 = nearest_rank(v, 0.95);
  d.p99 = nearest_rank(v, 0.99);
  d.max = *std::max_element(v.begin(), v.end());
  return d;
}

struct plan_options {
  routing_config base;  ///< the preset (E and k set)
  std::vector<factor_choice> factors;
  std::vector<std::optional<priority>> priorities;
  std::vector<std::optional<drop_policy>> policies;
  std::int64_t batch_tokens = 2048;  ///< the batches cut the token order run_plan is given
  std::int64_t block_size = 16;      ///< compact (dropless) layout alignment
  std::int64_t hidden = 4096;
  dtype buffer_dtype = dtype::bf16;
  std::vector<std::int32_t> owner;  ///< [E] EP rank of each expert; empty = no --ep
  std::int32_t ranks = 0;
  double target_drop = 0.01;  ///< recommendation: quantile of per-batch overflow <= target
  double quantile = 0.99;
  double cold_share = 0.25;  ///< cold: load share below this fraction of 1/E
  cpu::executor executor{};
};

/// One (layer, factor, priority, policy) over all batches.
struct plan_cell {
  std::int64_t layer = 0;
  std::string factor;
  double factor_value = NAN;
  std::int64_t capacity = 0;  ///< per routed expert and capacity group; -1 unbounded
  std::string priority_name, policy_name, layout_name;
  distribution drop_rate;               ///< dropped / assignments, per batch
  distribution fully_dropped;           ///< tokens with nothing kept or rerouted, per batch
  distribution rerouted;                ///< rerouted assignments, per batch
  distribution padding_waste;           ///< empty rows / buffer rows, per batch
  std::int64_t buffer_bytes = 0;        ///< the largest buffer any batch needs
  std::vector<distribution> rank_drop;  ///< [R] per EP rank: its dropped / requested
};

/// Load of each expert over the whole dump (routed choices, before any capacity).
struct expert_usage {
  std::int64_t layer = 0;
  std::vector<double> share;  ///< [E] assignments to e / all assignments
  double min_share = 0.0, max_share = 0.0, gini = 0.0;
  std::vector<std::int32_t> cold, dead;  ///< below cold_share / E; never chosen
  std::vector<double> first, last;       ///< [E] shares in the first and last quarter of the dump
  double drift = 0.0;                    ///< total variation distance of first and last
};

/// The smallest factor whose per-batch overflow quantile meets the target.
struct recommendation {
  std::int64_t layer = -1;  ///< -1: the whole model (every layer meets it)
  bool met = false;         ///< false: not even C = B meets the target (never: C = B drops 0)
  double factor = NAN;
  std::int64_t capacity = 0;
  double overflow_quantile = 0.0;  ///< the quantile of per-batch overflow at that factor
  double overflow_max = 0.0;
  std::int64_t buffer_bytes = 0;    ///< padded [E, C, d] buffer of the routed experts
  double padding_waste = 0.0;       ///< mean over batches
  std::int64_t dropless_bytes = 0;  ///< the largest compact dropless buffer of any batch
  double dropless_padding = 0.0;    ///< its mean padding (block alignment)
};

struct plan_result {
  std::int64_t batches = 0, batch_tokens = 0, tokens_left_out = 0;
  std::int64_t nonfinite_logits = 0;  ///< NaN / Inf logits in the planned batches, all layers
  std::vector<plan_cell> cells;
  std::vector<expert_usage> experts;
  std::vector<recommendation> recommendations;  ///< per layer, then the model (layer -1)
  double gating_seconds = 0.0, dispatch_seconds = 0.0;
  /// Bytes of the per-(layer, batch) request counts kept for the model recommendation: the
  /// planner's only memory that grows with the dump (the dump itself is mapped, not read).
  std::int64_t state_bytes = 0;
};

namespace detail {

/// Gini coefficient of non-negative shares (0: equal, -> 1: one expert takes all).
inline double gini(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  double num = 0.0, sum = 0.0;
  const auto n = static_cast<double>(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    num += (2.0 * static_cast<double>(i + 1) - n - 1.0) * v[i];
    sum += v[i];
  }
  return sum > 0 ? num / (n * sum) : 0.0;
}

/// Per-expert requests of one batch, per capacity group: [groups, E]. int32: a count is at
/// most B * k, which run_plan checks fits; the planner keeps one of these per (layer, batch),
/// the only state that grows with the dump (plan_result::state_bytes).
struct batch_requests {
  std::int64_t groups = 1;
  std::vector<std::int32_t> req;
};

/// Assignments past capacity C in one batch (before any reroute): sum over groups and experts
/// of max(0, req - C).
inline std::int64_t overflow(const batch_requests& b, std::int64_t C) {
  std::int64_t o = 0;
  for (const std::int64_t r : b.req) o += r > C ? r - C : 0;
  return o;
}

/// The capacity a factor gives (the preset's rule), for a batch of B tokens.
inline std::int64_t capacity_at(const routing_config& base, double f, std::int64_t B) {
  routing_config c = base;
  c.capacity.mode = capacity_mode::factor;
  c.capacity.factor = f;
  c.capacity.eval_factor = std::numeric_limits<double>::quiet_NaN();
  c.training = true;
  return expert_capacity(c, B);
}

/// Smallest factor on a 0.01 grid whose capacity reaches C (C >= capacity at 0.01).
inline double factor_for(const routing_config& base, std::int64_t C, std::int64_t B) {
  std::int64_t lo = 1, hi = 1;
  while (capacity_at(base, static_cast<double>(hi) / 100.0, B) < C) {
    lo = hi + 1;
    hi *= 2;
    if (hi > 100000000) return NAN;
  }
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (capacity_at(base, static_cast<double>(mid) / 100.0, B) >= C)
      hi = mid;
    else
      lo = mid + 1;
  }
  return static_cast<double>(lo) / 100.0;
}

/// The overflow quantile of `batches` at capacity C (the worst batch's into *worst if given).
inline double overflow_quantile(const plan_options& o, const std::vector<batch_requests>& batches,
                                std::int64_t C, double* worst = nullptr) {
  const double assignments = static_cast<double>(o.batch_tokens * o.base.top_k);
  std::vector<double> v;
  v.reserve(batches.size());
  for (const auto& b : batches) v.push_back(static_cast<double>(overflow(b, C)) / assignments);
  if (worst != nullptr) *worst = v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  return nearest_rank(std::move(v), o.quantile);
}

/// What factor f (capacity C) costs on one layer's batches: the overflow quantile and worst
/// batch, the padded buffer and its mean padding, and the dropless compact alternative.
inline recommendation costs_at(const plan_options& o, std::int64_t layer,
                               const std::vector<batch_requests>& batches, double f,
                               std::int64_t C) {
  recommendation r;
  r.layer = layer;
  r.met = true;
  r.factor = f;
  r.capacity = C;
  r.overflow_quantile = overflow_quantile(o, batches, C, &r.overflow_max);
  const std::int64_t E = o.base.num_experts;
  const std::int64_t groups = batches.empty() ? 1 : batches.front().groups;
  const std::int64_t elem = static_cast<std::int64_t>(size_of(o.buffer_dtype));
  r.buffer_bytes = E * C * groups * o.hidden * elem;
  double pad = 0.0, dpad = 0.0;
  std::int64_t drows_max = 0;
  for (const auto& b : batches) {
    std::int64_t used = 0, rows = 0, total = 0;
    for (const std::int64_t x : b.req) {
      used += std::min(x, C);
      total += x;
    }
    // dropless compact: each expert's requests over the whole batch, block-aligned
    for (std::int64_t e = 0; e < E; ++e) {
      std::int64_t req = 0;
      for (std::int64_t g = 0; g < b.groups; ++g) req += b.req[g * E + e];
      rows += (req + o.block_size - 1) / o.block_size * o.block_size;
    }
    const double slots = static_cast<double>(E * C * groups);
    pad += slots > 0 ? 1.0 - static_cast<double>(used) / slots : 0.0;
    dpad += rows > 0 ? 1.0 - static_cast<double>(total) / static_cast<double>(rows) : 0.0;
    drows_max = std::max(drows_max, rows);
  }
  const auto n = static_cast<double>(std::max<std::size_t>(batches.size(), 1));
  r.padding_waste = pad / n;
  r.dropless_padding = dpad / n;
  r.dropless_bytes = drows_max * o.hidden * elem;
  return r;
}

/// The recommendation for one layer's batches: the least capacity (at least min_capacity)
/// whose overflow quantile meets the target, then the least factor giving it, and its costs.
inline recommendation recommend(const plan_options& o, std::int64_t layer,
                                const std::vector<batch_requests>& batches,
                                std::int64_t min_capacity) {
  std::int64_t hi = 0;
  for (const auto& b : batches)
    for (const std::int64_t x : b.req) hi = std::max(hi, x);
  std::int64_t lo = std::max<std::int64_t>(min_capacity, 0);
  hi = std::max(hi, lo);
  // overflow is non-increasing in C, so is its quantile: bisect on C in [lo, hi]
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (overflow_quantile(o, batches, mid) <= o.target_drop)
      hi = mid;
    else
      lo = mid + 1;
  }
  const double f = factor_for(o.base, lo, o.batch_tokens);
  if (std::isnan(f)) {
    recommendation none;
    none.layer = layer;
    return none;
  }
  return costs_at(o, layer, batches, f, capacity_at(o.base, f, o.batch_tokens));
}

/// Reusable buffers of one dispatch of a batch.
struct dispatch_buffers {
  std::vector<std::int32_t> expert, slot;
  std::vector<float> weight;
  std::vector<fate> fates;
  std::vector<std::int64_t> requested, kept, rerouted, dropped, received, load;
  std::vector<std::byte> ws;
  dispatch_totals totals{};
};

}  // namespace detail

/// Called as work advances: (units done, units total, what).
using plan_progress_fn = std::function<void(std::int64_t, std::int64_t, const std::string&)>;

/// @brief The whole planning run over the dump's layers.
/// @param order the token order batches cut (batch_order); empty = consecutive, which then
///        takes no [N] array (a 100M-token dump would need 800 MB for it)
/// @param bias [layers, E] expert bias (empty: zero bias where the preset has one)
/// @throws moeroute::error for a config the preset and a factor cannot form (it names it)
inline plan_result run_plan(const plan_options& o, const mapped_logits& dump,
                            std::span<const std::int64_t> order, std::span<const float> bias,
                            const plan_progress_fn& progress = {}) {
  plan_result res;
  const std::int64_t B = o.batch_tokens, N = dump.tokens(), Lyr = dump.layers();
  const std::int32_t E = o.base.num_experts, k = o.base.top_k;
  res.batch_tokens = B;
  res.batches = N / B;
  res.tokens_left_out = N - res.batches * B;
  const std::int64_t nb = res.batches;
  if (!order.empty() && static_cast<std::int64_t>(order.size()) != N)
    throw error(status::make(status_code::invalid_argument,
                             "run_plan: order has " + std::to_string(order.size()) +
                                 " entries for a dump of " + std::to_string(N) + " tokens"));
  if (B * k > std::numeric_limits<std::int32_t>::max())
    throw error(status::make(status_code::invalid_argument,
                             "run_plan: batch_tokens * top_k = " + std::to_string(B * k) +
                                 " does not fit the int32 request counts"));
  std::vector<std::int64_t> consecutive;  // this batch's rows when `order` is empty

  // the sweep's configs, in sweep order; combinations validate() rejects are left out
  struct cell_cfg {
    routing_config cfg;
    factor_choice f;
  };
  std::vector<cell_cfg> configs;
  for (const auto& f : o.factors)
    for (const auto& p : o.priorities)
      for (const auto& d : o.policies) {
        routing_config c;
        if (sweep_config(o.base, f, p, d, c)) configs.push_back({c, f});
      }
  const std::int64_t groups = o.base.capacity_groups(B);
  const std::int64_t group_tokens = o.base.capacity_group_tokens(B);
  const std::int64_t min_capacity = detail::capacity_at(o.base, 0.0001, B);

  std::vector<float> logits(static_cast<std::size_t>(B * E));
  std::vector<float> zero_bias(o.base.gating.expert_bias ? E : 0, 0.0f);
  std::vector<std::vector<detail::batch_requests>> all_layers;  // [layer][batch] (model-wide)
  const std::int64_t total_units = Lyr * nb;
  const double elem = static_cast<double>(size_of(o.buffer_dtype));
  for (std::int64_t layer = 0; layer < Lyr; ++layer) {
    std::span<const float> lb = bias.empty() ? std::span<const float>(zero_bias)
                                             : bias.subspan(static_cast<std::size_t>(layer * E),
                                                            static_cast<std::size_t>(E));
    // per (config, batch) values
    const std::size_t nc = configs.size();
    std::vector<std::vector<double>> drop(nc), full(nc), rer(nc), pad(nc);
    std::vector<std::vector<std::vector<double>>> rank_drop(
        nc, std::vector<std::vector<double>>(static_cast<std::size_t>(o.ranks)));
    std::vector<std::int64_t> buffer_rows(nc, 0), capacity(nc, 0);
    std::vector<detail::batch_requests> layer_batches;
    std::vector<double> load(E, 0.0), first(E, 0.0), last(E, 0.0);
    std::vector<detail::dispatch_buffers> dbs(configs.size());
    for (std::int64_t b = 0; b < nb; ++b) {
      if (progress)
        progress(layer * nb + b, total_units,
                 "layer " + std::to_string(layer + 1) + "/" + std::to_string(Lyr) + " batch " +
                     std::to_string(b + 1) + "/" + std::to_string(nb));
      std::span<const std::int64_t> rows;
      if (order.empty()) {
        consecutive.resize(static_cast<std::size_t>(B));
        std::iota(consecutive.begin(), consecutive.end(), b * B);
        rows = consecutive;
      } else {
        rows = order.subspan(static_cast<std::size_t>(b * B), static_cast<std::size_t>(B));
      }
      dump.gather(layer, rows, logits.data());
      // gating once per gating variant of the configs (reroute candidates, priorities)
      std::deque<cpu_gated> gatings;  // stable references
      const auto gating_for = [&](const routing_config& cfg) -> const cpu_gated& {
        for (const auto& g : gatings)
          if (g.variant == variant_of(cfg)) return g;
        const auto t0 = std::chrono::steady_clock::now();
        gatings.push_back(cpu_gate(cfg, logits, B, lb, 1, o.executor));
        res.gating_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!gatings.back().st) throw error(gatings.back().st);
        return gatings.back();
      };
      const cpu_gated& g0 = gating_for(o.base);
      res.nonfinite_logits += g0.nonfinite;
      // requests per capacity group and expert, and the expert load over the dump
      detail::batch_requests req;
      req.groups = groups;
      req.req.assign(static_cast<std::size_t>(groups * E), 0);
      for (std::int64_t t = 0; t < B; ++t)
        for (std::int32_t j = 0; j < k; ++j) {
          const std::int32_t e = g0.g.ids[static_cast<std::size_t>(t * k + j)];
          ++req.req[static_cast<std::size_t>((t / group_tokens) * E + e)];
          load[e] += 1.0;
          const std::int64_t at = rows[static_cast<std::size_t>(t)];
          if (at < N / 4) first[e] += 1.0;
          if (at >= N - N / 4) last[e] += 1.0;
        }
      layer_batches.push_back(req);

      // the configs' dispatches run in parallel, one config a task (each dispatch serial);
      // every task writes only its own config's buffers and values: thread-count independent
      std::vector<const cpu_gated*> gated(nc);  // gate first: the tasks only read
      for (std::size_t c = 0; c < nc; ++c) gated[c] = &gating_for(configs[c].cfg);
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<status> failed(nc);
      parallel_for(o.executor, static_cast<std::int64_t>(nc), [&](std::int64_t ci) {
        const auto c = static_cast<std::size_t>(ci);
        const routing_config& cfg = configs[c].cfg;
        detail::dispatch_buffers& db = dbs[c];
        const std::int64_t n = B * k;
        const std::int32_t ET = cfg.total_experts();
        db.expert.resize(n);
        db.slot.resize(n);
        db.weight.resize(n);
        db.fates.resize(n);
        for (auto* v : {&db.requested, &db.kept, &db.rerouted, &db.dropped}) v->resize(E);
        for (auto* v : {&db.received, &db.load}) v->resize(ET);
        db.ws.resize(cpu::dispatch_workspace_bytes(cfg, B));
        dispatch_params dp;
        dp.tokens = B;
        dp.gated = gated[c]->view();
        dp.out = {db.expert.data(),    db.slot.data(), db.weight.data(),   db.fates.data(),
                  db.requested.data(), db.kept.data(), db.rerouted.data(), db.dropped.data(),
                  db.received.data(),  db.load.data(), &db.totals};
        if (auto s = cpu::dispatch(cfg, dp, db.ws.data(), db.ws.size(), cpu::executor::serial());
            !s) {
          failed[c] = s;
          return;
        }
        capacity[c] = db.totals.capacity;
        drop[c].push_back(static_cast<double>(db.totals.dropped) / static_cast<double>(n));
        rer[c].push_back(static_cast<double>(db.totals.rerouted));
        std::int64_t fully = 0;
        for (std::int64_t t = 0; t < B; ++t) {
          bool any = false;
          for (std::int32_t j = 0; j < k; ++j) any = any || holds_row(db.fates[t * k + j]);
          fully += any ? 0 : 1;
        }
        full[c].push_back(static_cast<double>(fully));
        // the buffer: padded [ET, C] segments for a factor, compact blocks when dropless
        std::int64_t rows_needed = 0, used = 0;
        for (std::int32_t e = 0; e < ET; ++e) used += db.load[e];
        if (!configs[c].f.dropless) {
          rows_needed = layout_max_rows(cfg, B, layout_kind::padded);
        } else {
          for (std::int32_t e = 0; e < ET; ++e)
            rows_needed += (db.load[e] + o.block_size - 1) / o.block_size * o.block_size;
        }
        buffer_rows[c] = std::max(buffer_rows[c], rows_needed);
        pad[c].push_back(rows_needed > 0
                             ? 1.0 - static_cast<double>(used) / static_cast<double>(rows_needed)
                             : 0.0);
        for (std::int32_t r = 0; r < o.ranks; ++r) {
          std::int64_t dr = 0, rq = 0;
          for (std::int32_t e = 0; e < E; ++e)
            if (o.owner[e] == r) {
              dr += db.dropped[e];
              rq += db.requested[e];
            }
          rank_drop[c][r].push_back(rq > 0 ? static_cast<double>(dr) / static_cast<double>(rq)
                                           : 0.0);
        }
      });
      for (const auto& s : failed)
        if (!s) throw error(s);
      res.dispatch_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    for (std::size_t c = 0; c < nc; ++c) {
      plan_cell cell;
      cell.layer = layer;
      cell.factor = configs[c].f.label();
      cell.factor_value = configs[c].f.dropless ? NAN : configs[c].f.factor;
      cell.capacity = capacity[c];
      cell.priority_name = std::string(to_string(configs[c].cfg.dispatch.prio));
      cell.policy_name = std::string(to_string(configs[c].cfg.dispatch.dropped));
      cell.layout_name =
          configs[c].f.dropless ? "compact/" + std::to_string(o.block_size) : "padded";
      cell.drop_rate = summarize(drop[c]);
      cell.fully_dropped = summarize(full[c]);
      cell.rerouted = summarize(rer[c]);
      cell.padding_waste = summarize(pad[c]);
      cell.buffer_bytes =
          static_cast<std::int64_t>(static_cast<double>(buffer_rows[c] * o.hidden) * elem);
      for (std::int32_t r = 0; r < o.ranks; ++r)
        cell.rank_drop.push_back(summarize(rank_drop[c][r]));
      res.cells.push_back(std::move(cell));
    }
    // experts over the dump
    expert_usage u;
    u.layer = layer;
    const double total = std::accumulate(load.begin(), load.end(), 0.0);
    const double tf = std::accumulate(first.begin(), first.end(), 0.0);
    const double tl = std::accumulate(last.begin(), last.end(), 0.0);
    u.share.resize(E);
    u.first.resize(E);
    u.last.resize(E);
    for (std::int32_t e = 0; e < E; ++e) {
      u.share[e] = total > 0 ? load[e] / total : 0.0;
      u.first[e] = tf > 0 ? first[e] / tf : 0.0;
      u.last[e] = tl > 0 ? last[e] / tl : 0.0;
      u.drift += 0.5 * std::fabs(u.first[e] - u.last[e]);
      if (load[e] == 0)
        u.dead.push_back(e);
      else if (u.share[e] < o.cold_share / E)
        u.cold.push_back(e);
    }
    u.min_share = *std::min_element(u.share.begin(), u.share.end());
    u.max_share = *std::max_element(u.share.begin(), u.share.end());
    u.gini = detail::gini(u.share);
    res.experts.push_back(std::move(u));
    res.recommendations.push_back(detail::recommend(o, layer, layer_batches, min_capacity));
    for (const auto& b : layer_batches)
      res.state_bytes += static_cast<std::int64_t>(b.req.size() * sizeof(b.req[0]));
    all_layers.push_back(std::move(layer_batches));
  }
  // the model: one factor for every layer = the largest per-layer factor (overflow falls with
  // the factor in every layer); its costs summed over the layers
  recommendation m;
  m.layer = -1;
  m.met = !res.recommendations.empty();
  for (const auto& r : res.recommendations) {
    m.met = m.met && r.met;
    if (r.met && (std::isnan(m.factor) || r.factor > m.factor)) m.factor = r.factor;
  }
  if (m.met) {
    m.capacity = detail::capacity_at(o.base, m.factor, B);
    double pad = 0.0;
    for (std::int64_t layer = 0; layer < Lyr; ++layer) {
      const recommendation at = detail::costs_at(
          o, layer, all_layers[static_cast<std::size_t>(layer)], m.factor, m.capacity);
      m.overflow_quantile = std::max(m.overflow_quantile, at.overflow_quantile);
      m.overflow_max = std::max(m.overflow_max, at.overflow_max);
      m.buffer_bytes += at.buffer_bytes;
      m.dropless_bytes += at.dropless_bytes;
      pad += at.padding_waste;
      m.dropless_padding += at.dropless_padding / static_cast<double>(Lyr);
    }
    m.padding_waste = pad / static_cast<double>(std::max<std::int64_t>(Lyr, 1));
  }
  res.recommendations.push_back(m);
  if (progress) progress(total_units, total_units, "done");
  return res;
}

}  // namespace moeroute::planner
