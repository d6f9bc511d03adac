// SPDX-License-Identifier: Apache-2.0
// The one loader of the golden peer cases (tests/data/golden, tests/data/golden-grad: the
// format is in their READMEs) and the one mapping from a case to a routing_config, shared by
// every test that reads them: the reference's parity tests, the gradient parity test and the
// GPU tests that route the peers' logits.
//
// Two configs per case:
//   preset_for()            the named preset with only the knobs a user would pass (the case's
//                           peer, k, capacity factor, options) — what the tests route with;
//   config_from_semantics() the case's "semantics" block read field by field, independently of
//                           the presets — what the preset must equal (config_diff).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <moeroute/config.hpp>
#include <moeroute/config_fields.hpp>
#include <moeroute/names.hpp>
#include <moeroute/presets.hpp>

namespace moeroute::test {

using json = nlohmann::json;

/// A golden directory: the environment variable `env` when set, else MOEROUTE_TEST_DATA_DIR/sub.
/// `is_default` says which (the default directory's case count is pinned by the tests).
inline std::string golden_directory(const char* env, const char* sub, bool* is_default = nullptr) {
  const char* v = std::getenv(env);
  const bool from_env = v != nullptr && *v != '\0';
  if (is_default != nullptr) *is_default = !from_env;
  return from_env ? std::string(v) : std::string(MOEROUTE_TEST_DATA_DIR) + "/" + sub;
}

/// One golden file: its path and parsed document (tokens, experts, logits, cases).
struct golden_file {
  std::string path;
  json doc;
  [[nodiscard]] std::string name() const { return std::filesystem::path(path).filename().string(); }
};

/// Every *.json in `dir`, sorted by name, parsed. Throws on a missing directory or a bad file.
inline std::vector<golden_file> load_golden_files(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw std::runtime_error("golden directory not found: " + dir);
  std::vector<std::string> paths;
  for (const auto& ent : fs::directory_iterator(dir))
    if (ent.is_regular_file() && ent.path().extension() == ".json")
      paths.push_back(ent.path().string());
  std::sort(paths.begin(), paths.end());
  std::vector<golden_file> files;
  for (const auto& p : paths) {
    std::ifstream in(p);
    if (!in) throw std::runtime_error("cannot open " + p);
    golden_file f{p, {}};
    try {
      f.doc = json::parse(in);
    } catch (const json::exception& e) {
      throw std::runtime_error("cannot parse " + p + ": " + e.what());
    }
    if (!f.doc.contains("cases") || !f.doc["cases"].is_array())
      throw std::runtime_error(p + ": no \"cases\" array");
    files.push_back(std::move(f));
  }
  return files;
}

inline std::size_t count_cases(const std::vector<golden_file>& files) {
  std::size_t n = 0;
  for (const auto& f : files) n += f.doc["cases"].size();
  return n;
}

/// The [T, E] logits of a golden file, row-major. Throws on a ragged or short matrix.
inline std::vector<float> golden_logits(const json& doc) {
  const auto T = doc.at("tokens").get<std::int64_t>();
  const auto E = doc.at("experts").get<std::int32_t>();
  const json& rows = doc.at("logits");
  if (static_cast<std::int64_t>(rows.size()) != T)
    throw std::runtime_error("logits has " + std::to_string(rows.size()) +
                             " rows, tokens = " + std::to_string(T));
  std::vector<float> x;
  x.reserve(static_cast<std::size_t>(T * E));
  for (const auto& row : rows) {
    if (static_cast<std::int32_t>(row.size()) != E)
      throw std::runtime_error("logits row of wrong length");
    for (const auto& v : row) x.push_back(v.get<float>());
  }
  return x;
}

inline bool null_or_missing(const json& j, const char* key) {
  return !j.contains(key) || j[key].is_null();
}

inline std::string str_or(const json& j, const char* key, const std::string& fallback) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

/// The enum named `s`, or a runtime_error naming the field.
template <class Enum>
Enum parse_or_throw(const std::string& s, const char* field) {
  const auto v = parse<Enum>(s);
  if (!v) throw std::runtime_error(std::string("unknown ") + field + ": " + s);
  return *v;
}

/// The peers the golden cases come from.
enum class peer { deepspeed, megatron, seed };

inline peer peer_of(const json& cs) {
  const std::string src = cs.at("source").get<std::string>();
  if (src.find("DeepSpeed") != std::string::npos) return peer::deepspeed;
  if (src.find("Megatron") != std::string::npos) return peer::megatron;
  if (src.find("seed") != std::string::npos) return peer::seed;
  throw std::runtime_error("case " + cs.value("name", std::string("?")) + ": unknown source " +
                           src);
}

/// The named preset for a case, with only the knobs a user would pass (k, factor, options).
inline routing_config preset_for(const json& cs, std::int32_t experts) {
  const json& sem = cs.at("semantics");
  const std::int32_t k = sem.at("k").get<std::int32_t>();
  const bool has_cap = !null_or_missing(sem, "capacity");
  const double factor = has_cap ? sem["capacity"].at("factor").get<double>() : 1.0;
  switch (peer_of(cs)) {
    case peer::deepspeed: {
      const std::int64_t minc = sem["capacity"].at("min_capacity").get<std::int64_t>();
      if (str_or(sem, "priority", "") == "choice_major")
        return presets::deepspeed_top2(experts, factor, minc);
      return presets::deepspeed_topk(experts, k, factor, minc);
    }
    case peer::seed:
      return presets::seed_reference(experts, k, factor);
    case peer::megatron: {
      presets::megatron_options o;
      o.score = parse_or_throw<score_function>(sem.at("score").get<std::string>(), "score");
      o.pre_softmax =
          o.score == score_function::softmax && sem.at("select_from").get<std::string>() == "probs";
      if (has_cap) o.capacity_factor = factor;
      if (!null_or_missing(sem, "group_limited")) {
        o.groups = sem["group_limited"].at("groups").get<std::int32_t>();
        o.group_topk = sem["group_limited"].at("group_topk").get<std::int32_t>();
      }
      if (!null_or_missing(sem, "scaling_factor"))
        o.scaling_factor = sem["scaling_factor"].get<float>();
      o.expert_bias = !null_or_missing(sem, "expert_bias");
      return presets::megatron(experts, k, o);
    }
  }
  throw std::runtime_error("unreachable");
}

/// The case's expert bias ([E]) when its semantics has one, else empty.
inline std::vector<float> golden_bias(const json& cs) {
  const json& sem = cs.at("semantics");
  return null_or_missing(sem, "expert_bias") ? std::vector<float>{}
                                             : sem["expert_bias"].get<std::vector<float>>();
}

/// The config the semantics block describes, field by field, independently of the presets.
inline routing_config config_from_semantics(const json& sem, std::int32_t experts) {
  routing_config c;
  c.num_experts = experts;
  c.top_k = sem.at("k").get<std::int32_t>();
  c.gating.score = parse_or_throw<score_function>(sem.at("score").get<std::string>(), "score");
  c.gating.renorm =
      parse_or_throw<renormalize>(sem.at("renormalize").get<std::string>(), "renormalize");
  c.gating.select =
      parse_or_throw<select_from>(sem.at("select_from").get<std::string>(), "select_from");
  // Selecting on softmax logits and renormalising over the k chosen is the softmax over the
  // k chosen logits (the scores over all experts are never formed).
  if (c.gating.select == select_from::logits && c.gating.score == score_function::softmax &&
      c.gating.renorm == renormalize::before_drop)
    c.gating.stage = softmax_stage::after_topk;
  // "for sigmoid with k>1 the divisor gets +1e-20"
  if (c.gating.score == score_function::sigmoid && c.gating.renorm == renormalize::before_drop)
    c.gating.renorm_epsilon = c.top_k > 1 ? 1e-20f : 0.0f;
  if (!null_or_missing(sem, "scaling_factor"))
    c.gating.scaling_factor = sem["scaling_factor"].get<float>();
  c.gating.expert_bias = !null_or_missing(sem, "expert_bias");
  if (!null_or_missing(sem, "group_limited")) {
    const json& gl = sem["group_limited"];
    c.gating.group_limit = {gl.at("groups").get<std::int32_t>(),
                            gl.at("group_topk").get<std::int32_t>()};
  }

  if (null_or_missing(sem, "capacity")) {
    c.capacity.mode = capacity_mode::unbounded;
  } else {
    const json& cap = sem["capacity"];
    c.capacity.mode = capacity_mode::factor;
    c.capacity.factor = cap.at("factor").get<double>();
    c.capacity.includes_k = cap.at("includes_k").get<bool>();
    c.capacity.rounding =
        parse_or_throw<capacity_rounding>(cap.at("rounding").get<std::string>(), "rounding");
    c.capacity.min_capacity =
        null_or_missing(cap, "min_capacity") ? 0 : cap["min_capacity"].get<std::int64_t>();
    c.capacity.no_drop_when_exceeds_tokens =
        cap.contains("no_drop_when_capacity_exceeds_tokens") &&
        cap["no_drop_when_capacity_exceeds_tokens"].get<bool>();
  }

  // Dropless cases have no priority (nothing competes); Megatron's dispatch is still by score.
  c.dispatch.prio = sem.contains("priority")
                        ? parse_or_throw<priority>(sem["priority"].get<std::string>(), "priority")
                        : priority::score_per_expert;
  c.dispatch.slots =
      parse_or_throw<slot_order>(str_or(sem, "slot_order", "priority"), "slot_order");
  c.dispatch.dropped =
      parse_or_throw<drop_policy>(str_or(sem, "dropped", "zero_weight"), "dropped");

  const json& aux = sem.at("aux_loss");
  c.loss.counts = parse_or_throw<aux_counts>(aux.at("counts").get<std::string>(), "aux counts");
  c.loss.count_source = str_or(aux, "f", "").find("fresh top-k") != std::string::npos
                            ? aux_count_source::fresh_topk
                            : aux_count_source::routed;
  const std::string scale = aux.at("scale").get<std::string>();
  if (scale == "sum(P*f)*E" || scale == "E*sum(f*P)")
    c.loss.scale = aux_scale::e_times_sum;
  else if (scale == "sum(P*f)*E/k" || scale == "E/(k*T*T)*sum_i(sum_t P[t,i])*count_i")
    c.loss.scale = aux_scale::e_over_k_sum;
  else
    throw std::runtime_error("unknown aux scale: " + scale);
  c.loss.aux_coefficient = 1.0f;
  c.loss.z_coefficient = 1.0f;
  return c;
}

/// Fields of the preset that disagree with the semantics block ("" when they all agree). Only
/// what a semantics block states is compared: not noise seeds, fallback or reroute settings;
/// the capacity bound and slot order only for a factor capacity; the renormalisation epsilon
/// only where the preset renormalises before drop.
inline std::string config_diff(const routing_config& p, const routing_config& s) {
  const bool factor = s.capacity.mode == capacity_mode::factor;
  const auto compared = [&](std::string_view n) {
    if (n == "gating.renorm_epsilon") return p.gating.renorm == renormalize::before_drop;
    if (n == "capacity.eval_factor" || n == "capacity.fixed") return false;
    if (n == "dispatch.slots" || (n.starts_with("capacity.") && n != "capacity.mode"))
      return factor;
    for (std::string_view skip :
         {"training", "gating.bias_update.", "gating.noise.", "dispatch.fallback.",
          "dispatch.reroute.", "dispatch.random_", "loss.sequence_length"})
      if (n.starts_with(skip)) return n == "gating.noise.kind";
    return true;
  };
  std::string d;
  for_each_field(
      [&](const char* name, const auto& a, const auto& b) {
        if (!compared(name) || detail::same_field(a, b)) return;
        d += std::string(name) + ": preset " + detail::field_text(a) + " vs semantics " +
             detail::field_text(b) + "; ";
      },
      p, s);
  return d;
}

// ---------------------------------------------------------------------------------------------
// HuggingFace transformers cases (tests/data/golden-hf, format in its README): the family's
// preset with the knobs its semantics block states.

/// The preset for an HF case of `family` on a batch of T tokens and E experts. Loss
/// coefficients are 1: the cases hold the loss functions' values before any coefficient.
inline routing_config hf_preset_for(const json& cs, std::int64_t tokens, std::int32_t experts) {
  const std::string family = cs.at("family").get<std::string>();
  const json& sem = cs.at("semantics");
  const std::int32_t k = sem.at("k").get<std::int32_t>();
  const auto norm = [&] { return sem.value("norm_topk_prob", false); };
  routing_config c;
  if (family == "mixtral") {
    c = presets::mixtral(experts, k);
  } else if (family == "qwen2_moe") {
    c = presets::qwen2_moe(experts, k, norm());
  } else if (family == "qwen3_moe") {
    c = presets::qwen_moe(experts, k, norm());
  } else if (family == "olmoe") {
    if (norm()) throw std::runtime_error("olmoe with norm_topk_prob: not an OLMoE routing");
    c = presets::olmoe(experts, k);
  } else if (family == "deepseek_v3") {
    c = presets::deepseek_v3(experts, k, sem.at("n_group").get<std::int32_t>(),
                             sem.at("topk_group").get<std::int32_t>());
    if (sem.at("group_score_topn").get<std::int32_t>() != c.gating.group_limit.top_n)
      throw std::runtime_error("deepseek_v3: group_score_topn differs from the preset's");
    if (!norm()) c.gating.renorm = renormalize::none;
    c.gating.scaling_factor = sem.at("routed_scaling_factor").get<float>();
  } else if (family == "switch") {
    const auto rows = sem.at("groups").get<std::int64_t>();
    const auto row_tokens = sem.at("group_size").get<std::int64_t>();
    if (rows * row_tokens != tokens) throw std::runtime_error("switch: groups * group_size != T");
    c = presets::switch_transformers(experts, sem.at("expert_capacity").get<std::int64_t>(),
                                     row_tokens);
  } else if (family == "nllb_moe") {
    if (sem.at("second_expert_policy").get<std::string>() != "all")
      throw std::runtime_error("nllb_moe: only second_expert_policy \"all\" is deterministic");
    presets::nllb_moe_options o;
    o.expert_capacity =
        null_or_missing(sem, "expert_capacity") ? -1 : sem["expert_capacity"].get<std::int64_t>();
    o.batch_prioritized_routing = sem.at("batch_prioritized_routing").get<bool>();
    o.normalize_router_prob_before_dropping =
        sem.at("normalize_router_prob_before_dropping").get<bool>();
    o.training = sem.at("training").get<bool>();
    o.eval_capacity_token_fraction = sem.at("moe_eval_capacity_token_fraction").get<double>();
    c = presets::nllb_moe(experts, o);
  } else {
    throw std::runtime_error("unknown HF family: " + family);
  }
  if (c.top_k != k)
    throw std::runtime_error(family + ": the preset is not top-" + std::to_string(k));
  c.loss.aux_coefficient = 1.0f;
  c.loss.z_coefficient = 1.0f;
  return c;
}

/// The valid mask [T] of an HF case: attention_mask (1 = real) or NLLB's padding_mask
/// (1 = padding); empty when the case has neither.
inline std::vector<std::uint8_t> hf_valid_mask(const json& cs) {
  std::vector<std::uint8_t> v;
  if (cs.contains("attention_mask"))
    for (const auto& x : cs["attention_mask"]) v.push_back(x.get<int>() != 0 ? 1 : 0);
  else if (cs.contains("padding_mask"))
    for (const auto& x : cs["padding_mask"]) v.push_back(x.get<int>() != 0 ? 0 : 1);
  return v;
}

/// One golden case, ready to route: its logits, bias and preset.
struct golden_case {
  std::string file, name;
  std::int64_t tokens = 0;
  std::int32_t experts = 0;
  std::vector<float> logits;  ///< [T, E]
  std::vector<float> bias;    ///< [E] when the case uses an expert bias, else empty
  routing_config cfg;         ///< preset_for(case)
  json semantics, expected;
};

/// Every case of every file in `dir`, routed with its preset.
inline std::vector<golden_case> load_golden_cases(const std::string& dir) {
  std::vector<golden_case> out;
  for (const auto& f : load_golden_files(dir)) {
    const auto logits = golden_logits(f.doc);
    const auto E = f.doc.at("experts").get<std::int32_t>();
    for (const auto& cs : f.doc["cases"]) {
      golden_case g;
      g.file = f.name();
      g.name = cs.at("name").get<std::string>();
      g.tokens = f.doc.at("tokens").get<std::int64_t>();
      g.experts = E;
      g.logits = logits;
      g.bias = golden_bias(cs);
      g.cfg = preset_for(cs, E);
      g.semantics = cs.at("semantics");
      g.expected = cs.at("expected");
      out.push_back(std::move(g));
    }
  }
  return out;
}

}  // namespace moeroute::test
