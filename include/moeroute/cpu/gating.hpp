// SPDX-License-Identifier: Apache-2.0
// CPU backend: fused gating. Router logits [T, E] (float, half_bits or bf16_bits) -> top-k
// expert ids and gates, reroute candidates, logsumexp (when asked for) and the loss sums: the
// operation and params of cuda::gating, one pass over each row. Formulas in docs/numerics.md
// ("Gating").
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include <moeroute/config.hpp>
#include <moeroute/cpu/detail/gating_plan.hpp>
#include <moeroute/cpu/detail/math.hpp>
#include <moeroute/cpu/detail/select.hpp>
#include <moeroute/cpu/detail/select_columns.hpp>
#include <moeroute/cpu/detail/token_columns.hpp>
#include <moeroute/cpu/element.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/macros.hpp>
#include <moeroute/params/gating.hpp>
#include <moeroute/rng.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>
#include <moeroute/workspace.hpp>

namespace moeroute::cpu {

using moeroute::gating_params;

/// @brief Checks config, shape and pointers of a gating call (and that the bias is finite);
///        names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const gating_params<Element>& p) {
  static_assert(is_element_v<Element>, "Element must be float, half_bits or bf16_bits");
  if (auto s = check_params(cfg, p); !s) return s;
  if (p.tokens > 0 && p.replay.active())
    if (auto s = check_replay_ids(cfg, p.replay.d_ids, p.tokens, "replay.d_ids"); !s) return s;
  if (p.tokens > 0 && cfg.gating.expert_bias)
    for (std::int32_t e = 0; e < cfg.num_experts; ++e)
      if (!std::isfinite(p.d_bias[e]))
        return status::make(status_code::invalid_argument,
                            "d_bias[" + std::to_string(e) + "] is not finite");
  return status::success();
}

namespace detail {

MOEROUTE_PRECISE_FP_BEGIN
/// x + scale * z, sanitised, rounded as the reference rounds it: no fma, whatever the consumer's
/// -ffp-contract (a fused multiply-add would move the noisy logit by an ulp, and with it ties
/// and the gates of noisy selection).
[[nodiscard]] inline float noisy_logit(float x, float scale, float z) noexcept {
  return math::sanitize(x + scale * z);
}
MOEROUTE_PRECISE_FP_END

/// Tokens a task takes through each step of gating_agent side by side (a tile): one token's
/// steps are chains of dependent reductions (max, exp and sum, log, the selection's threshold
/// and ranks), and those of neighbouring tokens overlap in the core only when they sit next to
/// each other in the instruction stream. Rows up to 256 (measured at T = 16384 on a Zen 5
/// core: DeepSeek-V3 (256) 7 % faster with 4 than with 1, 8 slower than 4; on the Zen 4 core
/// of earlier sessions 256 gained nothing); longer rows' tile scratch would crowd L1.
[[nodiscard]] constexpr std::int32_t gating_tile(std::int32_t E) noexcept {
  return E <= 256 ? 4 : 1;
}

/// True when the sanitised logits and their exps (scratch rows x and ex) are read by no step
/// after prepare: softmax scores made before the top-k and selected from (Qwen3, OLMoE), so
/// finish reads P and the gates from the P row alone. Then tokens of a tile can share four
/// x / ex rows (the tile's first four slots') and touch a third of the scratch.
[[nodiscard]] inline bool scratch_dies_in_prepare(const routing_config& cfg) noexcept {
  const auto& g = cfg.gating;
  return g.score == score_function::softmax && g.stage != softmax_stage::after_topk &&
         g.select == select_from::scores;
}

/// True when a tile's top-k is selected across its tokens at once (select_columns.hpp): AVX-512,
/// 2 to 8 candidates per token from rows a multiple of 16 wide, up to E = 64 (measured at
/// T = 16384: OLMoE (64, 8) 20 % and Megatron (64, 2) 4 % faster. At E = 128 the selection
/// itself is 0.3 ns per logit faster for Qwen3, but the other steps of a 16-token tile are as
/// much slower, shared x / ex rows or not; at 256 row by row is faster, a row's threshold
/// leaving little to rank).
[[nodiscard]] inline bool selects_by_columns(const routing_config& cfg) noexcept {
#if defined(MOEROUTE_CPU_SELECT_COLUMNS)
  const std::int32_t n = cfg.candidates_per_token(), E = cfg.num_experts;
  return n >= 2 && n <= column_places && E % 16 == 0 && E <= 64;
#else
  (void)cfg;
  return false;
#endif
}

/// The tile of a config: a register's worth of tokens (16) when they are selected by columns.
[[nodiscard]] inline std::int32_t gating_tile(const routing_config& cfg) noexcept {
  return selects_by_columns(cfg) ? column_rows : gating_tile(cfg.num_experts);
}
inline constexpr std::int32_t max_gating_tile = column_rows;

/// One token's place in a tile of a task's workspace: the task's partial sums and the tile
/// slot's rows of scratch.
struct gating_task_space {
  double* scores;          // [E] sum of P over the task's valid tokens
  std::int64_t* counts;    // [E] aux counts
  double* z;               // [1] sum of logsumexp^2
  std::int64_t* valid;     // [1] valid tokens
  std::int64_t* bad;       // [1] non-finite logits
  std::int64_t* replaced;  // [1] replayed slots the filter gave back
  float* x;                // [E] sanitised logits
  float* ex;               // [E] exp(x - max)
  float* p;                // [E] softmax of the clean logits / normalised scores (aux P)
  float* xn;               // [E] noisy logits
  float* gate_scores;      // [E] scores the gates are taken from
  float* sel;              // [E] selection values
  std::uint8_t* allowed;   // [E] group limit mask
  std::int32_t* order;     // [E] selection ids for large k, group-limit scratch
  std::int64_t* keys;      // [key_capacity(E)] selection keys
  float* gathered;         // [E] the kept groups' selection values side by side
};

/// The gating workspace: per-task partials and per-slot scratch rows, carved in one fixed
/// sequence. Each task's part of every array starts task_gap_bytes after its neighbour's
/// (strides padded, cpu/parallel.hpp): tasks on different threads update their partials every
/// token.
struct gating_space {
  std::int32_t experts = 0;
  std::int32_t tile = 1;
  double* scores = nullptr;          // [tasks, partial_stride]: E used
  std::int64_t* counts = nullptr;    // [tasks, partial_stride]
  double* z = nullptr;               // [tasks, scalar_stride]: 1 used
  std::int64_t* valid = nullptr;     // [tasks, scalar_stride]
  std::int64_t* bad = nullptr;       // [tasks, scalar_stride]
  std::int64_t* replaced = nullptr;  // [tasks, scalar_stride]
  float* rows = nullptr;             // [tasks, rows_stride]: tile * 7 * E used
  std::uint8_t* allowed = nullptr;   // [tasks, allowed_stride]: tile * E used
  std::int32_t* order = nullptr;     // [tasks, order_stride]: tile * E used
  std::int64_t* keys = nullptr;      // [tasks, keys_stride]: tile * key_capacity(E) used

