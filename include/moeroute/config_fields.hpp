// SPDX-License-Identifier: Apache-2.0
// Every field of routing_config by its dotted name ("gating.score", "capacity.factor"), in one
// list: it prints a config (to_string), reads one back (set_field, set_fields, parse_config)
// and walks two side by side (for_each_field over several configs, e.g. to diff them). The
// names are the ones validate() puts in its messages.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include <moeroute/config.hpp>
#include <moeroute/names.hpp>
#include <moeroute/status.hpp>

namespace moeroute {

/// @brief Calls visit(name, field...) for every field of routing_config in declaration order,
///        passing the same field of each of `configs` (one config to print or set it, two to
///        compare them). A field added to routing_config must be added here: the round-trip
///        test in tests/reference/config_fields_test.cpp fails until it is.
template <class Visit, class... Configs>
requires(sizeof...(Configs) > 0 && (std::is_same_v<std::remove_const_t<Configs>, routing_config> &&
                                    ...)) constexpr void for_each_field(Visit&& visit,
                                                                        Configs&... c) {
  visit("num_experts", c.num_experts...);
  visit("top_k", c.top_k...);
  visit("training", c.training...);
  // gating
  visit("gating.score", c.gating.score...);
  visit("gating.select", c.gating.select...);
  visit("gating.stage", c.gating.stage...);
  visit("gating.renorm", c.gating.renorm...);
  visit("gating.renorm_epsilon", c.gating.renorm_epsilon...);
  visit("gating.scaling_factor", c.gating.scaling_factor...);
  visit("gating.expert_bias", c.gating.expert_bias...);
  visit("gating.bias_update.rate", c.gating.bias_update.rate...);
  visit("gating.bias_update.recenter", c.gating.bias_update.recenter...);
  visit("gating.group_limit.groups", c.gating.group_limit.groups...);
  visit("gating.group_limit.group_topk", c.gating.group_limit.group_topk...);
  visit("gating.group_limit.score", c.gating.group_limit.score...);
  visit("gating.group_limit.top_n", c.gating.group_limit.top_n...);
  visit("gating.noise.kind", c.gating.noise.kind...);
  visit("gating.noise.scale", c.gating.noise.scale...);
  visit("gating.noise.seed", c.gating.noise.seed...);
  visit("gating.noise.offset", c.gating.noise.offset...);
  visit("gating.noise.target", c.gating.noise.target...);
  visit("gating.noise.only_in_training", c.gating.noise.only_in_training...);
  visit("gating.second_expert.policy", c.gating.second_expert.policy...);
  visit("gating.second_expert.seed", c.gating.second_expert.seed...);
  visit("gating.second_expert.offset", c.gating.second_expert.offset...);
  // capacity
  visit("capacity.mode", c.capacity.mode...);
  visit("capacity.factor", c.capacity.factor...);
  visit("capacity.eval_factor", c.capacity.eval_factor...);
  visit("capacity.includes_k", c.capacity.includes_k...);
  visit("capacity.k_after_rounding", c.capacity.k_after_rounding...);
  visit("capacity.share", c.capacity.share...);
  visit("capacity.rounding", c.capacity.rounding...);
  visit("capacity.min_capacity", c.capacity.min_capacity...);
  visit("capacity.clamp_to_tokens", c.capacity.clamp_to_tokens...);
  visit("capacity.no_drop_when_exceeds_tokens", c.capacity.no_drop_when_exceeds_tokens...);
  visit("capacity.fixed", c.capacity.fixed...);
  visit("capacity.group_tokens", c.capacity.group_tokens...);
  // dispatch
  visit("dispatch.prio", c.dispatch.prio...);
  visit("dispatch.slots", c.dispatch.slots...);
  visit("dispatch.dropped", c.dispatch.dropped...);
  visit("dispatch.fallback.expert", c.dispatch.fallback.expert...);
  visit("dispatch.fallback.capacity", c.dispatch.fallback.capacity...);
  visit("dispatch.reroute.max_candidates", c.dispatch.reroute.max_candidates...);
  visit("dispatch.random_seed", c.dispatch.random_seed...);
  visit("dispatch.random_offset", c.dispatch.random_offset...);
  // loss
  visit("loss.counts", c.loss.counts...);
  visit("loss.count_source", c.loss.count_source...);
  visit("loss.scale", c.loss.scale...);
  visit("loss.aux_coefficient", c.loss.aux_coefficient...);
  visit("loss.z_coefficient", c.loss.z_coefficient...);
  visit("loss.sequence_length", c.loss.sequence_length...);
  visit("loss.sequence_order", c.loss.sequence_order...);
  visit("loss.sequence_reduce", c.loss.sequence_reduce...);
}

namespace detail {

/// A field's value as text: an enum's canonical name, true / false, or the shortest decimal
/// that reads back to the same number (std::to_chars).
template <class T>
std::string field_text(const T& v) {
  if constexpr (named_enum<T>) {
    return std::string(to_string(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  }
}

/// Reads a field's value from text (the whole text, nothing left over); false when it does not
/// parse, leaving `out` as it was.
template <class T>
bool read_field(std::string_view s, T& out) {
  if constexpr (named_enum<T>) {
    const auto e = parse<T>(s);
    if (e) out = *e;
    return e.has_value();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (s != "true" && s != "false" && s != "1" && s != "0") return false;
    out = s == "true" || s == "1";
    return true;
  } else {
    T v{};
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc{} || r.ptr != s.data() + s.size()) return false;
    out = v;
    return true;
  }
}

/// What a field takes, for the message of a value that does not parse.
template <class T>
std::string field_kind() {
  if constexpr (named_enum<T>) {
    return "one of " + known_names<T>();
  } else if constexpr (std::is_same_v<T, bool>) {
    return "true or false";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "a number";
  } else {
    return "an integer in range";
  }
}

/// Equal values; NaN equals NaN (capacity.eval_factor is NaN by default).
template <class T>
bool same_field(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) && std::isnan(b)) return true;
  }
  return a == b;
}

}  // namespace detail

