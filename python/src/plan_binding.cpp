// SPDX-License-Identifier: Apache-2.0
// moeroute.plan on in-memory logits: the capacity planner (moeroute/planner/plan.hpp in
// tools/capacity, the code behind `moeroute-capacity --batch-tokens`) run on an array instead of a
// mapped .npy, with its results as plain Python data.
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <moeroute/names.hpp>
#include <moeroute/planner/agreement.hpp>
#include <moeroute/planner/plan.hpp>

#include "arrays.hpp"
#include "module.hpp"

namespace moeroute::python {

namespace {

py::dict distribution_dict(const planner::distribution& d) {
  return py::dict(py::arg("mean") = d.mean, py::arg("p50") = d.p50, py::arg("p95") = d.p95,
                  py::arg("p99") = d.p99, py::arg("max") = d.max);
}

template <class Enum>
std::vector<std::optional<Enum>> parse_choices(const std::vector<std::string>& names,
                                               const char* arg) {
  std::vector<std::optional<Enum>> out;
  for (const auto& n : names) {
    if (n == "preset") {
      out.emplace_back();
    } else if (const auto v = parse<Enum>(n)) {
      out.emplace_back(*v);
    } else {
      throw binding_error(std::string("plan: ") + arg + ": unknown value '" + n +
                          "' (known: preset, " + known_names<Enum>() + ")");
    }
  }
  if (out.empty()) throw binding_error(std::string("plan: ") + arg + ": the list is empty");
  return out;
}

std::vector<planner::factor_choice> parse_factors(const py::list& factors) {
  std::vector<planner::factor_choice> out;
  for (const auto& f : factors) {
    if (py::isinstance<py::str>(f) && f.cast<std::string>() == "dropless") {
      out.push_back({true, 0.0});
      continue;
    }
    if (!py::isinstance<py::float_>(f) && !py::isinstance<py::int_>(f))
      throw binding_error("plan: factors: '" + py::str(f).cast<std::string>() +
                          "' is not a capacity factor (a number or 'dropless')");
    const double v = f.cast<double>();
    if (!std::isfinite(v) || v <= 0.0 || v > 1e6)
      throw binding_error("plan: factors: " + py::repr(f).cast<std::string>() +
                          " is not in (0, 1e6]");
    out.push_back({false, v});
  }
  if (out.empty()) throw binding_error("plan: factors: the list is empty");
  return out;
}

py::dict result_dict(const planner::plan_result& r) {
  py::list cells, experts, recs;
  for (const auto& c : r.cells) {
    py::list ranks;
    for (const auto& d : c.rank_drop) ranks.append(distribution_dict(d));
    cells.append(py::dict(
        py::arg("layer") = c.layer, py::arg("factor") = c.factor,
        py::arg("factor_value") = c.factor_value, py::arg("capacity") = c.capacity,
        py::arg("priority") = c.priority_name, py::arg("policy") = c.policy_name,
        py::arg("layout") = c.layout_name, py::arg("drop_rate") = distribution_dict(c.drop_rate),
        py::arg("fully_dropped") = distribution_dict(c.fully_dropped),
        py::arg("rerouted") = distribution_dict(c.rerouted),
        py::arg("padding_waste") = distribution_dict(c.padding_waste),
        py::arg("buffer_bytes") = c.buffer_bytes, py::arg("rank_drop_rate") = ranks));
  }
  for (const auto& u : r.experts)
    experts.append(py::dict(py::arg("layer") = u.layer, py::arg("share") = u.share,
                            py::arg("min_share") = u.min_share, py::arg("max_share") = u.max_share,
                            py::arg("gini") = u.gini, py::arg("cold") = u.cold,
                            py::arg("dead") = u.dead, py::arg("first_quarter") = u.first,
                            py::arg("last_quarter") = u.last, py::arg("drift") = u.drift));
  for (const auto& x : r.recommendations)
    recs.append(py::dict(
        py::arg("layer") = x.layer < 0 ? py::object(py::none()) : py::object(py::int_(x.layer)),
        py::arg("met") = x.met, py::arg("factor") = x.factor, py::arg("capacity") = x.capacity,
        py::arg("overflow_quantile") = x.overflow_quantile,
        py::arg("overflow_max") = x.overflow_max, py::arg("buffer_bytes") = x.buffer_bytes,
        py::arg("padding_waste") = x.padding_waste, py::arg("dropless_bytes") = x.dropless_bytes,
        py::arg("dropless_padding") = x.dropless_padding));
  return py::dict(py::arg("batches") = r.batches, py::arg("batch_tokens") = r.batch_tokens,
                  py::arg("tokens_left_out") = r.tokens_left_out,
                  py::arg("nonfinite_logits") = r.nonfinite_logits, py::arg("cells") = cells,
                  py::arg("experts") = experts, py::arg("recommendations") = recs,
                  py::arg("gating_seconds") = r.gating_seconds,
                  py::arg("dispatch_seconds") = r.dispatch_seconds);
}

}  // namespace

void bind_plan(py::module_& m) {
  m.def(
      "plan",
      [](const routing_config& base, py::dict arrays, const py::list& factors,
         const std::vector<std::string>& priorities, const std::vector<std::string>& policies,
         std::int64_t batch_tokens, const std::string& batching, std::uint64_t seed,
         double target_drop, double quantile, double cold_share, std::int64_t hidden,
         const std::string& buffer_dtype, std::int64_t block_size,
         const std::vector<std::int32_t>& owner, int threads) {
        call_arrays a("plan", std::move(arrays));
        if (auto s = validate(base); !s) throw binding_error("plan: " + s.message);
        const std::int64_t E = base.num_experts;
        const array_view lg = a.view("logits", {-1, -1, E}, {elem::f32, elem::f16}, false);
        if (!(lg.place == device_place{}))
          a.fail("logits: planning runs on the CPU; pass a CPU array (tensor.cpu())");
        const std::int64_t L = lg.shape[0], N = lg.shape[1];
        if (N == 0 || L == 0) a.fail("logits: no tokens");
        if (batch_tokens < 1 || batch_tokens > N)
          a.fail("batch_tokens = " + std::to_string(batch_tokens) + ": must be in [1, " +
                 std::to_string(N) + "] (the tokens of the logits)");
        if (auto s = validate_tokens(base, batch_tokens); !s) a.fail("batch_tokens: " + s.message);
        if (!(target_drop >= 0.0 && target_drop <= 1.0)) a.fail("target_drop: must be in [0, 1]");
        if (!(quantile >= 0.0 && quantile <= 1.0)) a.fail("quantile: must be in [0, 1]");
        if (!(cold_share >= 0.0 && cold_share <= 1.0)) a.fail("cold_share: must be in [0, 1]");
        if (hidden < 1) a.fail("hidden: must be >= 1");
        if (block_size < 1) a.fail("block_size: must be >= 1");
        const std::optional<dtype> dt = parse_dtype(buffer_dtype);
        if (!dt) a.fail("buffer_dtype: '" + buffer_dtype + "' is not one of f32, f16, bf16");
        const std::optional<planner::batching> how_given = planner::parse_batching(batching);
        if (!how_given)
          a.fail("batching: '" + batching + "' is not one of consecutive, shuffled, grouped");
        const planner::batching how = *how_given;
        const double* ids =
            a.in<double>({"group_ids", {N}, elem::f64}, how == planner::batching::grouped);
        std::vector<double> group_ids;
        if (ids != nullptr) {
          group_ids.assign(ids, ids + N);
          for (double v : group_ids)
            if (!std::isfinite(v)) a.fail("group_ids: every id must be finite");
        }
        std::vector<float> bias;
        if (a.has("bias")) {
          if (!base.gating.expert_bias)
            a.fail(
                "bias: the config routes without an expert bias (set gating.expert_bias = "
                "True, or use a biased preset such as deepseek_v3)");
          const array_view b = a.view("bias", {-1, E}, {elem::f32}, false);
          if (b.shape[0] != L && b.shape[0] != 1)
            a.fail("bias: shape " + shape_text(b.shape) + ", expected [" + std::to_string(L) +
                   ", " + std::to_string(E) + "] or [1, " + std::to_string(E) + "]");
          const auto* v = static_cast<const float*>(b.data);
          for (std::int64_t l = 0; l < L; ++l)
            for (std::int64_t e = 0; e < E; ++e) {
              const float x = v[(b.shape[0] == 1 ? 0 : l) * E + e];
              if (!std::isfinite(x)) a.fail("bias: every bias must be finite");
              bias.push_back(x);
            }
        }
        planner::plan_options o;
        o.base = base;
        o.factors = parse_factors(factors);
        o.priorities = parse_choices<priority>(priorities, "priorities");
        o.policies = parse_choices<drop_policy>(policies, "policies");
        o.batch_tokens = batch_tokens;
        o.block_size = block_size;
        o.hidden = hidden;
        o.buffer_dtype = *dt;
        o.target_drop = target_drop;
        o.quantile = quantile;
        o.cold_share = cold_share;
        o.executor = threads == 1 ? cpu::executor::serial() : cpu::executor::openmp(threads);
        if (!owner.empty()) {
          if (static_cast<std::int64_t>(owner.size()) != E)
            a.fail("expert_ranks: " + std::to_string(owner.size()) +
                   " entries, expected one rank "
                   "per expert (" +
                   std::to_string(E) + ")");
          std::int32_t ranks = 0;
          for (auto r : owner) {
            if (r < 0) a.fail("expert_ranks: ranks must be >= 0");
            ranks = std::max(ranks, r + 1);
          }
          o.owner = owner;
          o.ranks = ranks;
        }
        const auto dump = planner::mapped_logits::view(
            lg.data, lg.dtype == elem::f32 ? io::npy_dtype::f32 : io::npy_dtype::f16, L, N, E);
        planner::plan_result r;
        {
          py::gil_scoped_release nogil;
          const auto order = how == planner::batching::consecutive
                                 ? std::vector<std::int64_t>{}
                                 : planner::batch_order(N, how, seed, group_ids);
          r = planner::run_plan(o, dump, order, bias);
        }
        return result_dict(r);
      },
      py::arg("config"), py::arg("arrays"), py::arg("factors"), py::arg("priorities"),
      py::arg("policies"), py::arg("batch_tokens"), py::arg("batching"), py::arg("seed"),
      py::arg("target_drop"), py::arg("quantile"), py::arg("cold_share"), py::arg("hidden"),
      py::arg("buffer_dtype"), py::arg("block_size"), py::arg("expert_ranks"), py::arg("threads"));

  // moeroute.agreement: moeroute/planner/agreement.hpp on two arrays [layers, N, E]
  m.def(
      "agreement",
      [](routing_config cfg, py::dict arrays, float tie_margin, int threads) {
        // cfg by value: read without the GIL below (see ops.hpp)
        call_arrays a("agreement", std::move(arrays));
        if (auto s = validate(cfg); !s) throw binding_error("agreement: " + s.message);
        const std::int64_t E = cfg.num_experts;
        const array_view va = a.view("a", {-1, -1, E}, {elem::f32, elem::f16}, false);
        const array_view vb = a.view("b", {-1, -1, E}, {elem::f32, elem::f16}, false);
        if (!(va.place == device_place{}) || !(vb.place == device_place{}))
          a.fail("the logits must be CPU arrays (tensor.cpu())");
        const auto dump = [&](const array_view& v) {
          return planner::mapped_logits::view(
              v.data, v.dtype == elem::f32 ? io::npy_dtype::f32 : io::npy_dtype::f16, v.shape[0],
              v.shape[1], E);
        };
        planner::agreement_options o;
        o.tie_margin = tie_margin;
        o.executor = threads == 1 ? cpu::executor::serial() : cpu::executor::openmp(threads);
        planner::agreement_report r;
        status st;
        {
          py::gil_scoped_release nogil;
          st = planner::agreement(cfg, dump(va), dump(vb), o, r);
        }
        if (!st) a.fail(st.message);
        py::list layers;
        for (const auto& l : r.layers)
          layers.append(py::dict(
              py::arg("tokens") = l.tokens, py::arg("tokens_differ") = l.tokens_differ,
              py::arg("token_flip_rate") = l.token_flip_rate(),
              py::arg("slots_differ") = l.slots_differ,
              py::arg("slot_flip_rate") = l.slot_flip_rate(r.k),
              py::arg("gate_mass_moved") = l.mean_gate_mass_moved(),
              py::arg("near_ties") = l.near_ties, py::arg("near_tie_share") = l.near_tie_share()));
        return py::dict(
            py::arg("tokens") = r.tokens, py::arg("experts") = r.experts, py::arg("top_k") = r.k,
            py::arg("tokens_differ_any_layer") = r.tokens_differ_any_layer,
            py::arg("any_layer_flip_rate") = r.any_layer_flip_rate(), py::arg("layers") = layers);
      },
      py::arg("config"), py::arg("arrays"), py::arg("tie_margin"), py::arg("threads"));
}

}  // namespace moeroute::python