  [[nodiscard]] std::size_t slot_elements() const noexcept {
    return static_cast<std::size_t>(tile) * static_cast<std::size_t>(experts);
  }
  [[nodiscard]] std::size_t partial_stride() const noexcept {
    return task_stride<double>(static_cast<std::size_t>(experts));
  }
  [[nodiscard]] static std::size_t scalar_stride() noexcept { return task_stride<double>(1); }
  [[nodiscard]] std::size_t rows_stride() const noexcept {
    return task_stride<float>(7 * slot_elements());
  }
  [[nodiscard]] std::size_t allowed_stride() const noexcept {
    return task_stride<std::uint8_t>(slot_elements());
  }
  [[nodiscard]] std::size_t order_stride() const noexcept {
    return task_stride<std::int32_t>(slot_elements());
  }
  [[nodiscard]] std::size_t keys_stride() const noexcept {
    return task_stride<std::int64_t>(static_cast<std::size_t>(tile) *
                                     static_cast<std::size_t>(key_capacity(experts)));
  }

  /// Task i's scratch rows as one block of 7 * tile * E floats (the token columns' scratch).
  [[nodiscard]] float* task_rows(std::int64_t i) const noexcept {
    return rows + static_cast<std::size_t>(i) * rows_stride();
  }

  /// Task i's partials with the scratch of its tile slot `slot`.
  [[nodiscard]] gating_task_space task(std::int64_t i, std::int32_t slot) const noexcept {
    const std::size_t e = static_cast<std::size_t>(experts), u = static_cast<std::size_t>(i);
    const std::size_t w = static_cast<std::size_t>(slot);
    float* r = rows + u * rows_stride() + w * 7 * e;
    const std::size_t one = scalar_stride();
    return {scores + u * partial_stride(),
            counts + u * partial_stride(),
            z + u * one,
            valid + u * one,
            bad + u * one,
            replaced + u * one,
            r,
            r + e,
            r + 2 * e,
            r + 3 * e,
            r + 4 * e,
            r + 5 * e,
            allowed + u * allowed_stride() + w * e,
            order + u * order_stride() + w * e,
            keys + u * keys_stride() + w * static_cast<std::size_t>(key_capacity(experts)),
            r + 6 * e};
  }
};

/// Carves (or, with a sizing carver, sizes) the gating workspace.
inline gating_space carve_gating_space(workspace_carver& w, const gating_plan& plan,
                                       const routing_config& cfg) {
  const std::int32_t E = cfg.num_experts;
  const std::size_t n = static_cast<std::size_t>(plan.tasks);
  gating_space s;
  s.experts = E;
  s.tile = gating_tile(cfg);
  s.scores = w.take<double>(n * s.partial_stride());
  s.counts = w.take<std::int64_t>(n * s.partial_stride());
  s.z = w.take<double>(n * s.scalar_stride());
  s.valid = w.take<std::int64_t>(n * s.scalar_stride());
  s.bad = w.take<std::int64_t>(n * s.scalar_stride());
  s.replaced = w.take<std::int64_t>(n * s.scalar_stride());
  s.rows = w.take<float>(n * s.rows_stride());
  s.allowed = w.take<std::uint8_t>(n * s.allowed_stride());
  s.order = w.take<std::int32_t>(n * s.order_stride());
  s.keys = w.take<std::int64_t>(n * s.keys_stride());
  return s;
}

/// What one token carries from one step of gating_agent to the next.
struct token_state {
  std::int64_t t = 0;      // the token
  std::int64_t q = 0;      // its sequence (0 without sequences)
  float m = 0.0f;          // the max of its sanitised logits
  double sum = 0.0;        // the sum of exp(x - m) (softmax scores, or a logsumexp asked for)
  float lse = 0.0f;        // its logsumexp (when asked for)
  float score_sum = 0.0f;  // sum_row_f32 of its scores (fused_sigmoid)
  const float* gate_logits = nullptr;
  const float* gate_scores = nullptr;
  const float* sel = nullptr;             // the selection values
  const std::uint8_t* allowed = nullptr;  // the group limit's mask (null: all)
  std::int32_t kept_groups = 0;           // > 0: sel holds these groups of the row (gathered)
  std::int32_t kept[16];                  // the kept groups, in increasing order
  std::int32_t* ids = nullptr;            // the k + R chosen, best first: `chosen` or scratch
  std::int32_t chosen[select_small_max];
};

/// The per-token steps shared by every task: what reference::gating does for one token, with
/// the vectorised row kernels of math.hpp, cut where a tile of tokens goes through side by side
/// (load, exponentiate, normalize: step 1; prepare: the scores and selection values, steps 2-4;
/// select: the top-k, 5; finish: gates and aux, 6-7).
template <class Element>
struct gating_agent {
  const routing_config& cfg;
  const gating_params<Element>& p;
  std::int32_t E, k, R, G, per_group;
  std::size_t row_bytes;  // of one token's logits
  bool softmax_score, softmax_after, noise, noisy_gates, wants_priority, random_second;
  bool sampling;       // NLLB's second expert by Gumbel sampling (a writable selection row)
  bool wants_lse;      // the logsumexp is written or summed (per-expert scores skip its exp pass)
  bool aux;            // an aux-loss output is asked for (false: the inference path, no P pass)
  bool fused_sigmoid;  // load makes x, the sigmoid scores, sel (+ bias) and their sum in one pass
  bool defer_p;        // P is made in the aux pass: nothing reads it, or overwrites s.ex, before
  bool gathers;        // the group limit's kept groups are copied side by side and selected from
  bool replay;         // the selection is replayed (select_replayed, row by row)
  bool columns;        // tiles of 8 tokens take the token columns (gate_columns)
  double log_ratio;    // the replay filter's threshold (softmax)

