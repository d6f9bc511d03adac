// SPDX-License-Identifier: Apache-2.0
// Golden peer parity: every case in every *.json of the golden directory (read at run time, so
// new cases need no code change) runs through the matching named preset and must reproduce the
// peer's routing exactly. The case format and the semantics vocabulary are defined in
// tests/data/golden/README.md.
//
// Directory: $MOEROUTE_GOLDEN_DIR when set, else MOEROUTE_TEST_DATA_DIR "/golden" (416 cases).
// Tolerances: integers exact; gates / weights 1e-6 relative; aux loss and z-loss 1e-5 relative.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include "../common/golden.hpp"

using namespace moeroute;
using namespace moeroute::test;
namespace fs = std::filesystem;

namespace {

constexpr double gate_rel_tol = 1e-6;
constexpr double loss_rel_tol = 1e-5;
constexpr std::size_t default_case_count = 416;

// ---------------------------------------------------------------------------------------------
// Comparison

bool rel_close(double got, double want, double tol) {
  if (got == want) return true;
  if (!std::isfinite(got) || !std::isfinite(want)) return false;
  return std::fabs(got - want) <= tol * std::max(std::fabs(got), std::fabs(want));
}

std::string num(double v) {
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}

/// torch.topk(routing_probs, k=C, dim=0) as PyTorch's CPU kernel computes it (std::nth_element,
/// or std::partial_sort when 64 C <= T, over (value, row) pairs with a "greater" comparator),
/// applied to each expert's column of pre-drop gates (0 where the token did not choose it),
/// then ANDed with the routing map. Only what it does with exact ties matters here; the result
/// is the kept mask [T, k]. C >= T keeps everything (Megatron drops nothing then).
std::vector<std::uint8_t> torch_topk_kept(const reference::gating_output& g, std::int64_t C) {
  const std::int64_t T = g.tokens;
  const std::int32_t k = g.k, E = g.experts;
  std::vector<std::uint8_t> kept(static_cast<std::size_t>(T * k), 0);
  for (std::int32_t e = 0; e < E; ++e) {
    std::vector<std::pair<double, std::int64_t>> q(static_cast<std::size_t>(T));
    std::vector<std::int64_t> assignment(static_cast<std::size_t>(T), -1);
    for (std::int64_t t = 0; t < T; ++t) {
      q[t] = {0.0, t};
      for (std::int32_t j = 0; j < k; ++j)
        if (g.ids[t * k + j] == e) {
          q[t].first = g.gates[t * k + j];
          assignment[t] = t * k + j;
        }
    }
    if (C >= T) {
      for (std::int64_t t = 0; t < T; ++t)
        if (assignment[t] >= 0) kept[assignment[t]] = 1;
      continue;
    }
    if (C == 0) continue;
    const auto greater = [](const auto& x, const auto& y) { return x.first > y.first; };
    if (C * 64 <= T)
      std::partial_sort(q.begin(), q.begin() + C, q.end(), greater);
    else
      std::nth_element(q.begin(), q.begin() + (C - 1), q.end(), greater);
    for (std::int64_t i = 0; i < C; ++i)
      if (assignment[q[i].second] >= 0) kept[assignment[q[i].second]] = 1;
  }
  return kept;
}

/// Assignments decided by an exact gate tie, and the cases they occur in (printed at the end).
std::size_t tie_decided = 0;
std::map<std::string, std::size_t> tie_cases;

/// Runs one case; returns "" on a match, else a description of the first mismatch.
std::string check_case(const json& file_doc, const json& cs) {
  const std::int64_t T = file_doc.at("tokens").get<std::int64_t>();
  const std::int32_t E = file_doc.at("experts").get<std::int32_t>();
  const json& sem = cs.at("semantics");
  const json& ex = cs.at("expected");

  const routing_config cfg = preset_for(cs, E);
  const routing_config from_sem = config_from_semantics(sem, E);
  if (auto diff = config_diff(cfg, from_sem); !diff.empty()) return "preset drift: " + diff;

  const std::vector<float> logits = golden_logits(file_doc);
  const std::vector<float> bias = golden_bias(cs);
  const auto r = reference::route<float>(cfg, logits, T, bias);
  const auto& g = r.gating;
  const auto& d = r.dispatch;
  const auto& aux = r.losses.aux;
  const auto& z = r.losses.z;
  const std::int32_t k = cfg.top_k;

  // capacity (dropless: the peer's "capacity" is null or absent)
  if (ex.contains("capacity") && !ex["capacity"].is_null()) {
    if (d.capacity != ex["capacity"].get<std::int64_t>())
      return "capacity " + std::to_string(d.capacity) +
             " != " + std::to_string(ex["capacity"].get<std::int64_t>());
  } else if (d.capacity != unbounded_capacity) {
    return "capacity " + std::to_string(d.capacity) + ", expected none (dropless)";
  }
  if (ex.contains("aux_loss") && !rel_close(aux.value, ex["aux_loss"].get<double>(), loss_rel_tol))
    return "aux_loss " + num(aux.value) + " != " + num(ex["aux_loss"].get<double>());
  if (ex.contains("z_loss") && !rel_close(z.value, ex["z_loss"].get<double>(), loss_rel_tol))
    return "z_loss " + num(z.value) + " != " + num(ex["z_loss"].get<double>());
  if (ex.contains("requested_per_expert")) {
    // Megatron's tokens_per_expert comes from compute_routing_scores_for_aux_loss: a fresh top-k
    // on the unbiased, ungrouped scores, i.e. our aux counts. The others count the routed ids.
    const std::vector<std::int64_t>& ours =
        peer_of(cs) == peer::megatron ? aux.counts : d.requested;
    const auto want = ex["requested_per_expert"].get<std::vector<std::int64_t>>();
    if (want.size() != static_cast<std::size_t>(E)) return "requested_per_expert has wrong length";
    for (std::int32_t e = 0; e < E; ++e)
      if (ours[e] != want[e])
        return "requested_per_expert[" + std::to_string(e) + "] " + std::to_string(ours[e]) +
               " != " + std::to_string(want[e]);
  }

  // Which assignments the peer's answer keeps, as we predict it. For positional priorities this
  // is our dispatch. For score_per_expert the peer runs torch.topk over each expert's column of
  // pre-drop gates, and exact ties at the cut-off (Megatron top-1 without pre-softmax: every
  // gate is exactly 1.0) are then decided by torch's selection order, not by token index. We
  // (a) require our kept set to be tie-equivalent to that prediction and (b) compare the peer's
  // kept sets exactly with the prediction. (a)+(b): ours differs only on exact ties.
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(T * k), 0);
  for (std::int64_t a = 0; a < T * k; ++a) keep[a] = d.fates[a] == fate::kept;
  if (cfg.dispatch.prio == priority::score_per_expert && d.capacity >= 0) {
    const auto model = torch_topk_kept(g, d.capacity);
    for (std::int32_t e = 0; e < E; ++e) {
      float cut = std::numeric_limits<float>::infinity();
      std::int64_t n_ours = 0, n_model = 0;
      for (std::int64_t a = 0; a < T * k; ++a) {
        if (g.ids[a] != e) continue;
        if (keep[a]) {
          ++n_ours;
          cut = std::min(cut, g.gates[a]);
        }
        if (model[a]) ++n_model;
      }
      if (n_ours != n_model)
        return "expert " + std::to_string(e) + ": kept count differs from top-C";
      for (std::int64_t a = 0; a < T * k; ++a)
        if (g.ids[a] == e && keep[a] != model[a]) {
          if (g.gates[a] != cut)
            return "token " + std::to_string(a / k) + ": kept differs from top-C without a tie";
          ++tie_decided;
          ++tie_cases[cs.at("name").get<std::string>()];
        }
    }
    keep = model;
  }

