// SPDX-License-Identifier: Apache-2.0
// Test helper (pure C++, no CUDA): maps a golden case's semantics to a routing_config and
// checks a dispatch result against the peer's expected values. Used by the GPU dispatch test
// (GPU output) and checkable on the CPU with the reference's own output.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <moeroute/presets.hpp>
#include <moeroute/reference/dispatch.hpp>

namespace moeroute::test {

/// What a golden check needs from a dispatch, from the GPU or from the reference.
struct dispatch_view {
  std::int64_t tokens = 0;
  std::int32_t k = 0, experts = 0;
  std::int64_t capacity = 0;
  std::vector<std::int32_t> expert, slot;
  std::vector<float> weight;
  std::vector<std::uint8_t> fate;
  std::vector<std::int64_t> requested, kept;
};

inline dispatch_view view_of(const reference::dispatch_output& d) {
  dispatch_view v;
  v.tokens = d.tokens;
  v.k = d.k;
  v.experts = d.experts;
  v.capacity = d.capacity;
  v.expert = d.expert;
  v.slot = d.slot;
  v.weight = d.weight;
  for (auto f : d.fates) v.fate.push_back(static_cast<std::uint8_t>(f));
  v.requested = d.requested;
  v.kept = d.kept;
  return v;
}

/// One golden case ready to route.
struct golden_case {
  std::string file, name;
  std::int64_t tokens = 0;
  std::int32_t experts = 0;
  std::vector<float> logits;  // [T, E]
  std::vector<float> bias;    // [E] when the case uses an expert bias
  routing_config cfg;
  nlohmann::json expected;
};

/// The config that reproduces a case (by the peer named in the case name); nullopt if the
/// case is not one this helper knows.
inline std::optional<routing_config> golden_config(const std::string& name, const nlohmann::json& sem,
                                                   std::int32_t E) {
  const std::int32_t k = sem.at("k").get<std::int32_t>();
  const auto& cap = sem.at("capacity");
  const auto min_cap = [&](std::int64_t dflt) {
    return cap.is_object() && cap.contains("min_capacity") && !cap["min_capacity"].is_null()
               ? cap["min_capacity"].get<std::int64_t>()
               : dflt;
  };
  const double factor = cap.is_object() ? cap.at("factor").get<double>() : 1.0;
  if (name.rfind("megatron", 0) == 0) {
    presets::megatron_options o;
    o.score = sem.at("score") == "sigmoid" ? score_function::sigmoid : score_function::softmax;
    o.pre_softmax = sem.at("select_from") == "probs";
    if (cap.is_object()) o.capacity_factor = factor;
    if (sem.contains("group_limited") && sem["group_limited"].is_object()) {
      o.groups = sem["group_limited"].at("groups").get<std::int32_t>();
      o.group_topk = sem["group_limited"].at("group_topk").get<std::int32_t>();
    }
    if (sem.contains("scaling_factor") && !sem["scaling_factor"].is_null())
      o.scaling_factor = sem["scaling_factor"].get<float>();
    o.expert_bias = sem.contains("expert_bias") && sem["expert_bias"].is_array();
    return presets::megatron(E, k, o);
  }
  if (name.rfind("deepspeed_top2", 0) == 0) return presets::deepspeed_top2(E, factor, min_cap(0));
  if (name.rfind("deepspeed_topk", 0) == 0) return presets::deepspeed_topk(E, k, factor, min_cap(0));
  if (name.rfind("seed_", 0) == 0) return presets::seed_reference(E, k, factor);
  return std::nullopt;
}

/// Every case of every golden file in `dir` whose config this helper can build and validate.
inline std::vector<golden_case> load_golden_cases(const std::string& dir, std::int64_t* skipped = nullptr) {
  std::vector<golden_case> out;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    std::ifstream in(path);
    const auto j = nlohmann::json::parse(in);
    const auto T = j.at("tokens").get<std::int64_t>();
    const auto E = j.at("experts").get<std::int32_t>();
    std::vector<float> logits;
    for (const auto& row : j.at("logits"))
      for (const auto& v : row) logits.push_back(v.get<float>());
    for (const auto& c : j.at("cases")) {
      const std::string name = c.at("name");
      auto cfg = golden_config(name, c.at("semantics"), E);
      if (!cfg || !validate(*cfg).ok()) {
        if (skipped) ++*skipped;
        continue;
      }
      golden_case g;
      g.file = path.filename().string();
      g.name = name;
      g.tokens = T;
      g.experts = E;
      g.logits = logits;
      if (cfg->gating.expert_bias)
        for (const auto& b : c["semantics"]["expert_bias"]) g.bias.push_back(b.get<float>());
      g.cfg = *cfg;
      g.expected = c.at("expected");
      out.push_back(std::move(g));
    }
  }
  return out;
}