  gating_agent(const routing_config& c, const gating_params<Element>& params) : cfg(c), p(params) {
    const auto& g = cfg.gating;
    E = cfg.num_experts;
    row_bytes = static_cast<std::size_t>(E) * sizeof(Element);
    k = cfg.top_k;
    R = cfg.reroute_candidates();
    G = g.group_limit.groups > 1 ? g.group_limit.groups : 1;
    per_group = E / G;
    softmax_score = g.score == score_function::softmax;
    softmax_after = softmax_score && g.stage == softmax_stage::after_topk;
    noise = cfg.noise_active();
    noisy_gates = noise && g.noise.target == noise_target::selection_and_gates;
    wants_priority = cfg.dispatch.prio == priority::batch_prioritized;
    random_second = g.second_expert.policy == second_expert_policy::random;
    sampling = g.second_expert.policy == second_expert_policy::sampling;
    wants_lse = p.out.d_logsumexp != nullptr || p.out.sums.d_z_sum_squares != nullptr;
    aux = wants_aux_inputs(cfg, p.out);
#if defined(MOEROUTE_CPU_FUSED_SIGMOID)
    fused_sigmoid = g.score == score_function::sigmoid && !noise &&
                    g.select == select_from::scores && !sampling && E % 16 == 0;
#else
    fused_sigmoid = false;
#endif
    // (the group limit takes s.ex as scratch, and so do scores of noisy logits)
    defer_p = softmax_after && G == 1 && !(noise && g.select == select_from::scores);
    replay = p.replay.active();
    log_ratio = replay_log_ratio(p.replay.min_score_ratio);
    // (a selection over half the row with no mask: DeepSeek-V3 keeps 4 of 8 groups; a replay
    // takes the mask, which it opens and closes per expert)
    gathers =
        G > 1 && group_limit_by_top2(cfg, E, G) && !sampling && !selects_by_columns(cfg) && !replay;
    // softmax and sigmoid rows of whole registers where the columns pay (columns::pays; at 256 the
    // columns' scratch crowds L1: 5-15 % slower than rows, measured), up to 8 choices, none of the
    // per-token aux rows, and nothing that makes a token's steps differ from the plain score
    // function's (the columns' 3 * 8 * E floats of scratch are the task's 7 * tile * E of row
    // scratch)
#if defined(MOEROUTE_CPU_TOKEN_COLUMNS)
    columns = (softmax_score || g.score == score_function::sigmoid) && !noise &&
              !(g.expert_bias && softmax_score) && G == 1 && !sampling && !random_second &&
              !replay && R == 0 && k <= columns::max_choices && E % columns::lanes == 0 &&
              columns::pays(E) && !(softmax_after && g.select == select_from::scores) &&
              p.out.d_aux_scores == nullptr && p.out.d_aux_count_ids == nullptr &&
              7 * gating_tile(cfg) >= 3 * columns::lanes;
#else
    columns = false;
#endif
  }

  /// scores of n values under the configured (per-expert or softmax) score function
  void scores(const float* x, float m, float* ex_scratch, float* out) const {
    switch (cfg.gating.score) {
      case score_function::softmax:
        math::normalize_row(ex_scratch, E, math::exp_row(x, E, m, ex_scratch), out);
        return;
      case score_function::sigmoid:
        math::sigmoid_row(x, E, out);
        return;
      case score_function::sqrt_softplus:
        for (std::int32_t e = 0; e < E; ++e) out[e] = score_one(x[e]);
        return;
    }
  }

  /// one value under a per-expert score function (the reference's formulas, libm)
  float score_one(float x) const {
    switch (cfg.gating.score) {
      case score_function::sigmoid:
        return 1.0f / (1.0f + std::exp(-x));
      case score_function::sqrt_softplus: {
        const float sp = x > 0.0f ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
        return std::sqrt(sp);
      }
      case score_function::softmax:
        break;
    }
    return x;
  }

  /// the max of a row (softmax only: the per-expert scores do not need it)
  float max_of(const float* v) const {
    return cfg.gating.score == score_function::softmax ? math::max_row(v, E) : 0.0f;
  }

