// SPDX-License-Identifier: Apache-2.0
// HuggingFace parity: every case of every *.json in the golden-hf directory (read at run time:
// $MOEROUTE_GOLDEN_HF_DIR, else tests/data/golden-hf, 284 cases) routed by the CPU reference
// with its family's preset (hf_preset_for) must reproduce what transformers 5.24 produced —
// Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3, Switch Transformers, NLLB-MoE. The rules
// are those of tests/data/golden-hf/README.md (check_hf_case).
#include <catch2/catch.hpp>

#include <cstdint>
#include <iostream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <moeroute/reference.hpp>

#include "../common/golden.hpp"
#include "../common/golden_hf_check.hpp"

using namespace moeroute;
using namespace moeroute::test;

namespace {

hf_routed route_on_reference(const json& cs, std::int64_t T, std::int32_t E,
                             const std::vector<float>& logits) {
  const hf_inputs in = hf_inputs_for(cs, T, E);
  const routing_config& cfg = in.cfg;
  const auto r = reference::route<float>(cfg, logits, T, in.bias, in.routing_mask);
  hf_routed out;
  out.tokens = T;
  out.k = cfg.top_k;
  out.ids = r.gating.ids;
  out.gates = r.gating.gates;
  out.fates = r.dispatch.fates;
  out.weight = r.dispatch.weight;
  out.capacity = r.dispatch.capacity;
  out.aux = r.losses.aux.value;
  out.sequence_aux = r.losses.sequence_aux;
  out.z = r.losses.z.value;
  if (!in.aux_mask.empty())
    out.aux_masked =
        reference::aux_loss(cfg, reference::gating<float>(cfg, logits, T, in.bias, in.aux_mask))
            .value;
  return out;
}

}  // namespace

TEST_CASE("golden-hf: every HuggingFace case routes exactly as transformers does",
          "[golden][golden-hf]") {
  bool is_default = false;
  const std::string dir = golden_hf_directory(&is_default);
  const auto files = load_golden_files(dir);
  if (is_default) REQUIRE(count_cases(files) == golden_hf_case_count);
  std::map<std::string, std::pair<int, int>> by_family;  // passed, run
  std::size_t failures = 0;
  for (const auto& f : files) {
    const auto T = f.doc.at("tokens").get<std::int64_t>();
    const auto E = f.doc.at("experts").get<std::int32_t>();
    const std::vector<float> logits = golden_logits(f.doc);
    for (const auto& cs : f.doc["cases"]) {
      const std::string name = f.name() + " / " + cs.at("name").get<std::string>();
      std::string why;
      try {
        why = check_hf_case(cs, route_on_reference(cs, T, E, logits));
      } catch (const std::exception& e) {
        why = std::string("threw: ") + e.what();
      }
      auto& fam = by_family[cs.at("family").get<std::string>()];
      ++fam.second;
      if (why.empty()) {
        ++fam.first;
      } else if (++failures <= 20) {
        UNSCOPED_INFO(name << ": " << why);
      }
    }
  }
  for (const auto& [family, n] : by_family)
    std::cout << "golden-hf " << family << ": " << n.first << "/" << n.second << "\n";
  CHECK(failures == 0);
}