/// Compares a dispatch with the peer's expected values; returns "" or the first mismatch.
/// Weights within 1e-5 (relative, 1e-6 absolute floor): the peers ran float32 PyTorch.
inline std::string check_golden(const golden_case& g, const dispatch_view& d) {
  std::ostringstream err;
  const auto& ex = g.expected;
  const auto close = [](double a, double b) { return std::fabs(a - b) <= 1e-6 + 1e-5 * std::fabs(b); };
  if (ex.contains("capacity") && !ex["capacity"].is_null() && ex["capacity"].get<std::int64_t>() != d.capacity) {
    err << "capacity " << d.capacity << " != expected " << ex["capacity"];
    return err.str();
  }
  if (ex.contains("requested_per_expert")) {
    const auto want = ex["requested_per_expert"].get<std::vector<std::int64_t>>();
    if (want != d.requested) return "requested_per_expert differs";
  }
  if (ex.contains("kept_per_expert")) {
    const auto want = ex["kept_per_expert"].get<std::vector<std::int64_t>>();
    if (want != d.kept) return "kept_per_expert differs";
  }
  if (ex.contains("token_dispatched")) {
    const auto want = ex["token_dispatched"].get<std::vector<bool>>();
    for (std::int64_t t = 0; t < d.tokens; ++t) {
      bool any = false;
      for (std::int32_t j = 0; j < d.k; ++j) any = any || d.expert[t * d.k + j] >= 0;
      if (any != want[t]) {
        err << "token_dispatched[" << t << "] = " << any;
        return err.str();
      }
    }
  }
  if (ex.contains("kept")) {
    const auto& kept = ex["kept"];
    for (std::int64_t t = 0; t < d.tokens; ++t) {
      struct item { std::int32_t e, s; float w; };
      std::vector<item> got;
      for (std::int32_t j = 0; j < d.k; ++j) {
        const std::int64_t a = t * d.k + j;
        if (d.expert[a] >= 0) got.push_back({d.expert[a], d.slot[a], d.weight[a]});
      }
      std::sort(got.begin(), got.end(), [](const item& x, const item& y) { return x.e < y.e; });
      const auto& want = kept.at(t);
      if (want.size() != got.size()) {
        err << "token " << t << ": " << got.size() << " survivors, expected " << want.size();
        return err.str();
      }
      for (std::size_t i = 0; i < got.size(); ++i) {
        const auto& w = want[i];
        const bool with_slot = w.size() == 3;
        const auto we = w[0].get<std::int32_t>();
        const double ww = w[with_slot ? 2 : 1].get<double>();
        if (we != got[i].e || (with_slot && w[1].get<std::int32_t>() != got[i].s) || !close(got[i].w, ww)) {
          err << "token " << t << " survivor " << i << ": got (" << got[i].e << ", " << got[i].s << ", "
              << got[i].w << "), expected " << w.dump();
          return err.str();
        }
      }
    }
  }
  return "";
}

}  // namespace moeroute::test
