// SPDX-License-Identifier: Apache-2.0
// CPU backend: capacity assignment. Every (token, choice) assignment gets a fate, a final
// expert, a slot and a combine weight, with the per-expert counts and the batch totals: the
// operation and params of cuda::dispatch, the results of reference::dispatch, bit for bit.
//
// How: the valid assignments are put in priority order once — a stable LSD radix sort of
// their 32-bit priority value (score, random draw or token priority) over the base order
// (token-major or choice-major), then a stable counting sort by choice rank
// (batch_prioritized) and by capacity group — O(T k) with a fixed number of passes. Walking
// that order grants slots (each expert's queue is its sub-sequence, already in order); the
// dropped ones, in the same order, are the reroute order. No comparison sort anywhere.
//
// When nothing else reads that order — one capacity group, no reroutes, and token-major
// priority, choice-major with slots in grant order, or a value-keyed one (score_per_expert,
// random) with slots by token index (Megatron's "probs" dropping) — only *which* C requests
// each expert keeps matters: dispatch_by_selection.hpp, no sort at all, parallel over tokens
// (and over experts). The ordered path runs on the calling thread.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/cpu/detail/dispatch_by_selection.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/dispatch.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cpu {

using moeroute::dispatch_params;

namespace detail {

/// validate() without the values: config, shapes, pointers, the assignment limit.
[[nodiscard]] inline status validate_shapes(const routing_config& cfg, const dispatch_params& p) {
  if (auto s = check_params(cfg, p); !s) return s;
  const std::int64_t n = p.tokens * cfg.top_k;
  if (n > std::numeric_limits<std::int32_t>::max() - 1)
    return status::make(status_code::unsupported,
                        "tokens * top_k = " + std::to_string(n) +
                            ": cpu::dispatch handles at most 2^31 - 2 assignments");
  return status::success();
}

/// validate()'s checks of the values (shapes already checked).
[[nodiscard]] inline status validate_values(const routing_config& cfg, const dispatch_params& p) {
  const std::int64_t n = p.tokens * cfg.top_k;
  const std::int32_t E = cfg.num_experts;
  const auto bad = [](const char* what, std::int64_t i, const char* why) {
    return status::make(status_code::invalid_argument,
                        std::string(what) + "[" + std::to_string(i) + "] " + why);
  };
  for (std::int64_t a = 0; a < n; ++a) {
    if (p.gated.d_ids[a] < 0 || p.gated.d_ids[a] >= E)
      return bad("gated.d_ids", a, "is outside [0, num_experts)");
    if (!std::isfinite(p.gated.d_gates[a])) return bad("gated.d_gates", a, "is not finite");
  }
  const std::int64_t R = cfg.reroute_candidates();
  for (std::int64_t i = 0; i < p.tokens * R; ++i)
    if (p.gated.d_reroute_ids[i] < 0 || p.gated.d_reroute_ids[i] >= E)
      return bad("gated.d_reroute_ids", i, "is outside [0, num_experts)");
  if (cfg.dispatch.prio == priority::batch_prioritized)
    for (std::int64_t t = 0; t < p.tokens; ++t)
      if (!std::isfinite(p.gated.d_token_priority[t]))
        return bad("gated.d_token_priority", t, "is not finite");
  return status::success();
}

}  // namespace detail

/// @brief Checks config, shapes and pointers (check_params), at most 2^31 - 2 assignments, and
///        the gating outputs it reads: ids and reroute ids in [0, E), finite gates and token
///        priorities. Names the first bad field and element.
[[nodiscard]] inline status validate(const routing_config& cfg, const dispatch_params& p) {
  if (auto s = detail::validate_shapes(cfg, p); !s) return s;
  return detail::validate_values(cfg, p);
}

