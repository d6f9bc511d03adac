// SPDX-License-Identifier: Apache-2.0
// Expert placement: which rank owns each of the E global experts, and the expert's index on
// that rank. Global and local ids are distinct types, so one cannot be passed for the other,
// and both share one sentinel (no_expert) that is checked and never used as an index — the two
// mistakes expert-parallel users report most (docs/expert-parallel.md, "Placement").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/status.hpp>

namespace moeroute::ep {

namespace detail {
/// FNV-1a over bytes: the fingerprints ranks compare (placement, config, options).
inline std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}
}  // namespace detail

/// The one sentinel of both id types: "no expert". index() refuses it.
inline constexpr std::int32_t no_expert = -1;

/// @brief An expert's id in the whole model, 0 .. E-1 (E for a dedicated fallback expert).
struct global_expert_id {
  std::int32_t value = no_expert;
  friend constexpr bool operator==(global_expert_id, global_expert_id) = default;
};

/// @brief An expert's id on the rank that owns it, 0 .. local_experts(rank)-1.
struct local_expert_id {
  std::int32_t value = no_expert;
  friend constexpr bool operator==(local_expert_id, local_expert_id) = default;
};

/// @brief The id as an array index; throws moeroute::error on the sentinel (an index of -1
///        would wrap to a real expert).
template <class Id>
[[nodiscard]] std::size_t index(Id id) {
  if (id.value < 0)
    throw error(status::make(status_code::invalid_argument,
                             "expert id " + std::to_string(id.value) +
                                 " is the no_expert sentinel (or negative): not an index"));
  return static_cast<std::size_t>(id.value);
}

/// @brief E global experts on R ranks. Build it with contiguous(), round_robin() or
///        from_table(); every rank must build the same placement (make_plan checks a
///        fingerprint). Ranks may own no expert (R > E).
class placement {
 public:
  /// Blocks of consecutive experts; when R does not divide E the first E % R ranks own one
  /// more (Megatron's layout for even E, generalised).
  [[nodiscard]] static placement contiguous(std::int32_t experts, std::int32_t ranks) {
    check_extents(experts, ranks);
    std::vector<std::vector<std::int32_t>> table(ranks);
    const std::int32_t base = experts / ranks, extra = experts % ranks;
    std::int32_t e = 0;
    for (std::int32_t r = 0; r < ranks; ++r)
      for (std::int32_t i = 0; i < base + (r < extra ? 1 : 0); ++i) table[r].push_back(e++);
    return placement(experts, std::move(table), "contiguous");
  }

  /// Expert e on rank e % R (spreads neighbouring experts, which are often co-selected).
  [[nodiscard]] static placement round_robin(std::int32_t experts, std::int32_t ranks) {
    check_extents(experts, ranks);
    std::vector<std::vector<std::int32_t>> table(ranks);
    for (std::int32_t e = 0; e < experts; ++e) table[e % ranks].push_back(e);
    return placement(experts, std::move(table), "round_robin");
  }

  /// An explicit table: experts_of_rank[r] lists rank r's experts in local-id order. Every
  /// expert 0 .. E-1 must be owned exactly once; throws moeroute::error naming the entry.
  [[nodiscard]] static placement from_table(
      std::int32_t experts, std::vector<std::vector<std::int32_t>> experts_of_rank) {
    check_extents(experts, static_cast<std::int64_t>(experts_of_rank.size()));
    std::vector<std::int32_t> seen(experts, -1);
    for (std::size_t r = 0; r < experts_of_rank.size(); ++r) {
      for (std::size_t i = 0; i < experts_of_rank[r].size(); ++i) {
        const std::int32_t e = experts_of_rank[r][i];
        const std::string at =
            "placement table[" + std::to_string(r) + "][" + std::to_string(i) + "] = ";
        if (e < 0 || e >= experts)
          throw error(status::make(status_code::invalid_argument,
                                   at + std::to_string(e) + " is outside [0, experts = " +
                                       std::to_string(experts) + ")"));
        if (seen[e] >= 0)
          throw error(status::make(status_code::invalid_argument,
                                   at + std::to_string(e) + ": expert already owned by rank " +
                                       std::to_string(seen[e]) + " (each expert exactly once)"));
        seen[e] = static_cast<std::int32_t>(r);
      }
    }
    for (std::int32_t e = 0; e < experts; ++e)
      if (seen[e] < 0)
        throw error(status::make(status_code::invalid_argument,
                                 "placement table: expert " + std::to_string(e) +
                                     " is owned by no rank (each expert exactly once)"));
    return placement(experts, std::move(experts_of_rank), "table");
  }

