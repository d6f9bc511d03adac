// SPDX-License-Identifier: Apache-2.0
// The one list of model shapes every benchmark uses (CPU and GPU), so their numbers line up.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/presets.hpp>

namespace moeroute::bench {

struct model_shape {
  std::string_view name;
  std::string_view preset;  ///< its routing, by name in presets::registry
  std::int32_t experts;     ///< E, k and d of the model the preset is named after
  std::int32_t top_k;
  std::int64_t hidden;  ///< d
  /// The model's own routing (dropless presets route every assignment).
  [[nodiscard]] routing_config config() const { return presets::by_name(preset, experts, top_k); }
  /// The same routing with a capacity (factor 1.25, token-major), so dispatch has work to drop.
  [[nodiscard]] routing_config capacity_config(double factor = 1.25) const {
    routing_config c = config();
    c.capacity.mode = capacity_mode::factor;
    c.capacity.factor = factor;
    return c;
  }
};

/// The benchmark shape `name` of a registry preset: its E, k and d are the registry's defaults
/// (a name missing from the registry does not compile).
constexpr model_shape shape_of(std::string_view name, std::string_view preset) {
  const presets::preset_info& p = *presets::find(preset);
  return {name, preset, p.default_experts, p.default_k, p.default_hidden};
}

/// Switch-Base (E=128, k=1, d=768); Mixtral 8x7B (E=8, k=2, d=4096); DeepSeek-V3 (E=256, k=8,
/// 8 groups / top-4, d=7168); Qwen3-MoE 30B-A3B (E=128, k=8, d=2048); OLMoE (E=64, k=8, d=2048).
inline constexpr model_shape model_shapes[] = {
    shape_of("switch_base", "switch_top1"),
    shape_of("mixtral_8x7b", "mixtral"),
    shape_of("deepseek_v3", "deepseek_v3"),
    shape_of("qwen3_moe", "qwen_moe"),
    shape_of("olmoe", "olmoe"),
};

/// Wide rows, for the GPU gating benchmarks only (cuda_gating_*; the other stages and the CPU
/// benchmarks keep the five models above): E = 384 with DeepSeek-V3's routing (Kimi-K2's expert
/// count and width) and E = 512, k = 10 with Qwen3's (Qwen3-Next-80B-A3B's shape). Shapes, not
/// those models' exact routers (Kimi-K2 has one group; the preset here keeps eight).
inline constexpr model_shape wide_gating_shapes[] = {
    {"deepseek_v3_e384", "deepseek_v3", 384, 8, 7168},
    {"qwen3_e512_k10", "qwen_moe", 512, 10, 2048},
};
/// Their token counts: decode, a mid batch, prefill.
inline constexpr std::int64_t wide_gating_token_counts[] = {1, 128, 16384};

/// Tokens per batch: 1 (decode) to 16384 (prefill). GPU benchmarks use all of them.
inline constexpr std::int64_t token_counts[] = {1, 16, 128, 1024, 4096, 16384};
/// The CPU reference is a plain loop nest: a trimmed set keeps the CPU run near a minute.
inline constexpr std::int64_t cpu_token_counts[] = {1, 128, 4096};
/// permute / combine move T * k * d elements: smaller still on the CPU.
inline constexpr std::int64_t cpu_data_token_counts[] = {1, 128};

/// H200 HBM3e peak bandwidth, bytes per second (for % of peak on the GPU).
inline constexpr double h200_peak_bytes_per_s = 4.8e12;

}  // namespace moeroute::bench