namespace detail {

/// The dispatch workspace, carved in one fixed sequence (sizing and carving passes agree).
struct dispatch_space {
  std::int32_t* order = nullptr;         // [n] valid assignments in priority order
  std::int32_t* scratch = nullptr;       // [n] radix sort ping-pong
  std::uint32_t* key = nullptr;          // [n] 32-bit priority keys (ascending = first);
                                         // keyed priorities only
  std::uint32_t* key_scratch = nullptr;  // [n] keyed priorities only
  std::int64_t* held = nullptr;          // [Q * ET] slots held in (group, expert)
  std::int64_t* base = nullptr;          // [Q * ET] first slot of (group, expert)
  std::uint8_t* owns = nullptr;          // [n] 1 = the assignment owns its slot (not shared)
  std::int32_t* next = nullptr;          // [T] next reroute candidate per token
  std::int64_t* histogram = nullptr;     // [max(radix_passes * (radix_digits + 1) where keyed,
                                         //      Q + 1, k + 1, E)]
  selection_space selection;             // keeps_by_selection only (nothing else is carved)
};

inline constexpr int radix_bits = 11;  // three passes of 11 bits cover a 32-bit key
inline constexpr int radix_passes = 3;
inline constexpr std::int64_t radix_digits = std::int64_t{1} << radix_bits;

/// True when the priority order is a radix sort by a 32-bit value key (score, random draw or
/// token priority); token- and choice-major priority need no keys, their buffers, nor the
/// radix histograms.
[[nodiscard]] inline bool keyed_priority(const routing_config& cfg) noexcept {
  const priority p = cfg.dispatch.prio;
  return p == priority::score_per_expert || p == priority::random ||
         p == priority::batch_prioritized;
}

inline dispatch_space carve_dispatch_space(workspace_carver& w, const routing_config& cfg,
                                           std::int64_t tokens) {
  const std::size_t n = static_cast<std::size_t>(tokens * cfg.top_k);
  const std::size_t cells =
      static_cast<std::size_t>(cfg.capacity_groups(tokens) * cfg.total_experts());
  const bool keyed = keyed_priority(cfg);
  const std::size_t hist = static_cast<std::size_t>(
      std::max<std::int64_t>({keyed ? radix_passes * (radix_digits + 1) : 0,
                              cfg.capacity_groups(tokens) + 1, cfg.top_k + 1, cfg.num_experts}));
  dispatch_space s;
  if (keeps_by_selection(cfg, tokens)) {
    s.selection = carve_selection_space(w, cfg, tokens);
    return s;
  }
  s.order = w.take<std::int32_t>(n);
  s.scratch = w.take<std::int32_t>(n);
  s.key = w.take<std::uint32_t>(keyed ? n : 0);
  s.key_scratch = w.take<std::uint32_t>(keyed ? n : 0);
  s.held = w.take<std::int64_t>(cells);
  s.base = w.take<std::int64_t>(cells);
  s.owns = w.take<std::uint8_t>(n);
  s.next = w.take<std::int32_t>(static_cast<std::size_t>(tokens));
  s.histogram = w.take<std::int64_t>(hist);
  return s;
}

/// Stable counting sort of m items by digit(item) in [0, digits): from `in` to `out`.
template <class Digit, class Move>
void counting_pass(std::int64_t m, std::int64_t digits, std::int64_t* count, Digit digit,
                   Move move) {
  std::fill(count, count + digits + 1, std::int64_t{0});
  for (std::int64_t i = 0; i < m; ++i) ++count[digit(i) + 1];
  for (std::int64_t d = 0; d < digits; ++d) count[d + 1] += count[d];
  for (std::int64_t i = 0; i < m; ++i) move(i, count[digit(i)]++);
}

/// @brief invalid_argument naming the first repeated expert of a token: among its ids, or
///        its reroute candidates and ids. `stamp` [E] is scratch (ids are in range: validate()).
[[nodiscard]] inline status check_distinct(const dispatch_params& p, std::int64_t T, std::int32_t E,
                                           std::int32_t k, std::int32_t R, std::int64_t* stamp) {
  const std::int32_t* ids = p.gated.d_ids;
  const std::int32_t* reroute = p.gated.d_reroute_ids;
  std::fill(stamp, stamp + E, std::int64_t{-1});
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int32_t e = ids[t * k + j];
      if (stamp[e] == t)
        return status::make(status_code::invalid_argument,
                            "gated.d_ids[" + std::to_string(t * k + j) +
                                "] = " + std::to_string(e) + ": token " + std::to_string(t) +
                                " names that expert twice (a token's k experts are distinct)");
      stamp[e] = t;
    }
    for (std::int32_t r = 0; r < R; ++r) {
      const std::int32_t e = reroute[t * R + r];
      if (stamp[e] == t)
        return status::make(status_code::invalid_argument,
                            "gated.d_reroute_ids[" + std::to_string(t * R + r) +
                                "] = " + std::to_string(e) + ": token " + std::to_string(t) +
                                " already names that expert (its k + R candidates are distinct)");
      stamp[e] = t;
    }
  }
  return status::success();
}

}  // namespace detail

