// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity, step 3 of 4 (load): the router logits to plan on — a .npy file read
// whole ([T, E] or [layers, T, E]), a long dump memory-mapped for --batch-tokens, or the
// synthetic scenarios — and, now that E is known, the routing config of the preset and --set.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <moeroute/config_fields.hpp>
#include <moeroute/planner/npy.hpp>
#include <moeroute/planner/npy_map.hpp>
#include <moeroute/planner/scenarios.hpp>
#include <moeroute/planner/sweep.hpp>
#include <moeroute/presets.hpp>

#include "cli.hpp"
#include "setup.hpp"

namespace moeroute::planner::tool {

/// The loaded inputs. `inputs` views `arr` or `storage`: keep this object where it is.
struct tool_inputs {
  std::vector<sweep_input> inputs;
  std::vector<std::vector<float>> storage;  ///< synthetic batches
  std::map<std::string, std::string> descriptions;
  io::npy_array arr;   ///< --npy read whole (sweep and --ep)
  mapped_logits dump;  ///< --batch-tokens: the dump to plan on, mapped, not read
};

/// "dir/traffic.npy" -> "traffic".
inline std::string file_stem(const std::string& path) {
  const auto slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const auto dot = base.rfind('.');
  return dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
}

/// @brief The config every row starts from: the preset for E experts and --top-k (else the
///        preset's k), then --set. @throws usage_error naming the flag.
inline routing_config base_config(const tool_options& o, const presets::preset_info& preset,
                                  std::int32_t E) {
  const std::int32_t k = o.top_k > 0 ? o.top_k : std::min(preset.default_k, E);
  routing_config c;
  try {
    c = presets::by_name(preset.name, E, k);
  } catch (const error& e) {
    throw usage_error(e.get_status().message);
  }
  if (auto st = set_fields(c, o.set_fields_text); !st) throw usage_error("--set: " + st.message);
  if (c.num_experts != E || c.top_k != k)
    throw usage_error("--set: num_experts and top_k come from --experts / --top-k (and the input)");
  if (auto st = validate(c); !st)
    throw usage_error("--preset " + o.preset_name + (o.set_fields_text.empty() ? "" : " --set") +
                      " with E=" + std::to_string(E) + " k=" + std::to_string(k) + ": " +
                      st.message);
  return c;
}

/// @brief Loads the inputs into `in_out` and sets `s.so.base` (the preset for the input's E,
///        k, with --set). @throws usage_error naming the flag or the file.
inline void load_inputs(const tool_options& o, tool_setup& s, tool_inputs& in_out) {
  const presets::preset_info* preset = s.preset;
  sweep_options& so = s.so;
  std::vector<sweep_input>& inputs = in_out.inputs;
  std::vector<std::vector<float>>& storage = in_out.storage;
  std::map<std::string, std::string>& descriptions = in_out.descriptions;
  io::npy_array& arr = in_out.arr;
  mapped_logits& dump = in_out.dump;
  if (o.experts_given && (o.experts < 1 || o.experts > max_experts))
    throw usage_error("--experts must be in [1, 8192]");
  if (o.top_k_given && (o.top_k < 1 || o.top_k > max_top_k))
    throw usage_error("--top-k must be >= 1");
  std::int32_t E = o.experts > 0 ? o.experts : preset->default_experts;
  if (o.planning) {
    // planning: the dump stays memory-mapped; here its shape gives E
    if (o.npy.empty()) throw usage_error("--batch-tokens plans a dump: give it with --npy");
    if (o.layer >= 0) throw usage_error("--layer: planning covers every layer of the dump");
    if (auto st = mapped_logits::open(o.npy, dump); !st) throw usage_error(st.message);
    if (dump.experts() < 1 || dump.experts() > max_experts)
      throw usage_error(o.npy + ": the last dimension (experts) is " +
                        std::to_string(dump.experts()) + ", must be in [1, 8192]");
    E = static_cast<std::int32_t>(dump.experts());
  } else if (!o.npy.empty()) {
    if (auto st = io::read_npy(o.npy, arr); !st) throw usage_error(st.message);
    if (arr.experts() < 1 || arr.experts() > max_experts)
      throw usage_error(o.npy + ": the last dimension (experts) is " +
                        std::to_string(arr.experts()) + ", must be in [1, 8192]");
    E = static_cast<std::int32_t>(arr.experts());
    const std::int64_t L = arr.layers(), T = arr.tokens();
    if (o.layer >= L)
      throw usage_error("--layer " + std::to_string(o.layer) + ": the file has " +
                        std::to_string(L) + " layer(s)");
    const std::string stem = file_stem(o.npy);
    for (std::int64_t l = 0; l < L; ++l) {
      if (o.layer >= 0 && l != o.layer) continue;
      sweep_input in;
      in.name = arr.shape.size() == 3 ? fmt::format("{}[{}]", stem, l) : stem;
      in.description = fmt::format(
          "{} {} {}", o.npy, io::to_string(arr.dtype),
          arr.shape.size() == 3 ? fmt::format("layer {} of {}", l, L) : std::string("[T,E]"));
      in.tokens = T;
      in.logits =
          std::span<const float>(arr.values)
              .subspan(static_cast<std::size_t>(l * T * E), static_cast<std::size_t>(T * E));
      descriptions[in.name] = in.description;
      inputs.push_back(in);
    }
  } else {
    if (o.layer >= 0) throw usage_error("--layer needs --npy");
    if (o.tokens < 0 || o.tokens > (std::int64_t{1} << 22))
      throw usage_error("--tokens must be in [0, 4194304]");
    if (E < 1 || E > max_experts) throw usage_error("--experts must be in [1, 8192]");
    if (o.tokens * E > (std::int64_t{1} << 28))
      throw usage_error("--tokens x --experts exceeds 2^28 logits");
    auto names = split_list(o.scenario_list);
    if (names.size() == 1 && names[0] == "all")
      names = {"uniform", "zipf", "collapsed", "homogeneous", "mixed"};
    if (names.empty()) throw usage_error("--scenario: the list is empty");
    for (const auto& n : names) {
      scenario_kind kind;
      if (!parse_scenario(n, kind))
        throw usage_error("--scenario: unknown scenario '" + n +
                          "' (known: uniform, zipf, collapsed, homogeneous, mixed, all)");
      storage.push_back(make_logits(kind, o.tokens, E, o.sp));
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      sweep_input in;
      in.name = names[i];
      scenario_kind kind = scenario_kind::uniform;
      parse_scenario(names[i], kind);
      switch (kind) {
        case scenario_kind::uniform:
          in.description = "iid N(0,1) logits, balanced";
          break;
        case scenario_kind::zipf:
          in.description = fmt::format("Zipf-skewed popularity, s={:g}", o.sp.zipf_s);
          break;
        case scenario_kind::collapsed:
          in.description =
              fmt::format("{:g}% of tokens collapse onto expert 0", 100 * o.sp.collapse_share);
          break;
        case scenario_kind::homogeneous:
          in.description = "near-identical tokens (one document)";
          break;
        case scenario_kind::mixed:
          in.description = fmt::format("{} documents interleaved", o.sp.mixed_sources);
          break;
      }
      in.tokens = o.tokens;
      in.logits = storage[i];
      descriptions[in.name] = in.description;
      inputs.push_back(in);
    }
  }
  so.base = base_config(o, *preset, E);

  for (const auto& in : inputs) {
    std::int64_t bad = 0;
    for (float v : in.logits) bad += std::isfinite(v) ? 0 : 1;
    if (bad)
      std::fprintf(
          stderr,
          "moeroute-capacity: warning: %s has %lld non-finite logits (routed as NaN -> -FLT_MAX, "
          "+-Inf -> +-FLT_MAX; see docs/numerics.md)\n",
          in.name.c_str(), static_cast<long long>(bad));
  }
}

}  // namespace moeroute::planner::tool
