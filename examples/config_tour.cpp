// SPDX-License-Identifier: Apache-2.0
// A tour of the configuration: a named preset, one knob changed, validate() naming the field
// it rejects, the enums by name, the capacity a batch gets, and the config as text and back. Prints
// OK when every step behaves as documented (CTest: example_config_tour).
#include <cstdio>
#include <string>

#include <moeroute/capacity.hpp>
#include <moeroute/config_fields.hpp>
#include <moeroute/names.hpp>
#include <moeroute/presets.hpp>

int main() {
  namespace mr = moeroute;
  bool ok = true;
  // [snippet:config]
  // A peer's routing by name (moeroute/presets.hpp), then one knob of our own.
  mr::routing_config cfg = mr::presets::by_name("megatron", /*experts=*/64, /*k=*/4);
  cfg.capacity.mode = mr::capacity_mode::factor;
  cfg.capacity.factor = 1.25;
  cfg.dispatch.dropped = mr::drop_policy::next_choice;  // reroute instead of drop
  cfg.dispatch.reroute.max_candidates = 2;
  if (const auto s = mr::validate(cfg); !s) std::printf("%s\n", s.message.c_str());

  // validate() names the field and the value it rejects.
  mr::routing_config bad = cfg;
  bad.top_k = 0;
  const mr::status s = mr::validate(bad);  // invalid_config: "top_k = 0: must be >= 1"

  // Every enum by name, both ways (moeroute/names.hpp), e.g. for a command line.
  const auto prio = mr::parse<mr::priority>("choice_major");  // std::optional<priority>
  std::printf("%s, %s\n", std::string(mr::to_string(cfg.dispatch.dropped)).c_str(),
              mr::known_names<mr::priority>().c_str());

  // The capacity of each expert for a batch of 4096 tokens: ceil(1.25 * 4096 * 4 / 64).
  const std::int64_t C = mr::expert_capacity(cfg, 4096);

  // The whole config as text and back (moeroute/config_fields.hpp), e.g. for a training log:
  // "num_experts=64 top_k=4 gating.stage=after_topk ... dispatch.dropped=next_choice ..."
  const std::string text = mr::to_string(cfg);
  const mr::routing_config same = mr::parse_config(text);
  mr::routing_config tuned = cfg;  // or single fields, by the names validate() reports
  if (const auto e = mr::set_field(tuned, "capacity.factor", "1.5"); !e)
    std::printf("%s\n", e.message.c_str());
  // [/snippet]
  ok = ok && mr::validate(cfg).ok();
  ok = ok && s.code == mr::status_code::invalid_config && s.message == "top_k = 0: must be >= 1";
  ok = ok && prio == mr::priority::choice_major && !mr::parse<mr::priority>("fastest");
  ok = ok && C == 320;
  ok = ok && mr::to_string(same) == text &&
       text.find("dispatch.dropped=next_choice") != std::string::npos;
  ok = ok && tuned.capacity.factor == 1.5 && !mr::set_field(tuned, "capacity.factr", "1.5");
  ok = ok && mr::presets::find("deepseek") != nullptr &&
       mr::presets::find("no-such-preset") == nullptr;
  std::printf("%s: capacity %lld, validate says \"%s\"\n", ok ? "OK" : "FAILED",
              static_cast<long long>(C), s.message.c_str());
  return ok ? 0 : 1;
}