/// @brief Workspace bytes cpu::dispatch needs for `tokens` tokens under `cfg` (0 for T <= 0).
[[nodiscard]] inline std::size_t dispatch_workspace_bytes(const routing_config& cfg,
                                                          std::int64_t tokens) {
  if (tokens <= 0) return 0;
  workspace_carver w;
  (void)detail::carve_dispatch_space(w, cfg, tokens);
  return w.bytes();
}

namespace detail {

/// @brief One cpu::dispatch call on the ordered path, phase by phase — the phases of
///        cuda::dispatch's dispatch_run, with the same names: grant (requests, the priority
///        order, capacity, the grants), fallback / next_choice (reroutes of the dropped ones in
///        the same order), rebase / renumber (slot numbering over capacity groups, or by token
///        index), finalize (per-expert counts, totals, combine weights). Runs on the calling
///        thread; every phase reads what the previous ones wrote.
class dispatch_run {
 public:
  dispatch_run(const routing_config& cfg, const dispatch_params& p, const dispatch_space& w)
      : cfg_(cfg),
        p_(p),
        w_(w),
        d_(cfg.dispatch),
        o_(p.out),
        ids_(p.gated.d_ids),
        T_(p.tokens),
        k_(cfg.top_k),
        E_(cfg.num_experts),
        ET_(cfg.total_experts()),
        n_(p.tokens * cfg.top_k),
        Q_(cfg.capacity_groups(p.tokens)),
        per_group_(std::int64_t{cfg.top_k} *
                   std::max<std::int64_t>(cfg.capacity_group_tokens(p.tokens), 1)),
        cells_(static_cast<std::size_t>(Q_ * ET_)),
        random_second_(cfg.gating.second_expert.policy == second_expert_policy::random &&
                       p.gated.d_second_skipped != nullptr && cfg.top_k > 1) {}

  /// A token's experts (its k ids and R reroute candidates) are distinct, as gating makes
  /// them; ids an engine chose itself may not be (O(T (k + R)), `held` as the stamp of the
  /// last token that named each expert, before anything is written).
  [[nodiscard]] status check_distinct() const {
    return detail::check_distinct(p_, T_, E_, k_, cfg_.reroute_candidates(), w_.held);
  }

  /// Outputs cleared, fates and requests, the valid assignments in priority order, the
  /// capacity, and the grants in that order.
  void grant() {
    requests();
    priority_order();
    capacity();
    // grants in priority order (branch-free: under skew, which of an expert's requests
    // still find room is a coin toss to the branch predictor; every store below rewrites what
    // requests() wrote when there is none)
    for (std::int64_t i = 0; i < m_; ++i) {
      const std::int64_t a = order_[i];
      const std::int32_t e = ids_[a];
      std::int64_t& h = w_.held[group_of(a) * ET_ + e];
      const bool ok = !skipped(a) && room(group_of(a), e);
      o_.d_fate[a] = ok ? fate::kept : fate::dropped;
      o_.d_expert[a] = ok ? e : -1;
      o_.d_slot[a] = ok ? static_cast<std::int32_t>(h) : -1;  // local slot for now
      w_.owns[a] = ok ? 1 : 0;
      h += ok ? 1 : 0;
      o_.d_load[e] += ok ? 1 : 0;
      o_.d_kept[e] += ok ? 1 : 0;
    }
  }

  /// drop_policy::fallback: every dropped assignment tries the fallback expert, in order.
  void fallback() {
    const std::int32_t target = d_.fallback.expert < 0 ? E_ : d_.fallback.expert;
    for (std::int64_t i = 0; i < m_; ++i)
      if (o_.d_fate[order_[i]] == fate::dropped) grant_reroute(order_[i], target);
  }