  [[nodiscard]] std::int32_t experts() const noexcept { return experts_; }
  [[nodiscard]] std::int32_t ranks() const noexcept {
    return static_cast<std::int32_t>(table_.size());
  }
  [[nodiscard]] const std::string& kind() const noexcept { return kind_; }

  /// Rank that owns global expert g (g in [0, E)).
  [[nodiscard]] std::int32_t owner(global_expert_id g) const { return owner_[checked(g)]; }
  /// g's id on its owner.
  [[nodiscard]] local_expert_id local(global_expert_id g) const { return {local_[checked(g)]}; }
  /// The global id of rank's local expert l.
  [[nodiscard]] global_expert_id global(std::int32_t rank, local_expert_id l) const {
    const auto& list = table_.at(checked_rank(rank));
    const std::size_t i = index(l);
    if (i >= list.size())
      throw error(status::make(status_code::invalid_argument,
                               "local expert " + std::to_string(l.value) + " is outside rank " +
                                   std::to_string(rank) + "'s " + std::to_string(list.size()) +
                                   " experts"));
    return {list[i]};
  }
  /// Experts rank owns.
  [[nodiscard]] std::int32_t local_experts(std::int32_t rank) const {
    return static_cast<std::int32_t>(table_.at(checked_rank(rank)).size());
  }
  /// Rank r's experts in local-id order.
  [[nodiscard]] std::span<const std::int32_t> experts_of(std::int32_t rank) const {
    return table_.at(checked_rank(rank));
  }

  /// FNV-1a over E, R and the table: equal on every rank that built the same placement.
  [[nodiscard]] std::uint64_t fingerprint() const {
    std::vector<std::int64_t> v{experts_, ranks()};
    for (const auto& list : table_) {
      v.push_back(static_cast<std::int64_t>(list.size()));
      v.insert(v.end(), list.begin(), list.end());
    }
    return detail::fnv1a(v.data(), v.size() * sizeof(std::int64_t));
  }

 private:
  placement(std::int32_t experts, std::vector<std::vector<std::int32_t>> table, std::string kind)
      : experts_(experts), table_(std::move(table)), kind_(std::move(kind)) {
    owner_.assign(experts_, -1);
    local_.assign(experts_, -1);
    for (std::size_t r = 0; r < table_.size(); ++r)
      for (std::size_t i = 0; i < table_[r].size(); ++i) {
        owner_[table_[r][i]] = static_cast<std::int32_t>(r);
        local_[table_[r][i]] = static_cast<std::int32_t>(i);
      }
  }

  static void check_extents(std::int64_t experts, std::int64_t ranks) {
    if (experts < 1 || experts > max_experts)
      throw error(status::make(
          status_code::invalid_argument,
          moeroute::detail::field_msg("experts", experts, "must be in [1, max_experts]")));
    if (ranks < 1 || ranks > (std::int64_t{1} << 20))
      throw error(
          status::make(status_code::invalid_argument,
                       moeroute::detail::field_msg("ranks", ranks, "must be in [1, 2^20]")));
  }
  std::size_t checked(global_expert_id g) const {
    const std::size_t i = index(g);
    if (i >= owner_.size())
      throw error(status::make(status_code::invalid_argument,
                               "global expert " + std::to_string(g.value) +
                                   " is outside [0, experts = " + std::to_string(experts_) + ")"));
    return i;
  }
  std::size_t checked_rank(std::int32_t rank) const {
    if (rank < 0 || rank >= ranks())
      throw error(status::make(status_code::invalid_argument,
                               "rank " + std::to_string(rank) +
                                   " is outside [0, ranks = " + std::to_string(ranks()) + ")"));
    return static_cast<std::size_t>(rank);
  }

  std::int32_t experts_ = 0;
  std::vector<std::vector<std::int32_t>> table_;  // [R] global ids in local-id order
  std::string kind_;
  std::vector<std::int32_t> owner_;  // [E] rank
  std::vector<std::int32_t> local_;  // [E] local id on the owner
};

}  // namespace moeroute::ep