  if (ex.contains("kept")) {
    const json& kept = ex["kept"];
    if (static_cast<std::int64_t>(kept.size()) != T) return "kept has wrong length";
    for (std::int64_t t = 0; t < T; ++t) {
      // ours: the surviving assignments of token t, sorted by expert
      std::vector<std::tuple<std::int32_t, std::int32_t, float>> got;
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int64_t a = t * k + j;
        if (d.fates[a] == fate::rerouted)
          return "token " + std::to_string(t) + ": unexpected reroute";
        if (!keep[a]) continue;
        // a tie-decided assignment we dropped: its weight is its pre-drop gate (no after-drop
        // renormalisation with this priority) and it has no slot (the peer gives none)
        const bool ours = d.fates[a] == fate::kept;
        got.emplace_back(g.ids[a], ours ? d.slot[a] : -1, ours ? d.weight[a] : g.gates[a]);
      }
      std::sort(got.begin(), got.end());
      const json& want = kept[t];
      std::ostringstream mine;
      for (const auto& [e, s, w] : got) mine << "[" << e << "," << s << "," << num(w) << "]";
      const std::string where =
          "token " + std::to_string(t) + " (ours " + mine.str() + ", peer " + want.dump() + "): ";
      if (want.size() != got.size()) return where + "kept set size differs";
      for (std::size_t i = 0; i < got.size(); ++i) {
        const json& w = want[i];
        const auto [e, s, wt] = got[i];
        if (w.at(0).get<std::int32_t>() != e) return where + "kept expert differs";
        double want_w = 0.0;
        if (w.size() == 3) {
          if (w.at(1).get<std::int32_t>() != s)
            return where + "slot differs";  // s = -1: untied only
          want_w = w.at(2).get<double>();
        } else {
          want_w = w.at(1).get<double>();
        }
        if (!rel_close(wt, want_w, gate_rel_tol)) return where + "weight differs";
      }
    }
  }

  if (ex.contains("topk_idx")) {  // the seed's moe_route outputs
    const json& idx = ex["topk_idx"];
    const json& gate = ex.at("topk_gate");
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int64_t a = t * k + j;
        if (g.ids[a] != idx.at(t).at(j).get<std::int32_t>())
          return "token " + std::to_string(t) + " choice " + std::to_string(j) + ": topk_idx " +
                 std::to_string(g.ids[a]) + " != " + idx[t][j].dump();
        if (!rel_close(g.gates[a], gate.at(t).at(j).get<double>(), gate_rel_tol))
          return "token " + std::to_string(t) + " choice " + std::to_string(j) + ": topk_gate " +
                 num(g.gates[a]) + " != " + gate[t][j].dump();
      }
    const auto kpe = ex.at("kept_per_expert").get<std::vector<std::int64_t>>();
    for (std::int32_t e = 0; e < E; ++e)
      if (d.kept[e] != kpe.at(e))
        return "kept_per_expert[" + std::to_string(e) + "] " + std::to_string(d.kept[e]) +
               " != " + std::to_string(kpe[e]);
    const auto disp = ex.at("token_dispatched").get<std::vector<bool>>();
    for (std::int64_t t = 0; t < T; ++t) {
      bool any = false;
      for (std::int32_t j = 0; j < k; ++j) any = any || d.fates[t * k + j] == fate::kept;
      if (any != disp.at(t))
        return "token " + std::to_string(t) + ": token_dispatched " + (any ? "true" : "false");
    }
  }
  if (!ex.contains("kept") && !ex.contains("topk_idx")) return "case has neither kept nor topk_idx";
  return "";
}

