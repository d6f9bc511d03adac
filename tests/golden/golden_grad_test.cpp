// SPDX-License-Identifier: Apache-2.0
// Golden gradient parity: every case of every *.json in the golden-grad directory (read at run
// time) runs through the matching preset's forward (gate + dispatch) and backward with the
// peer's upstream d_weight, and must reproduce the gradients PyTorch autograd computed through
// the peer's own routing code: d logits of the routing weights, of the aux loss and (Megatron)
// of the z-loss. Format: tests/data/golden-grad/README.md.
//
// Directory: $MOEROUTE_GOLDEN_GRAD_DIR when set, else MOEROUTE_TEST_DATA_DIR "/golden-grad"
// (40 cases). Tolerance: |ours - peer| <= max(1e-5 * |peer|, 1e-7) for every element.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include "../common/golden.hpp"

using namespace moeroute;
using namespace moeroute::test;

namespace {

constexpr double grad_rel_tol = 1e-5;
constexpr double grad_abs_tol = 1e-7;
constexpr std::size_t default_grad_case_count = 40;

/// Every element within tolerance; returns a description of the first mismatch, or "".
std::string compare(const char* what, const std::vector<float>& ours, const json& peer,
                    std::int64_t T, std::int32_t E) {
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int32_t e = 0; e < E; ++e) {
      const double want = peer[t][e].get<double>();
      const double got = ours[t * E + e];
      const double tol = std::max(grad_rel_tol * std::fabs(want), grad_abs_tol);
      if (!(std::fabs(got - want) <= tol)) {
        std::ostringstream os;
        os.precision(9);
        os << what << "[" << t << "][" << e << "]: ours " << got << ", peer " << want
           << " (tolerance " << tol << ")";
        return os.str();
      }
    }
  }
  return "";
}

}  // namespace

TEST_CASE("golden-grad: d logits of routing, aux and z-loss match the peers' autograd",
          "[golden][golden-grad][backward]") {
  bool is_default = true;
  const std::string dir = golden_directory("MOEROUTE_GOLDEN_GRAD_DIR", "golden-grad", &is_default);
  std::size_t cases_run = 0, ties_adopted = 0;
  std::size_t routing_elements = 0, nonzero_routing = 0;
  for (const auto& file : load_golden_files(dir)) {
    const json& doc = file.doc;
    const std::int64_t T = doc["tokens"].get<std::int64_t>();
    const std::int32_t E = doc["experts"].get<std::int32_t>();
    const std::vector<float> logits = golden_logits(doc);

    for (const auto& c : doc["cases"]) {
      const std::string name = file.name() + " / " + c["name"].get<std::string>();
      INFO(name);
      const std::vector<float> bias = golden_bias(c);
      const routing_config cfg = preset_for(c, E);
      const auto g = reference::gating(cfg, logits, T, bias);
      const auto dsp = reference::dispatch(cfg, g);
      const std::int32_t k = cfg.top_k;
      const json& x = c["expected"];
      const bool deepspeed = peer_of(c) == peer::deepspeed;

      // upstream: one [expert, (slot,) d_weight] per assignment the peer kept; map it to (t, j)
      std::vector<float> d_weight(T * k, 0.0f);
      std::vector<std::uint8_t> peer_kept(T * k, 0);
      const json& up = x["upstream"];
      REQUIRE(static_cast<std::int64_t>(up.size()) == T);
      for (std::int64_t t = 0; t < T; ++t) {
        INFO("token " << t);
        for (const auto& entry : up[t]) {
          const std::int32_t expert = entry[0].get<std::int32_t>();
          std::int32_t found = -1;
          for (std::int32_t j = 0; j < k; ++j)
            if (g.ids[t * k + j] == expert) found = j;
          INFO("upstream expert " << expert);
          REQUIRE(found >= 0);
          if (deepspeed) CHECK(dsp.slot[t * k + found] == entry[1].get<std::int32_t>());
          peer_kept[t * k + found] = 1;
          d_weight[t * k + found] = entry[deepspeed ? 2 : 1].get<float>();
        }
      }
      // Our kept set must be the peer's, except where the peer's torch.topk broke an exact tie
      // of the priority key differently (Megatron top-1 after the softmax: every gate is 1).
      // Such a tie is accepted only if each expert keeps the same number of assignments with
      // the same multiset of gates; the backward then uses the peer's (integer) decisions.
      reference::dispatch_output dsp_used = dsp;
      bool same = true;
      for (std::int64_t a = 0; a < T * k; ++a)
        same = same && (peer_kept[a] != 0) == (dsp.fates[a] == fate::kept);
      if (!same) {
        REQUIRE_FALSE(deepspeed);  // positional priorities have no ties
        for (std::int32_t e = 0; e < E; ++e) {
          std::vector<float> ours_g, peer_g;
          for (std::int64_t a = 0; a < T * k; ++a) {
            if (g.ids[a] != e) continue;
            if (dsp.fates[a] == fate::kept) ours_g.push_back(g.gates[a]);
            if (peer_kept[a]) peer_g.push_back(g.gates[a]);
          }
          std::sort(ours_g.begin(), ours_g.end());
          std::sort(peer_g.begin(), peer_g.end());
          INFO("expert " << e << ": kept sets differ beyond a tie");
          REQUIRE(ours_g == peer_g);
        }
        for (std::int64_t a = 0; a < T * k; ++a) {
          const bool kept = peer_kept[a] != 0;
          dsp_used.fates[a] = kept ? fate::kept : fate::dropped;
          dsp_used.expert[a] = kept ? g.ids[a] : -1;
          dsp_used.weight[a] = kept ? g.gates[a] : 0.0f;
        }
        ++ties_adopted;
      }

      std::vector<float> d_routing(T * E, 0.0f), d_aux(T * E, 0.0f), d_z(T * E, 0.0f);
      reference::routing_backward(cfg, logits, g, dsp_used, d_weight, d_routing);
      reference::aux_loss_backward(cfg, logits, g, d_aux);
      reference::z_loss_backward(cfg, logits, g, d_z);
      CHECK(compare("d_logits_routing", d_routing, x["d_logits_routing"], T, E) == "");
      CHECK(compare("d_logits_aux", d_aux, x["d_logits_aux"], T, E) == "");
      if (x.contains("d_logits_z")) CHECK(compare("d_logits_z", d_z, x["d_logits_z"], T, E) == "");

      // the one-call accumulation equals the sum of the three terms (same order, same bits)
      std::vector<float> d_all(T * E, 0.0f), d_sum(T * E, 0.0f);
      reference::gating_backward(cfg, logits, g, dsp_used, d_weight, d_all);
      reference::routing_backward(cfg, logits, g, dsp_used, d_weight, d_sum);
      reference::aux_loss_backward(cfg, logits, g, d_sum);
      reference::z_loss_backward(cfg, logits, g, d_sum);
      CHECK(d_all == d_sum);

      routing_elements += d_routing.size();
      for (float v : d_routing) nonzero_routing += std::fabs(v) > 1e-6f ? 1 : 0;
      ++cases_run;
    }
  }
  INFO("directory " << dir);
  REQUIRE(cases_run > 0);
  if (is_default) REQUIRE(cases_run == default_grad_case_count);
  // the routing gradients are not all the trivial zeros of Megatron's top-1
  CHECK(nonzero_routing > routing_elements / 4);
  // ties are the exception (Megatron top-1 with capacity), not the rule
  if (is_default) CHECK(ties_adopted <= 4);
}
