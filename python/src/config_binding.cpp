// SPDX-License-Identifier: Apache-2.0
// moeroute.Config: routing_config with its fields by dotted name (the names validate() puts
// in its messages, moeroute/config_fields.hpp), the presets by name, and the size queries a
// caller needs before a call. Values are typed both ways: bool, int, float or an enum's name.
#include "module.hpp"

#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>

#include <moeroute/capacity.hpp>
#include <moeroute/config_fields.hpp>
#include <moeroute/layout_rows.hpp>
#include <moeroute/names.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/presets.hpp>

#include "arrays.hpp"
#include "ops.hpp"
#include "specs.hpp"

namespace moeroute::python {

namespace {

/// A Python value as the text set_field reads: true / false, repr() of a float (which reads
/// back to the same double), the decimal of an int, an enum's name.
std::string field_value_text(const py::handle& v) {
  // a numpy scalar or a 0-d array / tensor: its Python value
  if (!py::isinstance<py::str>(v) && py::hasattr(v, "item") &&
      (!py::hasattr(v, "ndim") || v.attr("ndim").cast<int>() == 0))
    return field_value_text(v.attr("item")());
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::float_>(v)) return py::repr(v).cast<std::string>();
  if (py::isinstance<py::int_>(v) || py::isinstance<py::str>(v)) return py::str(v);
  throw binding_error("a config value must be a bool, int, float or str, got " +
                      py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>());
}

py::object field_value(const routing_config& c, const std::string& name) {
  py::object out;
  for_each_field(
      [&](const char* field, const auto& v) {
        if (out || name != field) return;
        using T = std::remove_cvref_t<decltype(v)>;
        if constexpr (named_enum<T>)
          out = py::str(std::string(to_string(v)));
        else if constexpr (std::is_same_v<T, bool>)
          out = py::bool_(v);
        else if constexpr (std::is_floating_point_v<T>)
          out = py::float_(static_cast<double>(v));
        else
          out = py::int_(v);
      },
      c);
  if (!out) throw py::key_error("'" + name + "': not a routing_config field");
  return out;
}

py::list specs_list(const std::vector<spec>& specs) {
  py::list l;
  for (const auto& s : specs)
    l.append(py::make_tuple(s.name, py::tuple(py::cast(s.shape.vector())), elem_name(s.dtype)));
  return l;
}

}  // namespace

layout_kind parse_layout_kind(const std::string& s) {
  if (const auto k = parse<layout_kind>(s)) return *k;
  throw binding_error("layout: '" + s + "' is not a layout (padded or compact)");
}