/// Runs every case; returns {cases checked, failures}, reporting each failure through Catch.
std::pair<std::size_t, std::size_t> run_all(const std::vector<golden_file>& files) {
  std::size_t checked = 0, failed = 0;
  for (const auto& f : files) {
    for (const auto& cs : f.doc["cases"]) {
      std::string msg;
      try {
        msg = check_case(f.doc, cs);
      } catch (const std::exception& e) {
        msg = std::string("exception: ") + e.what();
      }
      ++checked;
      if (!msg.empty()) {
        ++failed;
        FAIL_CHECK(f.name() << " / " << cs.value("name", "?") << ": " << msg);
      }
    }
  }
  return {checked, failed};
}

}  // namespace

TEST_CASE("golden peer parity", "[golden]") {
  bool is_default = false;
  const std::string dir = golden_directory("MOEROUTE_GOLDEN_DIR", "golden", &is_default);
  INFO("golden directory: " << dir);
  const auto files = load_golden_files(dir);
  const std::size_t on_disk = count_cases(files);
  std::cout << "golden: " << files.size() << " files, " << on_disk << " cases in " << dir << "\n";
  REQUIRE(on_disk > 0);  // an empty directory is a failure, never a pass
  if (is_default) REQUIRE(on_disk == default_case_count);
  const auto [checked, failed] = run_all(files);
  std::cout << "golden: " << checked - failed << " / " << checked << " cases match (" << tie_decided
            << " assignments decided by exact gate ties, see docs/numerics.md)\n";
  for (const auto& [name, n] : tie_cases)
    std::cout << "golden:   ties in " << name << ": " << n << "\n";
  REQUIRE(checked == on_disk);
  REQUIRE(failed == 0);
}

