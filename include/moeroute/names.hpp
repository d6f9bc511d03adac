// SPDX-License-Identifier: Apache-2.0
// The names of every enum of the routing vocabulary, in one place: to_string() for printing and
// parse<Enum>() for reading them back (the capacity tool's flags, benchmark labels, test case
// descriptions, golden-case semantics). The first name of a value is the one to_string gives;
// later ones are accepted aliases.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <moeroute/config.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// Name table of an enum: {name, value} pairs, canonical name first for each value.
template <class Enum>
struct enum_names;

#define MOEROUTE_ENUM_NAMES(Enum, ...)                                          \
  template <>                                                                   \
  struct enum_names<Enum> {                                                     \
    static constexpr std::pair<std::string_view, Enum> table[] = {__VA_ARGS__}; \
  };

MOEROUTE_ENUM_NAMES(score_function, {"softmax", score_function::softmax},
                    {"sigmoid", score_function::sigmoid},
                    {"sqrt_softplus", score_function::sqrt_softplus},
                    {"sqrtsoftplus", score_function::sqrt_softplus})  // TransformerEngine's
MOEROUTE_ENUM_NAMES(select_from, {"logits", select_from::logits}, {"scores", select_from::scores},
                    {"probs", select_from::scores})
MOEROUTE_ENUM_NAMES(softmax_stage, {"before_topk", softmax_stage::before_topk},
                    {"after_topk", softmax_stage::after_topk})
MOEROUTE_ENUM_NAMES(renormalize, {"none", renormalize::none},
                    {"before_drop", renormalize::before_drop},
                    {"after_drop", renormalize::after_drop})
MOEROUTE_ENUM_NAMES(noise_kind, {"none", noise_kind::none}, {"gaussian", noise_kind::gaussian},
                    {"gumbel", noise_kind::gumbel})
MOEROUTE_ENUM_NAMES(noise_target, {"selection_only", noise_target::selection_only},
                    {"selection_and_gates", noise_target::selection_and_gates})
MOEROUTE_ENUM_NAMES(capacity_mode, {"factor", capacity_mode::factor},
                    {"fixed", capacity_mode::fixed}, {"max_load", capacity_mode::max_load},
                    {"unbounded", capacity_mode::unbounded},
                    {"batch_fraction", capacity_mode::batch_fraction},
                    {"dropless", capacity_mode::unbounded})
MOEROUTE_ENUM_NAMES(capacity_rounding, {"ceil", capacity_rounding::ceil},
                    {"floor", capacity_rounding::floor},
                    {"nearest_even", capacity_rounding::nearest_even})
MOEROUTE_ENUM_NAMES(share_rounding, {"none", share_rounding::none}, {"ceil", share_rounding::ceil},
                    {"floor", share_rounding::floor})
MOEROUTE_ENUM_NAMES(second_expert_policy, {"all", second_expert_policy::all},
                    {"random", second_expert_policy::random},
                    {"sampling", second_expert_policy::sampling})
MOEROUTE_ENUM_NAMES(group_score, {"sum_top_k_share", group_score::sum_top_k_share},
                    {"sum_top_n", group_score::sum_top_n}, {"max", group_score::max})
MOEROUTE_ENUM_NAMES(priority, {"token_major", priority::token_major},
                    {"choice_major", priority::choice_major},
                    {"score_per_expert", priority::score_per_expert}, {"random", priority::random},
                    {"batch_prioritized", priority::batch_prioritized},
                    {"score", priority::score_per_expert})
MOEROUTE_ENUM_NAMES(slot_order, {"priority", slot_order::priority},
                    {"token_index", slot_order::token_index})
MOEROUTE_ENUM_NAMES(drop_policy, {"zero_weight", drop_policy::zero_weight},
                    {"residual", drop_policy::residual}, {"fallback", drop_policy::fallback},
                    {"next_choice", drop_policy::next_choice})
MOEROUTE_ENUM_NAMES(aux_counts, {"top1", aux_counts::top1}, {"all_k", aux_counts::all_k})
MOEROUTE_ENUM_NAMES(aux_count_source, {"routed", aux_count_source::routed},
                    {"fresh_topk", aux_count_source::fresh_topk})
MOEROUTE_ENUM_NAMES(aux_scale, {"e_times_sum", aux_scale::e_times_sum},
                    {"e_over_k_sum", aux_scale::e_over_k_sum},
                    {"normalized", aux_scale::normalized})
MOEROUTE_ENUM_NAMES(token_order, {"sequence_major", token_order::sequence_major},
                    {"position_major", token_order::position_major})
MOEROUTE_ENUM_NAMES(sequence_reduction, {"mean", sequence_reduction::mean},
                    {"sum", sequence_reduction::sum})
MOEROUTE_ENUM_NAMES(layout_kind, {"padded", layout_kind::padded}, {"compact", layout_kind::compact})
MOEROUTE_ENUM_NAMES(fate, {"kept", fate::kept}, {"rerouted", fate::rerouted},
                    {"dropped", fate::dropped}, {"masked", fate::masked})

#undef MOEROUTE_ENUM_NAMES

template <class Enum>
concept named_enum = requires {
  enum_names<Enum>::table;
};

/// @brief The canonical name of `e` ("?" for a value outside the enum).
template <named_enum Enum>
[[nodiscard]] constexpr std::string_view to_string(Enum e) noexcept {
  for (const auto& [name, value] : enum_names<Enum>::table)
    if (value == e) return name;
  return "?";
}

/// @brief The value named `s` (canonical name or alias), or nullopt.
template <named_enum Enum>
[[nodiscard]] constexpr std::optional<Enum> parse(std::string_view s) noexcept {
  for (const auto& [name, value] : enum_names<Enum>::table)
    if (name == s) return value;
  return std::nullopt;
}

/// @brief The canonical names of an enum's values, comma separated (for help and messages).
template <named_enum Enum>
[[nodiscard]] std::string known_names() {
  std::string out;
  for (const auto& [name, value] : enum_names<Enum>::table) {
    if (to_string(value) != name) continue;  // aliases are accepted, not advertised
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

}  // namespace moeroute