  // 1. sanitise, exp(x - max), logsumexp; aux P (softmax of the clean logits) too when it is
  //    the gate score (clean gates taken before the top-k), else the aux pass (7) makes it
  void load(const gating_task_space& s, token_state& st) const {
    // the row eight tokens on asked for now (rows of 256 bytes and more): the hardware's
    // stream prefetch alone leaves the first touch of each row waiting on memory (at
    // T = 16384 about a tenth of Qwen3's gating was that load; 8 rows on: Qwen3 -4 %, Switch
    // -8 %, DeepSeek-V3 as with 2; 4 and 16 measured no better)
    constexpr std::int64_t ahead_rows = 8;
    if (row_bytes >= 256 && st.t + ahead_rows < p.tokens) {
      const auto* ahead = reinterpret_cast<const char*>(p.d_logits + (st.t + ahead_rows) * E);
      for (std::size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(ahead + b);
    }
#if defined(MOEROUTE_CPU_FUSED_SIGMOID)
    if (fused_sigmoid) {
      st.m = math::sigmoid_row_fused(p.d_logits + st.t * E, E,
                                     cfg.gating.expert_bias ? p.d_bias : nullptr, s.x,
                                     s.gate_scores, s.sel, *s.bad, st.score_sum);
      return;
    }
#endif
    st.m = math::load_row(p.d_logits + st.t * E, E, s.x, *s.bad);
  }
  void exponentiate(const gating_task_space& s, token_state& st) const {
    // (DeepSeek-V3 without a z-loss: a fifth of its gating was this pass, measured)
    if (softmax_score || wants_lse) st.sum = math::exp_row(s.x, E, st.m, s.ex);
  }
  void normalize(const gating_task_space& s, token_state& st) const {
    if (wants_lse) {
      st.lse = static_cast<float>(static_cast<double>(st.m) + math::log(st.sum));
      if (p.out.d_logsumexp != nullptr) p.out.d_logsumexp[st.t] = st.lse;
    }
    if (softmax_score && !defer_p) math::normalize_row(s.ex, E, st.sum, s.p);
  }

  // 3. gate scores and selection values (+ bias) from gate_logits and xn (the noisy logits
  //    where noise is on); gate_scores comes in as s.gate_scores
  void select_values(const gating_task_space& s, const float* gate_logits, const float* xn,
                     const float*& gate_scores, const float*& sel) const {
    const auto& g = cfg.gating;
    if (softmax_after) {
      // the reference leaves its score row at 0 here; only these two read it
      if (random_second || g.select == select_from::scores)
        std::fill(s.gate_scores, s.gate_scores + E, 0.0f);
    } else if (softmax_score && !noisy_gates) {
      gate_scores = s.p;
    } else {
      scores(gate_logits, max_of(gate_logits), s.ex, s.gate_scores);
    }
    if (g.select == select_from::scores) {
      if (noise && !noisy_gates) {
        scores(xn, max_of(xn), s.ex, s.sel);
        sel = s.sel;
      } else {
        sel = gate_scores;
      }
    } else {
      sel = xn;
    }
    if (g.expert_bias) {  // + bias into the writable row (in place when sel is that row)
      for (std::int32_t e = 0; e < E; ++e) s.sel[e] = math::sanitize(sel[e] + p.d_bias[e]);
      sel = s.sel;
    } else if (sampling) {  // a writable copy
      if (sel != s.sel) std::copy(sel, sel + E, s.sel);
      sel = s.sel;
    }
  }

  void prepare(const gating_task_space& s, token_state& st) const {
    const auto& g = cfg.gating;
    const std::int64_t t = st.t;
    float* x = s.x;

    // 2. noise (Philox per (token, expert)), re-sanitised
    const float* gate_logits = x;
    if (noise) {
      for (std::int32_t e = 0; e < E; ++e) {
        const float z = rng::gating_noise(g.noise.seed, g.noise.offset,
                                          g.noise.kind == noise_kind::gaussian, t, E, e);
        s.xn[e] = noisy_logit(x[e], g.noise.scale, z);
      }
      if (noisy_gates) gate_logits = s.xn;
    }
    const float* xn = noise ? s.xn : x;

    // 3. gate scores and selection values (+ bias): made in load when fused
    const float* gate_scores = s.gate_scores;
    const float* sel = nullptr;
    if (fused_sigmoid) {
      sel = g.expert_bias ? s.sel : s.gate_scores;
    } else {
      select_values(s, gate_logits, xn, gate_scores, sel);
    }

    // 4. group limit: the kept groups gathered, or a mask
    const std::uint8_t* allowed = nullptr;
    st.kept_groups = 0;
    if (gathers) {
      st.kept_groups = group_kept_top2(cfg, sel, G, per_group, st.kept);
      gather_groups(sel, per_group, st.kept, st.kept_groups, s.gathered);
      sel = s.gathered;
    } else if (G > 1) {
      group_mask(cfg, sel, E, G, s.ex, s.order, s.keys, s.allowed);
      allowed = s.allowed;
    }
    // 4b. NLLB sampling: the first choice stays (pinned to FLT_MAX), the others by x + Gumbel
    if (sampling) {
      std::int32_t first[1];
      top_n(sel, E, allowed, 1, nullptr, first, s.keys);
      for (std::int32_t e = 0; e < E; ++e) {
        if (e == first[0]) {
          s.sel[e] = FLT_MAX;
          continue;
        }
        s.sel[e] =
            math::sanitize(x[e] + rng::second_expert_gumbel(g.second_expert.seed,
                                                            g.second_expert.offset, t, E, e));
      }
    }

    st.gate_logits = gate_logits;
    st.gate_scores = gate_scores;
    st.sel = sel;
    st.allowed = allowed;
  }

  // the length of a token's selection row: the kept groups' when gathered
  std::int32_t size_of(const token_state& st) const {
    return st.kept_groups > 0 ? st.kept_groups * per_group : E;
  }

  // 5. top-k (+ R), best first, ties to the lower index
  void select(const gating_task_space& s, token_state& st) const {
    const std::int32_t n = k + R;
    std::int32_t* ids = n <= select_small_max ? st.chosen : s.order;
    top_n(st.sel, size_of(st), st.allowed, n, nullptr, ids, s.keys);
    if (st.kept_groups > 0) ungather_ids(per_group, st.kept, n, ids);
    write_ids(st, ids);
  }
  // the same for the `count` tokens of a tile: four rows side by side by a threshold where
  // top_n takes that path (the rows' chains of dependent steps overlap), else row by row; the
  // same ids either way
  void select_tile(const gating_task_space* s, token_state* st, std::int32_t count) const {
#if defined(MOEROUTE_CPU_SELECT_ROWS)
    constexpr std::int32_t rows = 4;
    const std::int32_t n = k + R, size = size_of(st[0]);
    if (count == rows && n >= 3 && n <= select_small_max && size >= 32) {
      const float* v[rows];
      const std::uint8_t* allowed[rows];
      std::int32_t* ids[rows];
      bool ok[rows];
      for (std::int32_t r = 0; r < rows; ++r) {
        v[r] = st[r].sel;
        allowed[r] = st[r].allowed;
        ids[r] = st[r].chosen;
      }
      top_n_rows_by_threshold<rows>(v, allowed, size, n, ids, ok);
      for (std::int32_t r = 0; r < rows; ++r) {
        if (!ok[r]) top_n(st[r].sel, size, st[r].allowed, n, nullptr, st[r].chosen, s[r].keys);
        if (st[r].kept_groups > 0) ungather_ids(per_group, st[r].kept, n, st[r].chosen);
        write_ids(st[r], st[r].chosen);
      }
      return;
    }
#endif
    for (std::int32_t r = 0; r < count; ++r) select(s[r], st[r]);
  }
#if defined(MOEROUTE_CPU_SELECT_COLUMNS)
  // the same for `count` tokens of a tile at once (selects_by_columns)
  void select_columns(token_state* st, std::int32_t count) const {
    const std::int32_t n = k + R;
    const float* rows[column_rows] = {};  // (zeroed: GCC 12 cannot see count <= column_rows)
    const std::uint8_t* allowed[column_rows] = {};
    for (std::int32_t r = 0; r < count; ++r) {
      rows[r] = st[r].sel;
      allowed[r] = st[r].allowed;
    }
    std::int32_t ids[column_rows * column_places];
    top_n_columns(rows, allowed, count, E, n, ids);
    for (std::int32_t r = 0; r < count; ++r) {
      std::copy(ids + r * n, ids + (r + 1) * n, st[r].chosen);
      write_ids(st[r], st[r].chosen);
    }
  }
#endif
  // 5 under replay (moeroute/replay.hpp): the replayed ids in their slots, the best others by
  // the config's rule in the rest, then the R candidates, written out; st.ids points at the
  // written ids. Needs the token's own x row (no shared scratch). Returns the slots given back.
  std::int64_t select_replayed(const gating_task_space& s, token_state& st) const {
    const std::int64_t t = st.t;
    const std::int32_t* r = p.replay.d_ids + t * k;
    std::int32_t* ids = p.out.d_ids + t * k;
    const float ratio = p.replay.min_score_ratio;
    const auto value = [&](std::int32_t e) {  // the filter's value: logit, or score
      return softmax_score ? s.x[e] : score_one(s.x[e]);
    };
    float weakest = 0.0f;
    if (ratio > 0.0f) {
      top_n(st.sel, E, st.allowed, k, nullptr, s.order, s.keys);
      weakest = value(s.order[0]);
      for (std::int32_t j = 1; j < k; ++j) weakest = std::min(weakest, value(s.order[j]));
    }
    std::uint8_t* open = s.allowed;  // the group limit's mask when there is one, else all
    if (st.allowed == nullptr) std::fill(open, open + E, std::uint8_t{1});
    std::int64_t replaced = 0;
    std::int32_t free = 0;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int32_t e = r[j];
      const bool kept = e >= 0 && (ratio <= 0.0f || replay_keeps(softmax_score, value(e), weakest,
                                                                 ratio, log_ratio));
      replaced += e >= 0 && !kept ? 1 : 0;
      ids[j] = kept ? e : -1;
      if (kept) {
        open[e] = 0;
      } else {
        ++free;
      }
    }
    if (free + R > 0) top_n(st.sel, E, open, free + R, nullptr, s.order, s.keys);
    std::int32_t next = 0;
    for (std::int32_t j = 0; j < k; ++j)
      if (ids[j] < 0) ids[j] = s.order[next++];
    for (std::int32_t i = 0; i < R; ++i) p.out.d_reroute_ids[t * R + i] = s.order[next++];
    st.ids = ids;
    return replaced;
  }

