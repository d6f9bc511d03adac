// SPDX-License-Identifier: Apache-2.0
// The comparison rules of tests/data/golden-hf/README.md, in one place for every backend: a
// backend routes an HF case with hf_preset_for() and fills an hf_routed; check_hf_case says
// whether it reproduces what transformers produced.
//   ids per token as a set, exactly; weights within 1e-6 relative or 1e-7 absolute; the kept
//   set and the capacity exactly; losses within 1e-5 relative.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <moeroute/capacity.hpp>
#include <moeroute/types.hpp>

#include "golden.hpp"

namespace moeroute::test {

/// What one backend produced for an HF case.
struct hf_routed {
  std::int64_t tokens = 0;
  std::int32_t k = 0;
  std::vector<std::int32_t> ids;     ///< [T, k] chosen experts, best first
  std::vector<float> gates;          ///< [T, k] pre-drop gates
  std::vector<fate> fates;           ///< [T, k]
  std::vector<float> weight;         ///< [T, k] combine weights
  std::int64_t capacity = 0;         ///< C per capacity group (-1 unbounded)
  double aux = 0.0;                  ///< batch aux loss (coefficient 1), all tokens valid
  double sequence_aux = 0.0;         ///< per-sequence (Switch: per-row) aux loss
  double z = 0.0;                    ///< z-loss (coefficient 1)
  std::optional<double> aux_masked;  ///< batch aux loss with the case's mask as the valid mask
};

namespace hf_detail {

inline bool weight_close(double got, double want) {
  const double diff = std::fabs(got - want);
  return diff <= 1e-7 || diff <= 1e-6 * std::max(std::fabs(got), std::fabs(want));
}

inline bool loss_close(double got, double want) {
  if (got == want) return true;
  return std::fabs(got - want) <= 1e-5 * std::max(std::fabs(got), std::fabs(want));
}

inline std::string num(double v) {
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}

/// The (expert, weight) pairs a token kept, sorted by expert.
inline std::vector<std::pair<std::int32_t, double>> kept_of(const hf_routed& r, std::int64_t t) {
  std::vector<std::pair<std::int32_t, double>> out;
  for (std::int32_t j = 0; j < r.k; ++j)
    if (r.fates[t * r.k + j] == fate::kept)
      out.emplace_back(r.ids[t * r.k + j], r.weight[t * r.k + j]);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace hf_detail

/// What a backend routes an HF case with: the family's preset, the expert bias, the case's
/// mask, and the mask the routing itself takes (NLLB's padding takes no slot; the attention
/// mask of the dropless families only enters their masked aux loss, `aux_mask`).
struct hf_inputs {
  routing_config cfg;
  std::vector<float> bias;                 ///< [E] DeepSeek-V3's expert_bias, else empty
  std::vector<std::uint8_t> routing_mask;  ///< [T] the valid mask of the routing, or empty
  std::vector<std::uint8_t> aux_mask;      ///< [T] the valid mask of aux_loss_masked, or empty
};

inline hf_inputs hf_inputs_for(const json& cs, std::int64_t tokens, std::int32_t experts) {
  hf_inputs in;
  in.cfg = hf_preset_for(cs, tokens, experts);
  if (cs.contains("expert_bias")) in.bias = cs["expert_bias"].get<std::vector<float>>();
  std::vector<std::uint8_t> mask = hf_valid_mask(cs);
  if (cs.at("family").get<std::string>() == "nllb_moe")
    in.routing_mask = std::move(mask);
  else
    in.aux_mask = std::move(mask);
  return in;
}

/// "" when `r` reproduces the case's expected values, else the first difference.
inline std::string check_hf_case(const json& cs, const hf_routed& r) {
  using namespace hf_detail;
  const json& ex = cs.at("expected");
  const std::string family = cs.at("family").get<std::string>();
  const std::int64_t T = r.tokens;
  const std::int32_t k = r.k;
  const json& ids = ex.at("ids");
  if (static_cast<std::int64_t>(ids.size()) != T) return "expected ids has the wrong length";

  for (std::int64_t t = 0; t < T; ++t) {
    if (ids[t].is_null()) continue;  // a padding token: routed nowhere (its kept set is empty)
    std::vector<std::int32_t> want = ids[t].get<std::vector<std::int32_t>>();
    std::vector<std::int32_t> got(r.ids.begin() + t * k, r.ids.begin() + (t + 1) * k);
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    if (want != got) return "token " + std::to_string(t) + ": ids differ";
  }
  if (ex.contains("weights")) {
    // weights[t][j] belongs to ids[t][j]: compare by expert
    for (std::int64_t t = 0; t < T; ++t)
      for (std::size_t j = 0; !ids[t].is_null() && j < ids[t].size(); ++j) {
        const auto e = ids[t][j].get<std::int32_t>();
        const double want = ex["weights"][t][j].get<double>();
        for (std::int32_t i = 0; i < k; ++i)
          if (r.ids[t * k + i] == e && !weight_close(r.gates[t * k + i], want))
            return "token " + std::to_string(t) + " expert " + std::to_string(e) + ": weight " +
                   num(r.gates[t * k + i]) + " != " + num(want);
      }
  }
  if (ex.contains("kept")) {
    for (std::int64_t t = 0; t < T; ++t) {
      std::vector<std::pair<std::int32_t, double>> want;
      for (const auto& kw : ex["kept"][t])
        want.emplace_back(kw.at(0).get<std::int32_t>(), kw.at(1).get<double>());
      std::sort(want.begin(), want.end());
      const auto got = kept_of(r, t);
      if (got.size() != want.size())
        return "token " + std::to_string(t) + ": kept " + std::to_string(got.size()) +
               " assignments, expected " + std::to_string(want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i].first != want[i].first)
          return "token " + std::to_string(t) + ": kept expert " + std::to_string(got[i].first) +
                 " != " + std::to_string(want[i].first);
        if (!weight_close(got[i].second, want[i].second))
          return "token " + std::to_string(t) + ": kept weight " + num(got[i].second) +
                 " != " + num(want[i].second);
      }
    }
  }
  if (ex.contains("top1_kept")) {
    for (std::int64_t t = 0; t < T; ++t) {
      const auto want = ex["top1_kept"][t].get<std::int32_t>();
      const std::int32_t got = r.fates[t * k] == fate::kept ? r.ids[t * k] : -1;
      if (got != want)
        return "token " + std::to_string(t) + ": top1_kept " + std::to_string(got) +
               " != " + std::to_string(want);
    }
  }
  if (ex.contains("capacity") && !ex["capacity"].is_null()) {
    if (r.capacity != ex["capacity"].get<std::int64_t>())
      return "capacity " + std::to_string(r.capacity) +
             " != " + std::to_string(ex["capacity"].get<std::int64_t>());
  }
  if (ex.contains("aux_loss")) {
    // Switch averages per batch row: that is moeroute's per-sequence aux loss
    const double got = family == "switch" ? r.sequence_aux : r.aux;
    if (!loss_close(got, ex["aux_loss"].get<double>()))
      return "aux_loss " + num(got) + " != " + num(ex["aux_loss"].get<double>());
  }
  if (ex.contains("aux_loss_masked")) {
    if (!r.aux_masked) return "aux_loss_masked expected but not computed";
    if (!loss_close(*r.aux_masked, ex["aux_loss_masked"].get<double>()))
      return "aux_loss_masked " + num(*r.aux_masked) +
             " != " + num(ex["aux_loss_masked"].get<double>());
  }
  if (ex.contains("z_loss") && !loss_close(r.z, ex["z_loss"].get<double>()))
    return "z_loss " + num(r.z) + " != " + num(ex["z_loss"].get<double>());
  return "";
}

/// The HF golden directory: $MOEROUTE_GOLDEN_HF_DIR when set, else tests/data/golden-hf.
inline std::string golden_hf_directory(bool* is_default = nullptr) {
  return golden_directory("MOEROUTE_GOLDEN_HF_DIR", "golden-hf", is_default);
}

/// Cases in the default directory (the public set of 284; pinned so none goes missing).
inline constexpr std::size_t golden_hf_case_count = 284;

/// Every case of the HF golden directory through `route(case, T, E, logits)` (a backend's
/// hf_result), each compared by check_hf_case; the first 20 failures are reported. The CPU
/// backend's and the GPU path's tests share it, so they read the same cases the same way.
template <class Route>
void check_every_hf_case(Route&& route) {
  bool is_default = false;
  const auto files = load_golden_files(golden_hf_directory(&is_default));
  if (is_default) REQUIRE(count_cases(files) == golden_hf_case_count);
  std::size_t failures = 0, run = 0;
  for (const auto& f : files) {
    const auto T = f.doc.at("tokens").template get<std::int64_t>();
    const auto E = f.doc.at("experts").template get<std::int32_t>();
    const std::vector<float> logits = golden_logits(f.doc);
    for (const auto& cs : f.doc["cases"]) {
      ++run;
      const std::string why = check_hf_case(cs, route(cs, T, E, logits));
      if (!why.empty() && ++failures <= 20)
        UNSCOPED_INFO(f.name() << " / " << cs.at("name").template get<std::string>() << ": "
                               << why);
    }
  }
  CHECK(run > 0);
  CHECK(failures == 0);
}

}  // namespace moeroute::test