  /// drop_policy::next_choice: rounds over the dropped assignments in order, each trying its
  /// token's next reroute candidate; stops after a round with no attempt.
  void next_choice() {
    const std::int32_t R = cfg_.reroute_candidates();
    std::fill(w_.next, w_.next + T_, 0);
    for (std::int32_t round = 0; round < R; ++round) {
      bool any = false;
      for (std::int64_t i = 0; i < m_; ++i) {
        const std::int64_t a = order_[i];
        if (o_.d_fate[a] != fate::dropped) continue;
        const std::int64_t t = a / k_;
        if (w_.next[t] >= R) continue;
        any = true;
        grant_reroute(a, p_.gated.d_reroute_ids[t * R + w_.next[t]++]);
      }
      if (!any) break;
      ++totals_.reroute_rounds;
    }
  }

  /// Capacity groups with slot_order::priority: local slots become dense over the batch
  /// (base = earlier groups' holders). One group: every base is 0, the local slots are final.
  void rebase() {
    if (Q_ == 1) return;
    bases();
    for (std::int64_t a = 0; a < n_; ++a)
      if (o_.d_expert[a] >= 0)
        o_.d_slot[a] =
            static_cast<std::int32_t>(w_.base[group_of(a) * ET_ + o_.d_expert[a]] + o_.d_slot[a]);
  }

  /// slot_order::token_index: owners get base + their rank by assignment index; a shared
  /// slot then takes the final slot of its token's owner at that expert (a token owns at most
  /// one slot per expert).
  void renumber() {
    bases();
    std::fill(w_.held, w_.held + cells_, std::int64_t{0});
    for (std::int64_t a = 0; a < n_; ++a) {  // (branch-free, as the grants)
      const bool own = w_.owns[a] != 0;
      const std::int64_t cell = group_of(a) * ET_ + (own ? o_.d_expert[a] : 0);
      const std::int64_t h = w_.held[cell];
      o_.d_slot[a] = own ? static_cast<std::int32_t>(w_.base[cell] + h) : o_.d_slot[a];
      w_.held[cell] = h + (own ? 1 : 0);
    }
    for (std::int64_t a = 0; a < n_; ++a) {
      if (!((w_.owns[a] == 0) & (o_.d_expert[a] >= 0))) continue;  // one branch, rarely taken
      const std::int64_t t0 = a / k_ * k_;
      for (std::int64_t b = t0; b < t0 + k_; ++b)
        if (w_.owns[b] && o_.d_expert[b] == o_.d_expert[a]) o_.d_slot[a] = o_.d_slot[b];
    }
  }

  /// Per-expert counts (every valid assignment was requested of its first choice and is kept
  /// there, rerouted from it or dropped, so the drops follow from the other counts), the
  /// combine weights (the reference's arithmetic, in rank order) and the totals.
  void finalize() {
    for (std::int32_t e = 0; e < E_; ++e) {
      o_.d_dropped[e] = o_.d_requested[e] - o_.d_kept[e] - o_.d_rerouted[e];
      totals_.kept += o_.d_kept[e];
      totals_.rerouted += o_.d_rerouted[e];
      totals_.dropped += o_.d_dropped[e];
    }
    const float* gates = p_.gated.d_gates;
    if (cfg_.gating.renorm == renormalize::after_drop) {
      for (std::int64_t t = 0; t < T_; ++t)
        renormalized_weights(cfg_, o_.d_fate + t * k_, gates + t * k_, o_.d_weight + t * k_);
    } else {
      for (std::int64_t a = 0; a < n_; ++a)
        o_.d_weight[a] = holds_row(o_.d_fate[a]) ? gates[a] : 0.0f;
    }
    *o_.d_totals = totals_;
  }