  // the chosen ids into the outputs (k routed, then R reroute candidates)
  void write_ids(token_state& st, std::int32_t* ids) const {
    const gating_result& o = p.out;
    const std::int64_t t = st.t;
    for (std::int32_t j = 0; j < k; ++j) o.d_ids[t * k + j] = ids[j];
    for (std::int32_t r = 0; r < R; ++r) o.d_reroute_ids[t * R + r] = ids[k + r];
    st.ids = ids;
  }

  // 6. token t's gates from its chosen experts' gate logits, logit(j), and scores, score(j).
  //    Where they depend on the k chosen experts only (softmax after top-k, and the per-expert
  //    score functions) they are computed with libm's exp, as the reference does, so they are
  //    its bits: priorities that rank by gate then order exactly as it does.
  template <class Logit, class Score>
  void write_gates(std::int64_t t, const Logit& logit, const Score& score) const {
    const auto& g = cfg.gating;
    float* gt = p.out.d_gates + t * k;
    if (softmax_after) {
      float gm = -FLT_MAX;
      for (std::int32_t j = 0; j < k; ++j) gm = std::max(gm, logit(j));
      double gs = 0.0;
      for (std::int32_t j = 0; j < k; ++j) {
        // exp(0) = 1 exactly: the best gate (and any tied with it) needs no libm call
        const float dx = logit(j) - gm;
        gt[j] = dx == 0.0f ? 1.0f : std::exp(dx);
        gs += gt[j];
      }
      for (std::int32_t j = 0; j < k; ++j) gt[j] = static_cast<float>(gt[j] / gs);
    } else {
      for (std::int32_t j = 0; j < k; ++j) gt[j] = score(j);
      if (g.renorm == renormalize::before_drop) {
        float total = 0.0f;
        for (std::int32_t j = 0; j < k; ++j) total += gt[j];
        const float denom = total + g.renorm_epsilon;
        for (std::int32_t j = 0; j < k; ++j) gt[j] = denom > 0.0f ? gt[j] / denom : 0.0f;
      }
    }
    if (g.renorm != renormalize::after_drop)
      for (std::int32_t j = 0; j < k; ++j) gt[j] *= g.scaling_factor;
  }