void bind_config(py::module_& m) {
  py::class_<routing_config>(m, "Config", py::module_local(),
                             R"(A routing configuration: every field by its dotted
name, as the C++ routing_config and docs/api.md spell it ("capacity.factor",
"dispatch.dropped"). Config.preset() builds a peer's routing by name.)")
      .def(py::init([](const std::string& text) {
             routing_config c;
             raise_if(set_fields(c, text));
             return c;
           }),
           py::arg("text") = "", "Default config with 'name=value' assignments applied.")
      .def_static(
          "preset",
          [](const std::string& name, std::int32_t experts, std::int32_t k) {
            const presets::preset_info* p = presets::find(name);
            routing_config c;
            raise_if(presets::by_name(name, experts > 0 ? experts : (p ? p->default_experts : 0),
                                      k > 0 ? k : (p ? p->default_k : 0), c));
            return c;
          },
          py::arg("name"), py::arg("num_experts") = 0, py::arg("top_k") = 0,
          "The named preset (moeroute.presets() lists them) for num_experts experts and top-k "
          "(0: the preset's model).")
      // The presets with their options, as the C++ functions in moeroute/presets.hpp take them
      .def_static(
          "megatron",
          [](std::int32_t experts, std::int32_t k, const std::string& score, bool pre_softmax,
             std::optional<double> capacity_factor, std::int32_t groups, std::int32_t group_topk,
             std::optional<float> scaling_factor, bool expert_bias) {
            presets::megatron_options o;
            const auto f = parse<score_function>(score);
            if (!f)
              throw binding_error("megatron: score '" + score + "' is not one of " +
                                  known_names<score_function>());
            o.score = *f;
            o.pre_softmax = pre_softmax;
            if (capacity_factor) o.capacity_factor = *capacity_factor;
            o.groups = groups;
            o.group_topk = group_topk;
            o.scaling_factor = scaling_factor.value_or(1.0f);  // None: no scaling (TE, Megatron)
            o.expert_bias = expert_bias;
            return presets::megatron(experts, k, o);
          },
          py::arg("num_experts"), py::arg("top_k"), py::kw_only(), py::arg("score") = "softmax",
          py::arg("pre_softmax") = false, py::arg("capacity_factor") = py::none(),
          py::arg("groups") = 0, py::arg("group_topk") = 0, py::arg("scaling_factor") = py::none(),
          py::arg("expert_bias") = false,
          "Megatron-Core's TopKRouter (moe_router_score_function, moe_router_pre_softmax, "
          "moe_expert_capacity_factor (None: dropless), moe_router_num_groups / group_topk, "
          "moe_router_topk_scaling_factor, moe_router_enable_expert_bias)")
      .def_static("deepspeed_top2", &presets::deepspeed_top2, py::arg("num_experts"),
                  py::arg("capacity_factor") = 1.0, py::arg("min_capacity") = 4,
                  "DeepSpeed top2gating / GShard top-2")
      .def_static("deepspeed_topk", &presets::deepspeed_topk, py::arg("num_experts"),
                  py::arg("top_k"), py::arg("capacity_factor") = 1.0, py::arg("min_capacity") = 4,
                  "DeepSpeed topkgating")
      .def_static("mixtral", &presets::mixtral, py::arg("num_experts") = 8, py::arg("top_k") = 2)
      .def_static("qwen_moe", &presets::qwen_moe, py::arg("num_experts") = 128,
                  py::arg("top_k") = 8, py::arg("norm_topk_prob") = true,
                  "Qwen2-MoE / Qwen3-MoE (HF norm_topk_prob)")
      .def_static("olmoe", &presets::olmoe, py::arg("num_experts") = 64, py::arg("top_k") = 8)
      .def_static("deepseek_v3", &presets::deepseek_v3, py::arg("num_experts") = 256,
                  py::arg("top_k") = 8, py::arg("groups") = 8, py::arg("group_topk") = 4,
                  "DeepSeek-V3 (n_group, topk_group)")
      .def_static("switch_transformers", &presets::switch_transformers, py::arg("num_experts") = 8,
                  py::arg("expert_capacity") = 64, py::arg("row_tokens") = 0,
                  "HF SwitchTransformers: expert_capacity counted per batch row of row_tokens")
      .def_static(
          "nllb_moe",
          [](std::int32_t experts, std::optional<std::int64_t> expert_capacity,
             bool batch_prioritized_routing, bool normalize_before_dropping, bool training,
             double eval_fraction) {
            presets::nllb_moe_options o;
            o.expert_capacity = expert_capacity.value_or(-1);
            o.batch_prioritized_routing = batch_prioritized_routing;
            o.normalize_router_prob_before_dropping = normalize_before_dropping;
            o.training = training;
            o.eval_capacity_token_fraction = eval_fraction;
            return presets::nllb_moe(experts, o);
          },
          py::arg("num_experts") = 128, py::kw_only(), py::arg("expert_capacity") = py::none(),
          py::arg("batch_prioritized_routing") = false,
          py::arg("normalize_router_prob_before_dropping") = false, py::arg("training") = true,
          py::arg("moe_eval_capacity_token_fraction") = 1.0,
          "HF NLLB-MoE top-2 (second_expert_policy all), with NllbMoeConfig's options")
      .def("__getitem__", &field_value)
      .def("__setitem__",
           [](routing_config& c, const std::string& name, const py::handle& v) {
             raise_if(set_field(c, name, field_value_text(v)));
             // top_n is read only by sum_top_n (validate() insists it is 0 otherwise): moving a
             // DeepSeek-style config to another group score takes it along, rather than
             // failing later at a stage
             if (name == "gating.group_limit.score" &&
                 c.gating.group_limit.score != group_score::sum_top_n)
               c.gating.group_limit.top_n = 0;
           })
      .def(
          "fields",
          [](const routing_config& c) {
            py::dict d;
            for_each_field([&](const char* f, const auto&) { d[f] = field_value(c, f); }, c);
            return d;
          },
          "Every field by name, in declaration order.")
      .def(
          "validate", [](const routing_config& c) { raise_if(validate(c)); },
          "Raises moeroute.Error naming the first bad field.")
      .def("copy", [](const routing_config& c) { return c; })
      .def("__copy__", [](const routing_config& c) { return c; })
      .def("__deepcopy__", [](const routing_config& c, py::dict) { return c; })
      .def("__eq__",
           [](const routing_config& a, const routing_config& b) {
             return to_string(a, true) == to_string(b, true);
           })
      .def("__str__", [](const routing_config& c) { return to_string(c, false); })
      .def("__repr__",
           [](const routing_config& c) { return "moeroute.Config('" + to_string(c, false) + "')"; })
      .def(py::pickle([](const routing_config& c) { return to_string(c, true); },
                      [](const std::string& s) {
                        routing_config c;
                        raise_if(set_fields(c, s));
                        return c;
                      }))
      .def_property_readonly("num_experts", [](const routing_config& c) { return c.num_experts; })
      .def_property_readonly("top_k", [](const routing_config& c) { return c.top_k; })
      .def_property_readonly("total_experts", &routing_config::total_experts,
                             "E, plus one for a dedicated fallback expert")
      .def_property_readonly(
          "reroute_candidates", [](const routing_config& c) { return c.reroute_candidates(); },
          "R: next-best experts gating keeps per token for next_choice")
      .def(
          "capacity",
          [](const routing_config& c, std::int64_t tokens) {
            raise_if(param_checks::validate_extents(c, tokens));
            return expert_capacity(c, tokens, c.capacity_group_tokens(tokens));
          },
          py::arg("tokens"), "C of each routed expert for a batch of `tokens` (-1: unbounded)")
      .def(
          "max_rows",
          [](const routing_config& c, std::int64_t tokens, const std::string& kind,
             std::int64_t block_size) {
            raise_if(param_checks::validate_extents(c, tokens));
            return max_rows_of(c, tokens, parse_layout_kind(kind), block_size, 0);
          },
          py::arg("tokens"), py::arg("layout") = "padded", py::arg("block_size") = 1,
          "Rows of the expert buffer of a layout for `tokens` tokens")
      .def(
          "with_sequence_aux",
          [](const routing_config& c, std::int64_t length, const std::string& peer) {
            using presets::sequence_aux_peer;
            sequence_aux_peer p;
            if (peer == "deepseek")
              p = sequence_aux_peer::deepseek;
            else if (peer == "megatron")
              p = sequence_aux_peer::megatron;
            else if (peer == "transformer_engine")
              p = sequence_aux_peer::transformer_engine;
            else
              throw binding_error("with_sequence_aux: peer '" + peer +
                                  "' is not one of deepseek, megatron, transformer_engine");
            return presets::with_sequence_aux(c, length, p);
          },
          py::arg("sequence_length"), py::arg("peer") = "deepseek",
          "This config with the per-sequence aux loss over sequences of `sequence_length` tokens, "
          "laid out and reduced as `peer` (deepseek, megatron, transformer_engine) does");

  m.def("presets", [] {
    py::list l;
    for (const auto& p : presets::registry)
      l.append(py::dict(py::arg("name") = std::string(p.name),
                        py::arg("description") = std::string(p.description),
                        py::arg("num_experts") = p.default_experts, py::arg("top_k") = p.default_k,
                        py::arg("fixed_k") = p.fixed_k, py::arg("hidden") = p.default_hidden));
    return l;
  });

  m.def(
      "gating_outputs",
      [](const routing_config& c, std::int64_t tokens, bool per_token_aux, bool replay) {
        raise_if(param_checks::validate_extents(c, tokens));
        return specs_list(gating_outputs(c, tokens, per_token_aux, replay));
      },
      py::arg("config"), py::arg("tokens"), py::arg("per_token_aux") = false,
      py::arg("replay") = false);
  m.def(
      "dispatch_outputs",
      [](const routing_config& c, std::int64_t tokens) {
        raise_if(param_checks::validate_extents(c, tokens));
        return specs_list(dispatch_outputs(c, tokens));
      },
      py::arg("config"), py::arg("tokens"));
  m.def(
      "layout_outputs",
      [](const routing_config& c, std::int64_t tokens, const std::string& kind,
         std::int64_t block_size, std::int32_t local_experts) {
        raise_if(param_checks::validate_extents(c, tokens));
        return specs_list(
            layout_outputs(c, tokens, parse_layout_kind(kind), block_size, local_experts));
      },
      py::arg("config"), py::arg("tokens"), py::arg("layout"), py::arg("block_size"),
      py::arg("local_experts") = 0);
  m.def("gating_workspace_bytes", &gating_workspace_bytes, py::arg("config"), py::arg("tokens"),
        py::arg("cuda") = false);
  m.def("dispatch_workspace_bytes", &dispatch_workspace_bytes, py::arg("config"), py::arg("tokens"),
        py::arg("cuda") = false);
  m.attr("totals_fields") = py::cast(std::vector<std::string>(std::begin(dispatch_totals_fields),
                                                              std::end(dispatch_totals_fields)));
}

}  // namespace moeroute::python