 private:
  [[nodiscard]] bool valid(std::int64_t t) const {
    return p_.d_valid == nullptr || p_.d_valid[t] != 0;
  }
  // (64-bit divisions are costly: the common cases avoid them)
  [[nodiscard]] bool skipped(std::int64_t a) const {
    return random_second_ && a % k_ == 1 && p_.gated.d_second_skipped[a / k_] != 0;
  }
  [[nodiscard]] std::int64_t group_of(std::int64_t a) const { return Q_ == 1 ? 0 : a / per_group_; }
  [[nodiscard]] bool room(std::int64_t q, std::int32_t e) const {
    const std::int64_t cap = e < E_ ? C_ : totals_.fallback_capacity;
    return cap < 0 || w_.held[q * ET_ + e] < cap;
  }
  void take(std::int64_t a, std::int32_t e) {  // o.d_slot: local slot for now
    std::int64_t& h = w_.held[group_of(a) * ET_ + e];
    o_.d_expert[a] = e;
    o_.d_slot[a] = static_cast<std::int32_t>(h++);
    w_.owns[a] = 1;
    ++o_.d_load[e];
  }
  [[nodiscard]] std::int32_t held_slot(std::int64_t t, std::int32_t e) const {
    for (std::int32_t j = 0; j < k_; ++j)
      if (o_.d_expert[t * k_ + j] == e) return o_.d_slot[t * k_ + j];
    return -1;
  }
  void grant_reroute(std::int64_t a, std::int32_t target) {
    const std::int64_t t = a / k_;
    const std::int32_t shared = held_slot(t, target);
    if (shared < 0 && !room(group_of(a), target)) return;
    o_.d_fate[a] = fate::rerouted;
    if (shared >= 0) {
      o_.d_expert[a] = target;
      o_.d_slot[a] = shared;
    } else {
      take(a, target);
    }
    ++o_.d_received[target];
    ++o_.d_rerouted[ids_[a]];
  }

  /// Outputs cleared; fates; requests; the valid assignments in the base order.
  void requests() {
    std::fill(o_.d_requested, o_.d_requested + E_, std::int64_t{0});
    std::fill(o_.d_kept, o_.d_kept + E_, std::int64_t{0});
    std::fill(o_.d_rerouted, o_.d_rerouted + E_, std::int64_t{0});
    std::fill(o_.d_received, o_.d_received + ET_, std::int64_t{0});
    std::fill(o_.d_load, o_.d_load + ET_, std::int64_t{0});
    std::fill(w_.held, w_.held + cells_, std::int64_t{0});
    const auto visit = [&](std::int64_t a, std::int64_t t) {
      o_.d_expert[a] = -1;
      o_.d_slot[a] = -1;
      o_.d_weight[a] = 0.0f;
      w_.owns[a] = 0;
      if (!valid(t)) {
        o_.d_fate[a] = fate::masked;
        ++totals_.masked;
        return;
      }
      o_.d_fate[a] = fate::dropped;
      ++o_.d_requested[ids_[a]];
      w_.order[m_++] = static_cast<std::int32_t>(a);
    };
    if (d_.prio == priority::choice_major) {
      for (std::int32_t j = 0; j < k_; ++j)
        for (std::int64_t t = 0; t < T_; ++t) visit(t * k_ + j, t);
    } else {
      for (std::int64_t t = 0; t < T_; ++t)
        for (std::int32_t j = 0; j < k_; ++j) visit(t * k_ + j, t);
    }
  }