  void finish(const gating_task_space& s, const token_state& st, bool& is_valid, double* seq_scores,
              std::int64_t* seq_counts) const {
    const auto& g = cfg.gating;
    const gating_result& o = p.out;
    const std::int64_t t = st.t, seq = st.q;
    const float m = st.m;
    const double sum = st.sum;
    const float* x = s.x;
    const float* gate_logits = st.gate_logits;
    const float* gate_scores = st.gate_scores;
    const std::int32_t* ids = st.ids;
    const bool p_early = softmax_score && !defer_p;

    write_gates(
        t, [&](std::int32_t j) { return gate_logits[ids[j]]; },
        [&](std::int32_t j) {
          return softmax_score ? gate_scores[ids[j]] : score_one(gate_logits[ids[j]]);
        });
    if (random_second) {
      const float p2 = softmax_score ? gate_scores[ids[1]] : score_one(gate_logits[ids[1]]);
      const float u = rng::second_expert_uniform(g.second_expert.seed, g.second_expert.offset, t);
      o.d_second_skipped[t] = 2.0f * p2 > u ? 0 : 1;
    }

    // token priority: the top-1 clean score (the largest P for softmax)
    if (wants_priority)
      o.d_token_priority[t] = softmax_score ? static_cast<float>(1.0 / sum) : score_one(m);

    // 7. aux inputs over valid tokens
    is_valid = p.d_valid == nullptr || p.d_valid[t] != 0;
    const std::int32_t counted = cfg.aux_counts_per_token();
    if (!is_valid) {  // the optional per-token outputs: nothing counted
      if (o.d_aux_scores != nullptr)
        std::fill(o.d_aux_scores + t * E, o.d_aux_scores + (t + 1) * E, 0.0f);
      if (o.d_aux_count_ids != nullptr)
        std::fill(o.d_aux_count_ids + t * counted, o.d_aux_count_ids + (t + 1) * counted, -1);
      return;
    }
    *s.z += st.lse * st.lse;  // (0 unless asked for; the sum is then written)
    if (!aux) return;         // the inference path: no P row, nothing counted
    std::int32_t fresh[select_small_max];
    const std::int32_t* count_ids = o.d_ids + t * k;
    // a fresh top-k of P is usually the routed ids (top-k on logits, softmax after): when the
    // routed ids' P are the only values at or above their smallest, they are its set, and
    // counts need only the set — a compare in the aux pass instead of a selection
    const bool fresh_topk = cfg.loss.count_source == aux_count_source::fresh_topk;
    // the P row is stored only for what reads it after the pass (a store per expert is ~3 % of
    // DeepSeek-V3's gating, measured)
    const bool keep_p = seq_scores != nullptr || o.d_aux_scores != nullptr || fresh_topk ||
                        o.d_aux_count_ids != nullptr;
    bool routed_set = false;
    if (softmax_score) {
      // P made (unless made early), added to the task's sums and compared in one sweep; the
      // routed ids' P first, by the same expression, for the compare
      const double inv = 1.0 / sum;
      float least = FLT_MAX;
      if (fresh_topk)
        for (std::int32_t j = 0; j < counted; ++j)
          least = std::min(
              least, p_early ? s.p[count_ids[j]]
                             : static_cast<float>(static_cast<double>(s.ex[count_ids[j]]) * inv));
      const std::int32_t at_least =
          p_early  ? math::aux_row<false, true>(s.ex, E, inv, s.p, s.scores, least)
          : keep_p ? math::aux_row<true, true>(s.ex, E, inv, s.p, s.scores, least)
                   : math::aux_row<true, false>(s.ex, E, inv, s.p, s.scores, least);
      routed_set = fresh_topk && at_least == counted;
    } else {
      // the per-expert scores of the clean logits: the gate scores already, unless noisy;
      // normalised and added to the task's sums in one pass
      const float* clean = gate_scores;
      if (noisy_gates || softmax_after) {
        scores(x, m, s.ex, s.p);
        clean = s.p;
      }
      // (and compared with the routed ids' smallest, made first by the same expression)
      const float denom = (fused_sigmoid ? st.score_sum : math::sum_row_f32(clean, E)) + 1e-20f;
      float least = FLT_MAX;
      if (fresh_topk)
        for (std::int32_t j = 0; j < counted; ++j)
          least = std::min(least, clean[count_ids[j]] / denom);
      const std::int32_t at_least =
          keep_p ? math::aux_quotient_row<true>(clean, E, denom, s.p, s.scores, least)
                 : math::aux_quotient_row<false>(clean, E, denom, s.p, s.scores, least);
      routed_set = fresh_topk && at_least == counted;
    }
    if (seq_scores != nullptr) math::accumulate_row(s.p, E, seq_scores + seq * E);
    if (o.d_aux_scores != nullptr) std::copy(s.p, s.p + E, o.d_aux_scores + t * E);
    if (fresh_topk && !routed_set) {
      std::int32_t* f = counted <= select_small_max ? fresh : s.order;
      top_n(s.p, E, nullptr, counted, nullptr, f, s.keys);
      count_ids = f;
    }
    for (std::int32_t j = 0; j < counted; ++j) {
      ++s.counts[count_ids[j]];
      if (seq_counts != nullptr) ++seq_counts[seq * E + count_ids[j]];
    }
    if (o.d_aux_count_ids != nullptr) {
      std::int32_t* out = o.d_aux_count_ids + t * counted;
      std::copy(count_ids, count_ids + counted, out);
      if (routed_set)  // the set in the routing's order: put it in P's (ties: lower index)
        std::sort(out, out + counted, [&](std::int32_t a, std::int32_t b) {
          return s.p[a] > s.p[b] || (s.p[a] == s.p[b] && a < b);
        });
    }
  }

#if defined(MOEROUTE_CPU_TOKEN_COLUMNS)
  // Steps 1-7 for tokens t0 .. t0 + 7 (no sequences) as token columns (token_columns.hpp):
  // each step's operations in the row path's order, so the same bits, and the task's partial
  // sums taken in token order as finish takes them. scratch: 3 * 8 * E floats, the task's row
  // scratch (slot 0's P row, s.p, is written only once the logits' columns are dead). False,
  // with nothing written, when a logit is not finite: the row path sanitises and counts it.
  [[nodiscard]] bool gate_columns(const gating_task_space& s, float* scratch,
                                  std::int64_t t0) const {
    namespace col = columns;
    constexpr std::int32_t W = col::lanes;
    const auto& g = cfg.gating;
    float* xc = scratch;     // [E, W] sanitised logits
    float* pc = xc + W * E;  // [E, W] exps, then P (softmax) or the scores (sigmoid)
    float* bc = pc + W * E;  // [E, W] the selection values plus the bias
    col::f32x8 m, lo;
    // the next tile's rows, prefetched as this one's are loaded (where a row fills a cache line
    // or more: a tile of Mixtral's 8 experts, 4 lines, went 2-4 % slower with it on AVX2)
    const bool prefetch = t0 + 2 * W <= p.tokens && E * sizeof(Element) >= 64;
    const Element* following = prefetch ? p.d_logits + (t0 + W) * E : nullptr;
    if (!col::load(p.d_logits + t0 * E, E, xc, m, lo, following)) return false;
    col::f64x4 sum[2] = {};  // the exps' sums: the softmax's, and the logsumexp's
    if (softmax_score || wants_lse) col::exp_and_sum(xc, E, m, lo, pc, sum);
    float lse[W] = {};
    if (wants_lse) {
      col::logsumexp(m, sum, lse);
      if (p.out.d_logsumexp != nullptr) std::memcpy(p.out.d_logsumexp + t0, lse, sizeof lse);
    }
    if (!softmax_score) {
      col::sigmoid(xc, E, pc);
    } else if (aux || !softmax_after) {  // P is read (the aux sums, the gates or the selection)
      const col::f64x4 inv[2] = {1.0 / sum[0], 1.0 / sum[1]};
      col::normalize(pc, E, inv);
    }
    const float* sel = g.select == select_from::scores ? pc : xc;
    if (g.expert_bias) {
      col::add_bias(sel, E, p.d_bias, bc);
      sel = bc;
    }
    constexpr std::int32_t K = col::max_choices;
    col::i32x8 id[K];
    col::f32x8 b[K];
    col::i32x8 after;  // each token's (k + 1)-th best, where the keys ranked the tile
    const bool ranked_after = col::top_k(sel, E, k, id, b, &after);
    // the gates: softmax after top-k from the selected logits (a zero's sign changes no gate),
    // softmax from the chosen P (the selected values when selected from P), sigmoid from
    // score_one of the chosen logits (libm, lane by lane: the reference's bits)
    const bool plain_p = softmax_score && g.select == select_from::scores && !g.expert_bias;
    col::f32x8 score[K] = {};
    if (!softmax_score) {
      for (std::int32_t j = 0; j < k; ++j) {
        const col::f32x8 x = col::at_ids(xc, id[j]);
        for (std::int32_t l = 0; l < W; ++l) score[j][l] = score_one(x[l]);
      }
    } else if (!softmax_after) {
      for (std::int32_t j = 0; j < k; ++j) score[j] = plain_p ? b[j] : col::at_ids(pc, id[j]);
    }
    col::f32x8 gt[K];
    col::gates({softmax_after, k, g.renorm, g.renorm_epsilon, g.scaling_factor}, b, score, gt);
    const gating_result& o = p.out;
    col::store_choices(o.d_ids + t0 * k, id, k);
    col::store_choices(o.d_gates + t0 * k, gt, k);
    if (wants_priority) {  // the top-1 clean score: float(1.0 / sum), or score_one(max)
      if (softmax_score) {
        for (std::int32_t h = 0; h < 2; ++h) {
          const col::f32x4 q = __builtin_convertvector(1.0 / sum[h], col::f32x4);
          std::memcpy(o.d_token_priority + t0 + 4 * h, &q, sizeof q);
        }
      } else {
        for (std::int32_t l = 0; l < W; ++l) o.d_token_priority[t0 + l] = score_one(m[l]);
      }
    }
    col::i32x8 keep = {};  // -1: a valid token
    for (std::int32_t l = 0; l < W; ++l) {
      if (p.d_valid != nullptr && p.d_valid[t0 + l] == 0) continue;
      keep[l] = -1;
      ++*s.valid;
      *s.z += lse[l] * lse[l];
    }
    if (!aux) return true;
    // the aux inputs: P (softmax), or each score over the token's score sum (sigmoid), in pc
    if (!softmax_score) col::divide(pc, E, col::sum_f32(pc, E) + 1e-20f);
    const std::int32_t counted = cfg.aux_counts_per_token();
    const bool fresh_topk = cfg.loss.count_source == aux_count_source::fresh_topk;
    col::i32x8 at_least = {};
    if (fresh_topk) {  // finish's min from FLT_MAX over the first `counted` choices
      col::f32x8 least = col::f32x8{} + FLT_MAX;
      for (std::int32_t j = 0; j < counted; ++j) {
        const col::f32x8 v = col::at_ids(pc, id[j]);
        least = v < least ? v : least;
      }
      // P never decreases where the selection value grows (the selection is P, or a
      // softmax's logits: x - m, exp and the product with 1 / sum each keep the order;
      // math_test checks exp's over every float of [-104, 0]), so no expert past the first
      // `counted` has a P above the next one's in the selection's order: the choices are P's
      // fresh top-k unless that one reaches `least` (where insertion ranked the tile, whose
      // next is not known, every P is compared)
      const bool monotone = softmax_score && !g.expert_bias;
      if (monotone && (counted < k || ranked_after)) {
        const col::f32x8 next = col::at_ids(pc, counted < k ? id[counted] : after);
        at_least = (col::i32x8{} + counted) - (next >= least);  // (true is -1)
      } else {
        at_least = col::count_at_least(pc, E, least);
      }
    }
    col::accumulate(pc, E, keep, s.scores);
    for (std::int32_t l = 0; l < W; ++l) {
      if (keep[l] == 0) continue;
      const std::int64_t t = t0 + l;
      const std::int32_t* count_ids = o.d_ids + t * k;
      std::int32_t fresh[select_small_max];
      // a fresh top-k of P that is not the routed ids' set (finish's rule): P's row, selected
      if (fresh_topk && at_least[l] != counted) {
        for (std::int32_t e = 0; e < E; ++e) s.p[e] = pc[e * W + l];
        top_n(s.p, E, nullptr, counted, nullptr, fresh, s.keys);
        count_ids = fresh;
      }
      for (std::int32_t j = 0; j < counted; ++j) ++s.counts[count_ids[j]];
    }
    return true;
  }
#endif
};

}  // namespace detail