/// @brief The fields of `c` as "name=value" pairs separated by spaces, in declaration order:
///        those that differ from routing_config{} (all of them with `all`). set_fields reads
///        the text back to the same config.
[[nodiscard]] inline std::string to_string(const routing_config& c, bool all = false) {
  const routing_config defaults{};
  std::string out;
  for_each_field(
      [&](const char* name, const auto& value, const auto& initial) {
        if (!all && detail::same_field(value, initial)) return;
        if (!out.empty()) out += ' ';
        out += name;
        out += '=';
        out += detail::field_text(value);
      },
      c, defaults);
  return out;
}

/// @brief Sets the field named `name` from `value` (an enum name, true / false, a number).
/// @return invalid_argument naming the field: an unknown name, or a value that does not parse
///         (the message says what the field takes). Range checks are validate()'s.
[[nodiscard]] inline status set_field(routing_config& c, std::string_view name,
                                      std::string_view value) {
  bool found = false;
  status result = status::success();
  for_each_field(
      [&](const char* field, auto& slot) {
        if (found || name != field) return;
        found = true;
        using T = std::remove_reference_t<decltype(slot)>;
        if (!detail::read_field(value, slot))
          result = status::make(status_code::invalid_argument,
                                std::string(field) + " = '" + std::string(value) + "': must be " +
                                    detail::field_kind<T>());
      },
      c);
  if (!found)
    return status::make(status_code::invalid_argument,
                        std::string(1, '\'').append(name).append("': not a routing_config field"));
  return result;
}

/// @brief Applies "name=value" assignments separated by spaces (what to_string writes), in
///        order, to `c`; stops at the first that fails and returns its error.
[[nodiscard]] inline status set_fields(routing_config& c, std::string_view assignments) {
  while (!assignments.empty()) {
    const std::size_t start = assignments.find_first_not_of(' ');
    if (start == std::string_view::npos) break;
    assignments.remove_prefix(start);
    const std::size_t end = std::min(assignments.find(' '), assignments.size());
    const std::string_view item = assignments.substr(0, end);
    assignments.remove_prefix(end);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return status::make(status_code::invalid_argument, std::string(1, '\'').append(item).append(
                                                             "': not a name=value assignment"));
    if (auto s = set_field(c, item.substr(0, eq), item.substr(eq + 1)); !s) return s;
  }
  return status::success();
}

/// @brief routing_config{} with `assignments` applied (see set_fields); throws moeroute::error
///        naming the field on a bad one. Does not validate() the result.
[[nodiscard]] inline routing_config parse_config(std::string_view assignments) {
  routing_config c;
  throw_if_error(set_fields(c, assignments));
  return c;
}

}  // namespace moeroute