  /// The priority order: radix by the 32-bit value key, then by choice rank, then by group.
  void priority_order() {
    order_ = w_.order;
    std::int32_t* spare = w_.scratch;
    if (keyed_priority(cfg_)) {
      for (std::int64_t i = 0; i < m_; ++i) w_.key[i] = priority_key(cfg_, p_, order_[i]);
      // the three digit histograms in one read of the keys; a pass whose digit is the same
      // for every key would move nothing (the sort is stable), so it is skipped
      constexpr std::int64_t D = radix_digits;
      constexpr std::uint32_t mask = D - 1;
      std::int64_t* hist = w_.histogram;  // [radix_passes][D + 1], counts at digit + 1
      std::fill(hist, hist + radix_passes * (D + 1), std::int64_t{0});
      for (std::int64_t i = 0; i < m_; ++i)
        for (int pass = 0; pass < radix_passes; ++pass)
          ++hist[pass * (D + 1) + ((w_.key[i] >> (pass * radix_bits)) & mask) + 1];
      std::uint32_t* key = w_.key;
      std::uint32_t* key_spare = w_.key_scratch;
      for (int pass = 0; pass < radix_passes && m_ > 0; ++pass) {
        const int shift = pass * radix_bits;
        std::int64_t* count = hist + pass * (D + 1);
        if (count[((key[0] >> shift) & mask) + 1] == m_) continue;
        for (std::int64_t dg = 0; dg < D; ++dg) count[dg + 1] += count[dg];
        for (std::int64_t i = 0; i < m_; ++i) {
          const std::int64_t to = count[(key[i] >> shift) & mask]++;
          spare[to] = order_[i];
          key_spare[to] = key[i];
        }
        std::swap(order_, spare);
        std::swap(key, key_spare);
      }
    }
    if (d_.prio == priority::batch_prioritized && k_ > 1) {
      counting_pass(
          m_, k_, w_.histogram,
          [&](std::int64_t i) { return static_cast<std::int64_t>(order_[i] % k_); },
          [&](std::int64_t i, std::int64_t to) { spare[to] = order_[i]; });
      std::swap(order_, spare);
    }
    if (Q_ > 1) {
      counting_pass(
          m_, Q_, w_.histogram, [&](std::int64_t i) { return group_of(order_[i]); },
          [&](std::int64_t i, std::int64_t to) { spare[to] = order_[i]; });
      std::swap(order_, spare);
    }
  }

  /// The capacity (capacity_mode::max_load: from the largest queue per group and expert).
  void capacity() {
    std::int64_t max_load = 0;
    if (capacity_needs_loads(cfg_)) {
      for (std::int64_t i = 0; i < m_; ++i) {
        const std::int64_t a = order_[i];
        if (skipped(a)) continue;
        max_load = std::max(max_load, ++w_.held[group_of(a) * ET_ + ids_[a]]);
      }
      std::fill(w_.held, w_.held + cells_, std::int64_t{0});
    }
    C_ = expert_capacity(cfg_, T_, max_load);
    totals_.capacity = C_;
    totals_.fallback_capacity = cfg_.has_dedicated_fallback() ? d_.fallback.capacity : 0;
  }

  /// base[q, e]: the first slot of group q at expert e (earlier groups' holders).
  void bases() {
    for (std::int32_t e = 0; e < ET_; ++e) {
      std::int64_t b = 0;
      for (std::int64_t q = 0; q < Q_; ++q) {
        w_.base[q * ET_ + e] = b;
        b += w_.held[q * ET_ + e];
      }
    }
  }

  const routing_config& cfg_;
  const dispatch_params& p_;
  const dispatch_space& w_;
  const dispatch_config& d_;
  const dispatch_result& o_;
  const std::int32_t* ids_;
  std::int64_t T_;
  std::int32_t k_, E_, ET_;
  std::int64_t n_, Q_, per_group_;
  std::size_t cells_;
  bool random_second_;
  dispatch_totals totals_{};
  std::int64_t m_ = 0;             ///< valid assignments
  std::int32_t* order_ = nullptr;  ///< them, in priority order
  std::int64_t C_ = 0;             ///< the capacity
};

}  // namespace detail

namespace detail {
[[nodiscard]] inline status dispatch_counted(const routing_config& cfg, const dispatch_params& p,
                                             void* workspace, std::size_t workspace_bytes,
                                             const executor& ex);
}  // namespace detail