/// @brief Workspace bytes cpu::gating needs for `tokens` tokens under `cfg` (0 for T <= 0).
[[nodiscard]] inline std::size_t gating_workspace_bytes(const routing_config& cfg,
                                                        std::int64_t tokens) {
  if (tokens <= 0) return 0;
  workspace_carver w;
  (void)detail::carve_gating_space(w, make_gating_plan(cfg, tokens), cfg);
  return w.bytes();
}

/// @brief Fused gating of T tokens on the CPU: the semantics of reference::gating and the
///        params of cuda::gating (host pointers).
/// @param cfg             a routing_config (checked with validate())
/// @param p               pointers and shapes, see gating_params
/// @param workspace       caller-owned memory of at least gating_workspace_bytes(cfg, T) bytes,
///                        8-byte aligned; may be null when 0
/// @param workspace_bytes its size
/// @param ex              who runs the tasks (OpenMP / serial / the engine's parallel-for)
/// @return success; invalid_config / invalid_shape / invalid_argument naming the field;
///         workspace_too_small.
/// @note Synchronous; never allocates or throws. Tasks are cut by make_gating_plan (shapes
///       only) and their partial sums added in task order, so every output is bit-identical
///       for any executor and thread count. Expert ids, reroute ids, counts and the random
///       policies' draws equal the reference's whenever no two selection values lie within
///       the scores' error of each other (exact logit ties go to the lower index, as there).
///       Scores use math::exp (<= 2 ulp; the AVX-512 sigmoid math::sigmoid16, <= 3 ulp):
///       gates, logsumexp and P are within a few ulp of the reference, sums within their
///       double rounding (docs/numerics.md, "CPU backend").
template <class Element>
[[nodiscard]] status gating(const routing_config& cfg, const gating_params<Element>& p,
                            void* workspace, std::size_t workspace_bytes, const executor& ex = {}) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  if (auto s = param_checks::validate_workspace("gating", "gating_workspace_bytes", p.tokens,
                                                gating_workspace_bytes(cfg, p.tokens), workspace,
                                                workspace_bytes);
      !s)
    return s;
  const gating_plan plan = make_gating_plan(cfg, p.tokens);
  const std::int32_t E = cfg.num_experts;
  workspace_carver carver(workspace, workspace_bytes);
  const detail::gating_space space = detail::carve_gating_space(carver, plan, cfg);
  const detail::gating_agent<Element> agent(cfg, p);
  // (the inference path may leave the sequence sums null: then no sequence is summed)
  const std::int64_t S =
      cfg.loss.sequence_length > 0 && p.out.sums.d_seq_score_sum != nullptr ? plan.segments : 0;
  double* seq_scores = S > 0 ? p.out.sums.d_seq_score_sum : nullptr;
  std::int64_t* seq_counts = S > 0 ? p.out.sums.d_seq_count : nullptr;
  parallel_for(ex, plan.tasks, [&](std::int64_t i) {
    const detail::gating_task_space s = space.task(i, 0);
    std::fill(s.scores, s.scores + E, 0.0);
    std::fill(s.counts, s.counts + E, std::int64_t{0});
    *s.z = 0.0;
    *s.valid = 0;
    *s.bad = 0;
    *s.replaced = 0;
    std::int64_t begin, end;
    plan.range(i, begin, end);
    // whole sequences: the task writes its sequences' sums directly, in token order
    if (plan.whole_segments && S > 0) {
      const std::int64_t L = plan.segment_tokens;
      for (std::int64_t q = begin / L; q < end / L; ++q) {
        std::fill(seq_scores + q * E, seq_scores + (q + 1) * E, 0.0);
        std::fill(seq_counts + q * E, seq_counts + (q + 1) * E, std::int64_t{0});
        p.out.sums.d_seq_tokens[q] = 0;
      }
    }
    // the plan cuts sequence-major positions v; token t is where loss.sequence_order puts v
    const bool strided = S > 0 && cfg.loss.sequence_order == token_order::position_major;
    const bool direct = plan.whole_segments && S > 0;
    const std::int64_t L = plan.segment_tokens;
    const std::int32_t tile = space.tile;
    [[maybe_unused]] const bool by_columns = detail::selects_by_columns(cfg) && !agent.replay;
    detail::gating_task_space slot[detail::max_gating_tile];
    for (std::int32_t r = 0; r < tile; ++r) slot[r] = space.task(i, r);
    // steps 1-4 in sub-tiles of `front` tokens (the row-by-row tile); where x and ex die in
    // prepare, a sub-tile's tokens reuse the first sub-tile's x / ex rows (less scratch in L1)
    const std::int32_t row_tile = detail::gating_tile(E);
    const bool shared = tile > row_tile && detail::scratch_dies_in_prepare(cfg) && !agent.replay;
    const std::int32_t front = shared ? row_tile : tile;
    for (std::int32_t r = front; shared && r < tile; ++r) {
      slot[r].x = slot[r % front].x;
      slot[r].ex = slot[r % front].ex;
    }
    detail::token_state st[detail::max_gating_tile];
    // each step for the (sub-)tile's tokens, then the next: the partial sums still take the
    // tokens in order (finish), so the tile changes no bit
    const auto by_rows = [&](std::int64_t from, std::int64_t to) {
      for (std::int64_t v0 = from; v0 < to; v0 += tile) {
        const auto n = static_cast<std::int32_t>(std::min<std::int64_t>(tile, to - v0));
        for (std::int32_t r0 = 0; r0 < n; r0 += front) {
          const std::int32_t r1 = std::min(n, r0 + front);
          for (std::int32_t r = r0; r < r1; ++r) {
            const std::int64_t v = v0 + r;
            st[r].q = S > 0 ? v / L : 0;
            st[r].t =
                strided ? token_of_sequence(token_order::position_major, st[r].q, v % L, S, L) : v;
            agent.load(slot[r], st[r]);
          }
          for (std::int32_t r = r0; r < r1; ++r) agent.exponentiate(slot[r], st[r]);
          for (std::int32_t r = r0; r < r1; ++r) agent.normalize(slot[r], st[r]);
          for (std::int32_t r = r0; r < r1; ++r) agent.prepare(slot[r], st[r]);
        }
        if (agent.replay) {
          for (std::int32_t r = 0; r < n; ++r) {
            const std::int64_t replaced = agent.select_replayed(slot[r], st[r]);
            if (p.d_valid == nullptr || p.d_valid[st[r].t] != 0) *s.replaced += replaced;
          }
        }
#if defined(MOEROUTE_CPU_SELECT_COLUMNS)
        else if (by_columns) {
          agent.select_columns(st, n);
        }
#endif
        else {
          agent.select_tile(slot, st, n);
        }
        for (std::int32_t r = 0; r < n; ++r) {
          bool valid = false;
          agent.finish(slot[r], st[r], valid, direct ? seq_scores : nullptr,
                       direct ? seq_counts : nullptr);
          if (!valid) continue;
          ++*s.valid;
          if (direct) ++p.out.sums.d_seq_tokens[st[r].q];
        }
      }
    };
    std::int64_t v = begin;
#if defined(MOEROUTE_CPU_TOKEN_COLUMNS)
    // whole tiles of 8 as token columns (no sequences: their sums go by rows); a tile with a
    // non-finite logit, and the tokens after the last whole tile, by rows
    if (agent.columns && S == 0) {
      float* scratch = space.task_rows(i);
      for (; v + detail::columns::lanes <= end; v += detail::columns::lanes)
        if (!agent.gate_columns(s, scratch, v)) by_rows(v, v + detail::columns::lanes);
    }
#endif
    by_rows(v, end);
  });

  // Fixed-order reduction of the task partials.
  // (each sum written iff given: the inference path may leave any of them null)
  gating_sums sums = p.out.sums;
  double* const aux_sum = sums.d_aux_score_sum;
  std::int64_t* const aux_count = sums.d_aux_count;
  if (aux_sum != nullptr) std::fill(aux_sum, aux_sum + E, 0.0);
  if (aux_count != nullptr) std::fill(aux_count, aux_count + E, std::int64_t{0});
  double z = 0.0;
  std::int64_t valid = 0, bad = 0, replaced = 0;
  for (std::int64_t i = 0; i < plan.tasks; ++i) {
    const detail::gating_task_space part = space.task(i, 0);
    const double* ps = part.scores;
    const std::int64_t* pc = part.counts;
    if (aux_sum != nullptr)
      for (std::int32_t e = 0; e < E; ++e) aux_sum[e] += ps[e];
    if (aux_count != nullptr)
      for (std::int32_t e = 0; e < E; ++e) aux_count[e] += pc[e];
    z += *part.z;
    valid += *part.valid;
    bad += *part.bad;
    replaced += *part.replaced;
    if (S > 0 && !plan.whole_segments) {  // pieces of sequence i / pieces, in order
      const std::int64_t q = i / plan.pieces;
      if (i % plan.pieces == 0) {
        std::fill(seq_scores + q * E, seq_scores + (q + 1) * E, 0.0);
        std::fill(seq_counts + q * E, seq_counts + (q + 1) * E, std::int64_t{0});
        sums.d_seq_tokens[q] = 0;
      }
      for (std::int32_t e = 0; e < E; ++e) {
        seq_scores[q * E + e] += ps[e];
        seq_counts[q * E + e] += pc[e];
      }
      sums.d_seq_tokens[q] += *part.valid;
    }
  }
  if (sums.d_valid_tokens != nullptr) *sums.d_valid_tokens = valid;
  if (sums.d_z_sum_squares != nullptr) *sums.d_z_sum_squares = z;
  if (sums.d_nonfinite != nullptr) *sums.d_nonfinite = bad;
  if (p.replay.d_replaced != nullptr) *p.replay.d_replaced = replaced;
  if (p.replay.d_invalid != nullptr) *p.replay.d_invalid = 0;
  return status::success();
}

}  // namespace moeroute::cpu
