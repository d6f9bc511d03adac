// SPDX-License-Identifier: Apache-2.0
// Presets of moeroute/presets.hpp by name, with the model defaults the capacity tool and the
// benchmarks use when the user gives no --experts / --top-k / --hidden.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/status.hpp>

namespace moeroute::bench {

struct named_preset {
  std::string_view name;
  std::string_view description;
  std::int32_t default_experts;
  std::int32_t default_k;       ///< the k the preset is built for
  bool fixed_k;                 ///< preset only exists for this k (switch_top1, *_top2)
  std::int64_t default_hidden;  ///< d of the model it is named after
};

inline constexpr named_preset preset_table[] = {
    {"deepspeed_topk", "DeepSpeed topkgating, position priority, renormalise after drop", 8, 2,
     false, 4096},
    {"deepspeed_top2", "DeepSpeed top2gating / GShard top-2, choice-major, min capacity 4", 8, 2,
     true, 4096},
    {"gshard_top2", "GShard top-2 (same routing as deepspeed_top2)", 8, 2, true, 4096},
    {"switch_top1", "Switch Transformer top-1, factor 1.25, residual (Switch-Base: E=128, d=768)",
     128, 1, true, 768},
    {"seed_reference", "the design notes' moe_route: C = int(f*T/E), token loop, residual", 8, 2,
     false, 4096},
    {"megatron", "Megatron-Core TopKRouter, score priority (\"probs\"), token-index slots", 8, 2,
     false, 4096},
    {"mixtral", "Mixtral 8x7B: top-2 of 8, softmax after top-k, dropless (d=4096)", 8, 2, false,
     4096},
    {"deepseek_v3", "DeepSeek-V3: sigmoid, bias, 8 groups / top-4, top-8 of 256, x2.5 (d=7168)",
     256, 8, false, 7168},
    {"qwen_moe", "Qwen3-MoE: softmax, top-8 of 128, renormalised (d=2048)", 128, 8, false, 2048},
    {"olmoe", "OLMoE: softmax, top-8 of 64, no renormalisation, z-loss (d=2048)", 64, 8, false,
     2048},
};

inline const named_preset* find_preset(std::string_view name) {
  if (name == "switch") name = "switch_top1";
  if (name == "deepseek") name = "deepseek_v3";
  if (name == "qwen3" || name == "qwen") name = "qwen_moe";
  for (const auto& p : preset_table)
    if (p.name == name) return &p;
  return nullptr;
}

inline std::string preset_names() {
  std::string s;
  for (const auto& p : preset_table) {
    if (!s.empty()) s += ", ";
    s += p.name;
  }
  return s;
}

/// @brief Builds the named preset for E experts and top-k. Throws moeroute::error
///        (invalid_config) for an unknown name or a k the preset does not support.
inline routing_config make_preset(std::string_view name, std::int32_t E, std::int32_t k) {
  const named_preset* p = find_preset(name);
  if (!p)
    throw error(status::make(status_code::invalid_config, "unknown preset '" + std::string(name) +
                                                              "' (known: " + preset_names() + ")"));
  if (p->fixed_k && k != p->default_k)
    throw error(
        status::make(status_code::invalid_config, "preset " + std::string(p->name) + " is top-" +
                                                      std::to_string(p->default_k) +
                                                      " only, got --top-k " + std::to_string(k)));
  const std::string_view n = p->name;
  if (n == "deepspeed_topk") return presets::deepspeed_topk(E, k);
  if (n == "deepspeed_top2") return presets::deepspeed_top2(E);
  if (n == "gshard_top2") return presets::gshard_top2(E);
  if (n == "switch_top1") return presets::switch_top1(E);
  if (n == "seed_reference") return presets::seed_reference(E, k);
  if (n == "megatron") return presets::megatron(E, k);
  if (n == "mixtral") return presets::mixtral(E, k);
  if (n == "deepseek_v3") {
    // 8 groups / top-4 when E allows it (the real model), else no group limit.
    if (E % 8 == 0 && k % 4 == 0 && k / 4 <= E / 8) return presets::deepseek_v3(E, k, 8, 4);
    return presets::deepseek_v3(E, k, 0, 0);
  }
  if (n == "qwen_moe") return presets::qwen_moe(E, k);
  return presets::olmoe(E, k);
}

}  // namespace moeroute::bench