/// @brief Capacity assignment for a batch on the CPU: bit-identical to reference::dispatch
///        (fates, experts, slots, counts, totals and weights), with the params of
///        cuda::dispatch (host pointers).
/// @param workspace at least dispatch_workspace_bytes(cfg, p.tokens) bytes, 8-byte aligned
/// @param ex        runs the selection path's tasks (keeps_by_selection: over tokens, then over
///                  the over-subscribed experts); the ordered path runs on the calling thread
/// @return success; invalid_* naming the field (validate()); unsupported beyond 2^31 - 2
///         assignments; workspace_too_small.
/// @note Synchronous; never allocates or throws. T = 0: success, nothing written. Grants in
///       priority order per expert (ties: lower token, then lower choice rank), reroutes in
///       the same order group by group, slots dense per expert over the capacity groups.
[[nodiscard]] inline status dispatch(const routing_config& cfg, const dispatch_params& p,
                                     void* workspace, std::size_t workspace_bytes,
                                     const executor& ex = {}) {
  if (p.d_token_count != nullptr)
    return detail::dispatch_counted(cfg, p, workspace, workspace_bytes, ex);
  if (auto s = detail::validate_shapes(cfg, p); !s) return s;
  // the selection path checks the values in its parallel pass, the ordered one first
  const bool select = detail::keeps_by_selection(cfg, p.tokens);
  if (!select)
    if (auto s = detail::validate_values(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  if (auto s = param_checks::validate_workspace("dispatch", "dispatch_workspace_bytes", p.tokens,
                                                dispatch_workspace_bytes(cfg, p.tokens), workspace,
                                                workspace_bytes);
      !s)
    return s;
  workspace_carver carver(workspace, workspace_bytes);
  const detail::dispatch_space w = detail::carve_dispatch_space(carver, cfg, p.tokens);
  if (select) {
    if (detail::count_rows(cfg) > 1 ? detail::dispatch_by_selection<true>(cfg, p, w.selection, ex)
                                    : detail::dispatch_by_selection<false>(cfg, p, w.selection, ex))
      return status::success();
    // bad input, nothing written: the serial checks name it
    if (auto s = detail::validate_values(cfg, p); !s) return s;
    if (auto s =
            detail::check_distinct(p, p.tokens, cfg.num_experts, cfg.top_k, 0, w.selection.counts);
        !s)
      return s;
    return status::make(status_code::invalid_argument, "gated: a value cpu::dispatch rejects");
  }

  detail::dispatch_run run(cfg, p, w);
  if (auto s = run.check_distinct(); !s) return s;
  run.grant();
  if (cfg.dispatch.dropped == drop_policy::fallback) run.fallback();
  if (cfg.dispatch.dropped == drop_policy::next_choice) run.next_choice();
  if (cfg.dispatch.slots == slot_order::token_index) {
    run.renumber();
  } else {
    run.rebase();
  }
  run.finalize();
  return status::success();
}

namespace detail {

/// dispatch with p.d_token_count = n: dispatch of the first n tokens (C of n tokens), rows
/// [n, T) masked and counted as masked.
[[nodiscard]] inline status dispatch_counted(const routing_config& cfg, const dispatch_params& p,
                                             void* workspace, std::size_t workspace_bytes,
                                             const executor& ex) {
  if (auto s = validate_shapes(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  const std::int64_t n = *p.d_token_count;
  if (auto s = param_checks::validate_host_count("d_token_count", n, p.tokens); !s) return s;
  dispatch_params first = p;
  first.tokens = n;
  first.d_token_count = nullptr;
  if (n > 0)
    if (auto s = cpu::dispatch(cfg, first, workspace, workspace_bytes, ex); !s) return s;
  const dispatch_result& o = p.out;
  if (n == 0) {  // dispatch of no tokens writes nothing; this call writes every output
    const std::int32_t E = cfg.num_experts, ET = cfg.total_experts();
    std::fill(o.d_requested, o.d_requested + E, std::int64_t{0});
    std::fill(o.d_kept, o.d_kept + E, std::int64_t{0});
    std::fill(o.d_rerouted, o.d_rerouted + E, std::int64_t{0});
    std::fill(o.d_dropped, o.d_dropped + E, std::int64_t{0});
    std::fill(o.d_received, o.d_received + ET, std::int64_t{0});
    std::fill(o.d_load, o.d_load + ET, std::int64_t{0});
    *o.d_totals = dispatch_totals{};
    o.d_totals->capacity = expert_capacity(cfg, 0);
    o.d_totals->fallback_capacity =
        cfg.has_dedicated_fallback() ? cfg.dispatch.fallback.capacity : 0;
  }
  const std::int64_t k = cfg.top_k;
  for (std::int64_t a = n * k; a < p.tokens * k; ++a) {
    o.d_expert[a] = -1;
    o.d_slot[a] = -1;
    o.d_weight[a] = 0.0f;
    o.d_fate[a] = fate::masked;
  }
  o.d_totals->masked += (p.tokens - n) * k;
  return status::success();
}

}  // namespace detail

}  // namespace moeroute::cpu