TEST_CASE("golden: a directory without cases fails to load as a test", "[golden]") {
  const fs::path empty = fs::temp_directory_path() / "moeroute_golden_empty_dir_test";
  fs::create_directories(empty);
  for (const auto& ent : fs::directory_iterator(empty)) fs::remove_all(ent.path());
  const auto files = load_golden_files(empty.string());
  CHECK(files.empty());
  CHECK(count_cases(files) == 0);  // the parity test REQUIREs > 0 on this
  CHECK_THROWS(load_golden_files((empty / "does-not-exist").string()));
  fs::remove_all(empty);
}

TEST_CASE("golden: the checker detects drift and wrong expectations", "[golden]") {
  const auto files = load_golden_files(golden_directory("MOEROUTE_GOLDEN_DIR", "golden"));
  REQUIRE(!files.empty());
  const json& doc = files.front().doc;
  REQUIRE(!doc["cases"].empty());
  for (const auto& cs0 : doc["cases"]) {
    const json& sem = cs0.at("semantics");
    const std::int32_t E = doc.at("experts").get<std::int32_t>();
    // a preset that drifts from the semantics block is reported with the field name
    routing_config p = preset_for(cs0, E);
    CHECK(config_diff(p, config_from_semantics(sem, E)).empty());
    p.dispatch.prio =
        p.dispatch.prio == priority::token_major ? priority::choice_major : priority::token_major;
    CHECK_THAT(config_diff(p, config_from_semantics(sem, E)), Catch::Contains("dispatch.prio"));
    p = preset_for(cs0, E);
    p.loss.scale =
        p.loss.scale == aux_scale::e_times_sum ? aux_scale::e_over_k_sum : aux_scale::e_times_sum;
    CHECK_THAT(config_diff(p, config_from_semantics(sem, E)), Catch::Contains("loss.scale"));

    // a perturbed expectation is a mismatch
    json cs = cs0;
    cs["expected"]["aux_loss"] = cs0["expected"]["aux_loss"].get<double>() * (1.0 + 1e-4);
    CHECK_THAT(check_case(doc, cs), Catch::Contains("aux_loss"));
    cs = cs0;
    if (cs["expected"].contains("capacity") && !cs["expected"]["capacity"].is_null()) {
      cs["expected"]["capacity"] = cs0["expected"]["capacity"].get<std::int64_t>() + 1;
      CHECK_THAT(check_case(doc, cs), Catch::Contains("capacity"));
    }
    cs = cs0;
    if (cs["expected"].contains("kept")) {
      json& tok = cs["expected"]["kept"];
      for (auto& row : tok)
        if (!row.empty()) {
          auto& w = row[0][row[0].size() - 1];
          w = w.get<double>() * (1.0 + 1e-5);
          break;
        }
      CHECK_THAT(check_case(doc, cs), Catch::Contains("weight differs"));
    }
    if (cs["expected"].contains("topk_idx")) {
      cs["expected"]["topk_idx"][0][0] = (cs0["expected"]["topk_idx"][0][0].get<int>() + 1) % E;
      CHECK_THAT(check_case(doc, cs), Catch::Contains("topk_idx"));
    }
  }
}
