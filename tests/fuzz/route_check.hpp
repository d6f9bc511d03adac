// SPDX-License-Identifier: Apache-2.0
// The routing fuzz harness: decodes a config and a batch of logits from raw bytes, runs the
// whole CPU reference (gate, dispatch, both layouts, permute, combine, stats, losses) and checks
// every invariant the library promises (docs/reliability.md). Shared by the libFuzzer target
// (fuzz_route.cpp, built with clang) and by the corpus replay test in the normal test run
// (tests/reference/fuzz_corpus_test.cpp, built with the default compiler).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <moeroute/reference.hpp>

#ifndef MOEROUTE_FUZZ_FAIL
/// What a violated invariant does: print it and trap (libFuzzer records the input as a crash).
#define MOEROUTE_FUZZ_FAIL(what)                                                         \
  do {                                                                                   \
    std::fprintf(stderr, "moeroute fuzz: invariant violated: %s (%s:%d)\n", what, __FILE__, \
                 __LINE__);                                                              \
    __builtin_trap();                                                                    \
  } while (0)
#endif
#define MOEROUTE_FUZZ_CHECK(cond)            \
  do {                                       \
    if (!(cond)) MOEROUTE_FUZZ_FAIL(#cond); \
  } while (0)

namespace moeroute::fuzz {

/// How far inputs get (for tuning the decoder; read by the corpus replay test).
struct reach_counters {
  std::int64_t inputs = 0, bad_config = 0, bad_tokens = 0, bad_bias = 0, routed = 0,
               with_drops = 0, with_reroutes = 0, padded = 0;
};
inline reach_counters& reach() {
  static reach_counters c;
  return c;
}

/// Reads fuzz bytes front to back; past the end every read returns zero.
class byte_reader {
 public:
  byte_reader(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  std::uint8_t u8() { return i_ < n_ ? p_[i_++] : std::uint8_t{0}; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(u16()) | (static_cast<std::uint32_t>(u16()) << 16); }
  std::uint64_t u64() { return static_cast<std::uint64_t>(u32()) | (static_cast<std::uint64_t>(u32()) << 32); }
  /// A value in [lo, hi] (inclusive), from one or two bytes.
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    if (hi <= lo) return lo;
    const std::uint64_t span = static_cast<std::uint64_t>(hi - lo) + 1;
    const std::uint64_t v = span <= 256 ? u8() : u16();
    return lo + static_cast<std::int64_t>(v % span);
  }
  bool flag() { return (u8() & 1) != 0; }
  float f32() {
    const std::uint32_t u = u32();
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  [[nodiscard]] bool empty() const { return i_ >= n_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t i_ = 0;
};

/// A float from a menu of hostile values: NaN, +-Inf, denormals, huge, +-0, ties, or random.
inline float hostile_float(byte_reader& in, float previous) {
  switch (in.range(0, 15)) {
    case 0: return std::numeric_limits<float>::quiet_NaN();
    case 1: return std::numeric_limits<float>::infinity();
    case 2: return -std::numeric_limits<float>::infinity();
    case 3: return std::numeric_limits<float>::denorm_min() * static_cast<float>(in.range(1, 9));
    case 4: return -FLT_MIN / 2.0f;
    case 5: return FLT_MAX;
    case 6: return -FLT_MAX;
    case 7: return 0.0f;
    case 8: return -0.0f;
    case 9: return previous;  // exact tie with the previous logit
    case 10: return static_cast<float>(in.range(-3, 3));  // small integers: many ties
    case 11: return in.f32();  // any bit pattern
    case 12: return 1e30f * (in.flag() ? 1.0f : -1.0f);
    default: return static_cast<float>(static_cast<std::int8_t>(in.u8())) / 16.0f;
  }
}

struct decoded_case {
  routing_config cfg;
  std::int64_t tokens = 0;
  int dtype = 0;  // 0 float, 1 half, 2 bf16
  std::vector<float> logits_f;
  std::vector<half_bits> logits_h;
  std::vector<bf16_bits> logits_b;
  std::vector<float> bias;
  std::vector<std::uint8_t> valid;
  std::int64_t hidden = 1;
  std::int64_t block_size = 1;
};

inline decoded_case decode(byte_reader& in) {
  decoded_case c;
  routing_config& cfg = c.cfg;
  // One input in eight is "wild": any field may take an invalid value, which validate() must
  // reject with a message. The others keep every field valid, so most inputs reach routing.
  const bool wild = in.range(0, 7) == 7;
  const auto pick = [&](std::int64_t valid_n, std::int64_t all_n) {
    return in.range(0, (wild ? all_n : valid_n) - 1);
  };
  // Mostly small E (drops are frequent), sometimes a non-multiple of 32 past 64.
  cfg.num_experts = static_cast<std::int32_t>(in.flag() ? in.range(1, 16) : in.range(1, 130));
  if (wild && in.range(0, 7) == 7) cfg.num_experts = static_cast<std::int32_t>(in.range(-1, 0));
  cfg.top_k = static_cast<std::int32_t>(in.range(1, std::max(1, cfg.num_experts)));
  if (in.range(0, 3) == 0) cfg.top_k = std::min(cfg.top_k, static_cast<std::int32_t>(in.range(1, 4)));
  if (wild && in.range(0, 7) == 7) cfg.top_k = in.flag() ? 0 : cfg.num_experts + 1;
  cfg.training = in.flag();
  auto& g = cfg.gating;
  g.score = static_cast<score_function>(in.range(0, 2));
  g.select = static_cast<select_from>(in.range(0, 1));
  g.stage = static_cast<softmax_stage>(in.range(0, 1));
  if (!wild && (g.score != score_function::softmax || g.select == select_from::scores))
    g.stage = softmax_stage::before_topk;
  g.renorm = static_cast<renormalize>(in.range(0, 2));
  {
    const float eps[] = {0.0f, 1e-20f, 1e-6f, -1.0f, std::numeric_limits<float>::quiet_NaN()};
    g.renorm_epsilon = eps[pick(3, 5)];
  }
  {
    const float sf[] = {1.0f, 2.5f, 0.5f, 16.0f, 1e-3f, 0.0f, -1.0f,
                        std::numeric_limits<float>::infinity()};
    g.scaling_factor = sf[pick(5, 8)];
  }
  g.expert_bias = in.flag();
  if (in.range(0, 2) == 0) {
    // a group limit: valid unless wild
    const std::int32_t G = static_cast<std::int32_t>(in.range(2, 8));
    const std::int32_t per = static_cast<std::int32_t>(in.range(1, 4));
    const std::int32_t gk = static_cast<std::int32_t>(in.range(1, G));
    g.group_limit.groups = G;
    g.group_limit.group_topk = gk;
    if (!wild) {
      cfg.num_experts = G * per;
      cfg.top_k = gk * static_cast<std::int32_t>(in.range(1, per));
    }
  } else if (wild) {
    g.group_limit.groups = static_cast<std::int32_t>(in.range(-1, 1));
    g.group_limit.group_topk = static_cast<std::int32_t>(in.range(0, 1));
  }
  g.noise.kind = static_cast<noise_kind>(in.range(0, 2));
  {
    const float ns[] = {1.0f, 0.01f, 0.0f, 100.0f, 1e30f, -1.0f,
                        std::numeric_limits<float>::quiet_NaN()};
    g.noise.scale = ns[pick(5, 7)];
  }
  g.noise.seed = in.u8();
  g.noise.offset = in.u8();
  g.noise.target = static_cast<noise_target>(in.range(0, 1));
  g.noise.only_in_training = in.flag();

  auto& cap = cfg.capacity;
  cap.mode = static_cast<capacity_mode>(in.range(0, 3));
  {
    const double f[] = {1.0, 1.25, 0.5, 2.0, 0.01, 4.0, 0.0, -1.0,
                        std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity(), 2e6};
    cap.factor = f[pick(6, 11)];
    cap.eval_factor = in.flag() ? std::numeric_limits<double>::quiet_NaN() : f[pick(6, 11)];
  }
  cap.includes_k = in.flag();
  cap.rounding = static_cast<capacity_rounding>(in.range(0, 1));
  cap.min_capacity = wild && in.range(0, 3) == 3 ? -1 : in.range(0, 8);
  cap.clamp_to_tokens = in.flag();
  cap.no_drop_when_exceeds_tokens = in.flag();
  cap.fixed = wild && in.range(0, 3) == 3 ? -1 : in.range(0, 40);

  auto& d = cfg.dispatch;
  d.prio = static_cast<priority>(in.range(0, 3));
  d.slots = static_cast<slot_order>(in.range(0, 1));
  d.dropped = static_cast<drop_policy>(in.range(0, 3));
  if (!wild && d.dropped == drop_policy::next_choice && g.group_limit.groups > 1)
    d.dropped = drop_policy::fallback;
  d.fallback.expert = static_cast<std::int32_t>(in.range(-1, cfg.num_experts - 1));
  d.fallback.capacity = in.range(-1, 12);
  if (wild && in.flag()) {
    d.fallback.expert = static_cast<std::int32_t>(in.flag() ? -2 : cfg.num_experts);
    d.fallback.capacity = -2;
  }
  d.reroute.max_candidates = static_cast<std::int32_t>(in.range(wild ? 0 : 1, 6));
  d.random_seed = in.u8();
  d.random_offset = in.u8();

  auto& l = cfg.loss;
  l.counts = static_cast<aux_counts>(in.range(0, 1));
  l.count_source = static_cast<aux_count_source>(in.range(0, 1));
  l.scale = static_cast<aux_scale>(in.range(0, 2));
  {
    const float coef[] = {0.01f, 1.0f, 0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()};
    l.aux_coefficient = coef[pick(3, 5)];
    l.z_coefficient = coef[pick(3, 5)];
  }
  l.sequence_length = in.range(0, 9) < 7 ? 0 : in.range(wild ? -1 : 1, 6);

  c.tokens = wild && in.range(0, 3) == 3 ? in.range(-2, 0) : in.range(0, 48);
  if (l.sequence_length > 0 && !wild) c.tokens = c.tokens / l.sequence_length * l.sequence_length;
  c.dtype = static_cast<int>(in.range(0, 2));
  c.hidden = in.range(1, 3);
  c.block_size = in.range(1, 5);
  return c;
}

/// Fills the data arrays once the config is known to be valid (sizes come from the config).
inline void decode_data(byte_reader& in, decoded_case& c) {
  const bool has_mask = in.flag();
  const std::int64_t n = c.tokens * c.cfg.num_experts;
  float prev = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    switch (c.dtype) {
      case 0: prev = hostile_float(in, prev); c.logits_f.push_back(prev); break;
      case 1: c.logits_h.push_back(half_bits{in.u16()}); break;
      default: c.logits_b.push_back(bf16_bits{in.u16()}); break;
    }
  }
  if (c.cfg.gating.expert_bias) {
    for (std::int32_t e = 0; e < c.cfg.num_experts; ++e)
      c.bias.push_back(static_cast<float>(static_cast<std::int8_t>(in.u8())) / 32.0f);
    if (in.range(0, 15) == 15)  // sometimes a hostile entry (non-finite ones must be rejected)
      c.bias[in.range(0, c.cfg.num_experts - 1)] = hostile_float(in, 0.0f);
  }
  if (has_mask) {  // one token in four is padding (none once the input runs out)
    for (std::int64_t t = 0; t < c.tokens; ++t) c.valid.push_back(in.range(0, 3) != 3 ? 1 : 0);
  }
}

inline float logit_at(const decoded_case& c, std::int64_t i) {
  switch (c.dtype) {
    case 0: return c.logits_f[i];
    case 1: return to_float(c.logits_h[i]);
    default: return to_float(c.logits_b[i]);
  }
}

inline reference::routing_result run_route(const decoded_case& c) {
  const std::span<const float> bias(c.bias);
  const std::span<const std::uint8_t> valid(c.valid);
  switch (c.dtype) {
    case 0: return reference::route<float>(c.cfg, std::span<const float>(c.logits_f), c.tokens, bias, valid);
    case 1: return reference::route<half_bits>(c.cfg, std::span<const half_bits>(c.logits_h), c.tokens, bias, valid);
    default: return reference::route<bf16_bits>(c.cfg, std::span<const bf16_bits>(c.logits_b), c.tokens, bias, valid);
  }
}

inline bool finite_in(float v, float lo, float hi) { return std::isfinite(v) && v >= lo && v <= hi; }

/// Checks a layout against the dispatch it was built from.
inline void check_layout(const reference::dispatch_output& dsp, const reference::expert_layout& L,
                         bool padded) {
  const std::int32_t ET = dsp.total_experts;
  MOEROUTE_FUZZ_CHECK(L.total_experts == ET);
  MOEROUTE_FUZZ_CHECK(static_cast<std::int32_t>(L.offsets.size()) == ET + 1);
  MOEROUTE_FUZZ_CHECK(L.offsets[0] == 0 && L.offsets[ET] == L.num_rows);
  MOEROUTE_FUZZ_CHECK(static_cast<std::int64_t>(L.row_token.size()) == L.num_rows);
  MOEROUTE_FUZZ_CHECK(static_cast<std::int64_t>(L.assignment_row.size()) == dsp.tokens * dsp.k);
  std::int64_t used = 0;
  for (std::int32_t e = 0; e < ET; ++e) {
    const std::int64_t seg = L.offsets[e + 1] - L.offsets[e];
    MOEROUTE_FUZZ_CHECK(L.rows_used[e] == dsp.load[e]);
    MOEROUTE_FUZZ_CHECK(seg >= dsp.load[e]);
    if (padded && e < dsp.experts) MOEROUTE_FUZZ_CHECK(seg == dsp.capacity);
    if (!padded) {
      MOEROUTE_FUZZ_CHECK(L.offsets[e] % L.block_size == 0);
      MOEROUTE_FUZZ_CHECK(seg == (dsp.load[e] + L.block_size - 1) / L.block_size * L.block_size);
      for (std::int64_t b = L.offsets[e] / L.block_size; b < L.offsets[e + 1] / L.block_size; ++b)
        MOEROUTE_FUZZ_CHECK(L.block_expert[b] == e);
    }
    // rows [offset, offset + load) hold a token, the rest of the segment is padding
    for (std::int64_t r = L.offsets[e]; r < L.offsets[e + 1]; ++r)
      MOEROUTE_FUZZ_CHECK((L.row_token[r] >= 0) == (r - L.offsets[e] < dsp.load[e]));
    used += dsp.load[e];
  }
  MOEROUTE_FUZZ_CHECK(L.padding_rows() == L.num_rows - used);
  for (std::int64_t a = 0; a < dsp.tokens * dsp.k; ++a) {
    const std::int32_t e = dsp.expert[a];
    if (e < 0) {
      MOEROUTE_FUZZ_CHECK(L.assignment_row[a] == -1);
      continue;
    }
    const std::int64_t row = L.assignment_row[a];
    MOEROUTE_FUZZ_CHECK(row == L.offsets[e] + dsp.slot[a]);
    MOEROUTE_FUZZ_CHECK(row >= L.offsets[e] && row < L.offsets[e + 1]);
    MOEROUTE_FUZZ_CHECK(L.row_token[row] == a / dsp.k);
  }
}

/// One fuzz input: decode, route, check. Returns 0 (libFuzzer's convention).
inline int route_one(const std::uint8_t* data, std::size_t size) {
  byte_reader in(data, size);
  decoded_case c = decode(in);
  ++reach().inputs;
  const routing_config& cfg = c.cfg;

  // validate() must answer for any config without crashing, with a message naming the field.
  const status vs = validate(cfg);
  if (!vs.ok()) {
    ++reach().bad_config;
    MOEROUTE_FUZZ_CHECK(vs.code == status_code::invalid_config);
    MOEROUTE_FUZZ_CHECK(!vs.message.empty());
    bool threw = false;
    try {
      (void)reference::gate(cfg, std::vector<float>{}, 0);
    } catch (const error& e) {
      threw = e.get_status().code == status_code::invalid_config;
    }
    MOEROUTE_FUZZ_CHECK(threw);
    return 0;
  }
  const status ts = validate_tokens(cfg, c.tokens);
  if (!ts.ok()) {
    ++reach().bad_tokens;
    MOEROUTE_FUZZ_CHECK(ts.code == status_code::invalid_shape && !ts.message.empty());
    bool threw = false;
    try {
      (void)reference::gate(cfg, std::vector<float>{}, c.tokens);
    } catch (const error& e) {
      threw = e.get_status().code == status_code::invalid_shape;
    }
    MOEROUTE_FUZZ_CHECK(threw);
    return 0;
  }
  decode_data(in, c);
  bool bias_ok = true;
  for (float b : c.bias) bias_ok = bias_ok && std::isfinite(b);

  const std::int32_t E = cfg.num_experts, k = cfg.top_k, ET = cfg.total_experts();
  const std::int64_t T = c.tokens;
  const float sf = cfg.gating.scaling_factor;

  reference::routing_result r;
  try {
    r = run_route(c);
  } catch (const error& e) {
    // the only input this harness can make invalid here is a non-finite expert bias
    MOEROUTE_FUZZ_CHECK(!bias_ok && e.get_status().code == status_code::invalid_argument);
    ++reach().bad_bias;
    return 0;
  }
  ++reach().routed;
  MOEROUTE_FUZZ_CHECK(bias_ok);
  const auto& g = r.gating;
  const auto& d = r.dispatch;

  // ---- gating ----
  const std::int32_t R = cfg.candidates_per_token() - k;
  MOEROUTE_FUZZ_CHECK(g.tokens == T && g.experts == E && g.k == k && g.reroute_candidates == R);
  MOEROUTE_FUZZ_CHECK(static_cast<std::int64_t>(g.ids.size()) == T * k);
  MOEROUTE_FUZZ_CHECK(static_cast<std::int64_t>(g.gates.size()) == T * k);
  MOEROUTE_FUZZ_CHECK(static_cast<std::int64_t>(g.reroute_ids.size()) == T * R);
  std::int64_t valid_tokens = 0, nonfinite = 0;
  // softmax and sigmoid scores are in [0, 1]; sqrt-softplus ones only after renormalising
  const bool bounded_scores = cfg.gating.score != score_function::sqrt_softplus ||
                              cfg.gating.renorm == renormalize::before_drop;
  const bool plain_selection = cfg.gating.select == select_from::logits && !cfg.noise_active() &&
                               !cfg.gating.expert_bias && cfg.gating.group_limit.groups <= 1;
  const std::int32_t G = cfg.gating.group_limit.groups > 1 ? cfg.gating.group_limit.groups : 1;
  for (std::int64_t t = 0; t < T; ++t) {
    const bool v = c.valid.empty() || c.valid[t] != 0;
    valid_tokens += v ? 1 : 0;
    std::vector<std::uint8_t> seen(E, 0);
    std::set<std::int32_t> groups;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int32_t e = g.ids[t * k + j];
      MOEROUTE_FUZZ_CHECK(e >= 0 && e < E);
      MOEROUTE_FUZZ_CHECK(!seen[e]);  // distinct per token
      seen[e] = 1;
      groups.insert(e / (E / G));
      const float gate = g.gates[t * k + j];
      MOEROUTE_FUZZ_CHECK(std::isfinite(gate) && gate >= 0.0f);
      if (bounded_scores) {
        const float hi = cfg.gating.renorm == renormalize::after_drop ? 1.0f : sf;
        MOEROUTE_FUZZ_CHECK(gate <= hi);
      }
    }
    if (G > 1) MOEROUTE_FUZZ_CHECK(static_cast<std::int32_t>(groups.size()) <= cfg.gating.group_limit.group_topk);
    for (std::int32_t q = 0; q < R; ++q) {
      const std::int32_t e = g.reroute_ids[t * R + q];
      MOEROUTE_FUZZ_CHECK(e >= 0 && e < E);
      MOEROUTE_FUZZ_CHECK(!seen[e]);
      seen[e] = 1;
    }
    for (std::int32_t e = 0; e < E; ++e)
      if (!std::isfinite(logit_at(c, t * E + e))) ++nonfinite;
    MOEROUTE_FUZZ_CHECK(std::isfinite(g.logsumexp[t]));
    if (plain_selection) {
      // independent top-k: sanitised logits, larger first, ties to the lower index
      std::vector<float> x(E);
      for (std::int32_t e = 0; e < E; ++e) {
        const float raw = logit_at(c, t * E + e);
        x[e] = std::isnan(raw) ? -FLT_MAX : std::clamp(raw, -FLT_MAX, FLT_MAX);
      }
      const auto better = [&](std::int32_t a, std::int32_t b) {
        return x[a] > x[b] || (x[a] == x[b] && a < b);
      };
      for (std::int32_t j = 0; j + 1 < k + R; ++j) {
        const std::int32_t a = j < k ? g.ids[t * k + j] : g.reroute_ids[t * R + j - k];
        const std::int32_t b = j + 1 < k ? g.ids[t * k + j + 1] : g.reroute_ids[t * R + j + 1 - k];
        MOEROUTE_FUZZ_CHECK(better(a, b));
      }
      const std::int32_t last = k + R > k ? g.reroute_ids[t * R + R - 1] : g.ids[t * k + k - 1];
      for (std::int32_t e = 0; e < E; ++e)
        if (!seen[e]) MOEROUTE_FUZZ_CHECK(better(last, e));
    }
  }
  MOEROUTE_FUZZ_CHECK(g.valid_tokens == valid_tokens);
  MOEROUTE_FUZZ_CHECK(g.nonfinite_logits == nonfinite);
  {
    const std::int64_t counted = cfg.loss.counts == aux_counts::top1 ? 1 : k;
    std::int64_t sum = 0;
    for (std::int32_t e = 0; e < E; ++e) {
      sum += g.aux_count[e];
      MOEROUTE_FUZZ_CHECK(std::isfinite(g.aux_score_sum[e]) && g.aux_score_sum[e] >= 0.0);
    }
    MOEROUTE_FUZZ_CHECK(sum == valid_tokens * counted);
  }

  // ---- dispatch ----
  MOEROUTE_FUZZ_CHECK(d.tokens == T && d.k == k && d.experts == E && d.total_experts == ET);
  const std::int64_t C = d.capacity;
  MOEROUTE_FUZZ_CHECK(C == expert_capacity(cfg, T, [&] {
                        std::int64_t m = 0;
                        for (auto q : d.requested) m = std::max(m, q);
                        return m;
                      }()));
  std::int64_t kept = 0, rerouted = 0, dropped = 0, masked = 0;
  std::vector<std::int64_t> requested(E, 0), kept_e(E, 0), rerouted_e(E, 0), dropped_e(E, 0),
      received(ET, 0);
  // (expert, slot) -> token: no slot holds two tokens
  std::vector<std::vector<std::int64_t>> slot_token(ET);
  for (std::int32_t e = 0; e < ET; ++e) {
    MOEROUTE_FUZZ_CHECK(d.load[e] >= 0 && d.load[e] <= T);
    slot_token[e].assign(d.load[e], -1);
    if (e < E && C >= 0) MOEROUTE_FUZZ_CHECK(d.load[e] <= C);  // no expert over capacity
    if (e == E && d.fallback_capacity >= 0) MOEROUTE_FUZZ_CHECK(d.load[e] <= d.fallback_capacity);
  }
  const std::int32_t fallback_target =
      cfg.dispatch.dropped == drop_policy::fallback
          ? (cfg.dispatch.fallback.expert < 0 ? E : cfg.dispatch.fallback.expert)
          : -2;
  for (std::int64_t t = 0; t < T; ++t) {
    const bool v = c.valid.empty() || c.valid[t] != 0;
    float wsum = 0.0f, gsum = 0.0f;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int64_t a = t * k + j;
      const fate f = d.fates[a];
      const std::int32_t chose = g.ids[a];
      const float w = d.weight[a];
      MOEROUTE_FUZZ_CHECK(std::isfinite(w) && w >= 0.0f);
      if (!v) {
        MOEROUTE_FUZZ_CHECK(f == fate::masked);
        ++masked;
      } else {
        MOEROUTE_FUZZ_CHECK(f != fate::masked);
        ++requested[chose];
      }
      if (f == fate::kept || f == fate::rerouted) {
        const std::int32_t e = d.expert[a];
        const std::int32_t s = d.slot[a];
        MOEROUTE_FUZZ_CHECK(e >= 0 && e < ET);
        MOEROUTE_FUZZ_CHECK(s >= 0 && s < d.load[e]);
        MOEROUTE_FUZZ_CHECK(slot_token[e][s] == -1 || slot_token[e][s] == t);
        slot_token[e][s] = t;
        // a token holds one slot per expert: two assignments at one expert share it
        for (std::int32_t j2 = 0; j2 < j; ++j2)
          if (d.expert[t * k + j2] == e) MOEROUTE_FUZZ_CHECK(d.slot[t * k + j2] == s);
        if (bounded_scores || cfg.gating.renorm == renormalize::after_drop)
          MOEROUTE_FUZZ_CHECK(w <= sf);
        if (cfg.gating.renorm != renormalize::after_drop) MOEROUTE_FUZZ_CHECK(w == g.gates[a]);
        wsum += w;
        gsum += g.gates[a];
      } else {
        MOEROUTE_FUZZ_CHECK(d.expert[a] == -1 && d.slot[a] == -1 && w == 0.0f);
      }
      if (f == fate::kept) {
        MOEROUTE_FUZZ_CHECK(d.expert[a] == chose);
        ++kept;
        ++kept_e[chose];
      } else if (f == fate::rerouted) {
        MOEROUTE_FUZZ_CHECK(d.expert[a] != chose);
        MOEROUTE_FUZZ_CHECK(cfg.dispatch.dropped == drop_policy::fallback ||
                            cfg.dispatch.dropped == drop_policy::next_choice);
        if (cfg.dispatch.dropped == drop_policy::fallback) {
          MOEROUTE_FUZZ_CHECK(d.expert[a] == fallback_target);
        } else {
          bool candidate = false;
          for (std::int32_t q = 0; q < R; ++q) candidate = candidate || g.reroute_ids[t * R + q] == d.expert[a];
          MOEROUTE_FUZZ_CHECK(candidate);
        }
        ++rerouted;
        ++rerouted_e[chose];
        ++received[d.expert[a]];
      } else if (f == fate::dropped) {
        ++dropped;
        ++dropped_e[chose];
      }
    }
    if (cfg.gating.renorm == renormalize::after_drop && gsum >= FLT_EPSILON) {
      // survivors' weights add up to scaling_factor
      MOEROUTE_FUZZ_CHECK(std::fabs(wsum - sf) <= 1e-5f * static_cast<float>(k) * sf);
    }
  }
  // conservation: kept + rerouted + dropped + masked = T * k, at the totals and per expert
  MOEROUTE_FUZZ_CHECK(kept + rerouted + dropped + masked == T * k);
  MOEROUTE_FUZZ_CHECK(d.total_kept == kept && d.total_rerouted == rerouted &&
                      d.total_dropped == dropped && d.total_masked == masked);
  for (std::int32_t e = 0; e < E; ++e) {
    MOEROUTE_FUZZ_CHECK(d.requested[e] == requested[e]);
    MOEROUTE_FUZZ_CHECK(d.kept[e] == kept_e[e] && d.rerouted[e] == rerouted_e[e] &&
                        d.dropped[e] == dropped_e[e]);
    MOEROUTE_FUZZ_CHECK(d.requested[e] == d.kept[e] + d.rerouted[e] + d.dropped[e]);
    // an expert turns a request away only when it is full (capacity is never a no-op)
    if (d.rerouted[e] + d.dropped[e] > 0) MOEROUTE_FUZZ_CHECK(C >= 0 && d.kept[e] == C);
  }
  for (std::int32_t e = 0; e < ET; ++e) {
    MOEROUTE_FUZZ_CHECK(d.received[e] == received[e]);
    // slots are dense: 0 .. load-1, every one held
    for (std::int64_t s = 0; s < d.load[e]; ++s) MOEROUTE_FUZZ_CHECK(slot_token[e][s] >= 0);
    if (cfg.dispatch.slots == slot_order::token_index)
      for (std::int64_t s = 1; s < d.load[e]; ++s)
        MOEROUTE_FUZZ_CHECK(slot_token[e][s - 1] < slot_token[e][s]);
  }
  if (dropped > 0) ++reach().with_drops;
  if (rerouted > 0) ++reach().with_reroutes;
  if (cfg.capacity.mode == capacity_mode::max_load || cfg.capacity.mode == capacity_mode::unbounded)
    MOEROUTE_FUZZ_CHECK(dropped == 0 && rerouted == 0);  // dropless
  if (cfg.dispatch.dropped == drop_policy::zero_weight || cfg.dispatch.dropped == drop_policy::residual)
    MOEROUTE_FUZZ_CHECK(rerouted == 0);

  // priority: at each expert the kept requests come first in priority order
  if (cfg.dispatch.prio != priority::random) {
    for (std::int32_t e = 0; e < E; ++e) {
      std::vector<std::pair<std::tuple<float, std::int64_t, std::int64_t>, bool>> req;
      for (std::int64_t t = 0; t < T; ++t) {
        if (!(c.valid.empty() || c.valid[t] != 0)) continue;
        for (std::int32_t j = 0; j < k; ++j) {
          const std::int64_t a = t * k + j;
          if (g.ids[a] != e) continue;
          std::tuple<float, std::int64_t, std::int64_t> key{0.0f, t, j};
          if (cfg.dispatch.prio == priority::choice_major) key = {0.0f, j, t};
          if (cfg.dispatch.prio == priority::score_per_expert) key = {-g.gates[a], t, j};
          req.push_back({key, d.fates[a] == fate::kept});
        }
      }
      std::sort(req.begin(), req.end());
      for (std::size_t i = 1; i < req.size(); ++i)
        MOEROUTE_FUZZ_CHECK(req[i - 1].second || !req[i].second);
    }
  }

  // ---- losses ----
  MOEROUTE_FUZZ_CHECK(std::isfinite(r.aux.value) && r.aux.value >= 0.0);
  MOEROUTE_FUZZ_CHECK(std::isfinite(r.sequence_aux) && r.sequence_aux >= 0.0);
  MOEROUTE_FUZZ_CHECK(std::isfinite(r.z.value) && r.z.value >= 0.0);
  MOEROUTE_FUZZ_CHECK(r.aux.tokens == valid_tokens && r.z.tokens == valid_tokens);
  MOEROUTE_FUZZ_CHECK(reference::aux_loss_from_sums(cfg, r.aux.score_sum, r.aux.counts, r.aux.tokens) ==
                      r.aux.value);

  // ---- layouts, permute, combine, stats ----
  const std::int64_t dh = c.hidden;
  std::vector<float> x(static_cast<std::size_t>(T * dh));
  for (std::int64_t i = 0; i < T * dh; ++i) x[i] = static_cast<float>(i % 251) * 0.25f - 7.0f;
  std::vector<float> y_first;
  for (int which = 0; which < 2; ++which) {
    const bool padded = which == 0;
    reference::expert_layout L;
    if (padded) {
      if (C < 0) {
        bool threw = false;
        try {
          (void)reference::padded_layout(d);
        } catch (const error& e) {
          threw = e.get_status().code == status_code::unsupported;
        }
        MOEROUTE_FUZZ_CHECK(threw);
        continue;
      }
      if (C * ET > (std::int64_t{1} << 16)) continue;  // the harness keeps buffers small
      L = reference::padded_layout(d);
      ++reach().padded;
    } else {
      L = reference::compact_layout(d, c.block_size);
    }
    check_layout(d, L, padded);
    std::vector<float> permuted(static_cast<std::size_t>(L.num_rows * dh), -1.0f);
    reference::permute<float>(L, x, T, dh, permuted);
    for (std::int64_t row = 0; row < L.num_rows; ++row)
      for (std::int64_t col = 0; col < dh; ++col) {
        const std::int32_t t = L.row_token[row];
        MOEROUTE_FUZZ_CHECK(permuted[row * dh + col] == (t < 0 ? 0.0f : x[t * dh + col]));
      }
    // identity experts: y[t] = sum_j w_j x[t] in rank order; residual passes x through
    std::vector<float> y(static_cast<std::size_t>(T * dh), -1.0f);
    reference::combine<float>(cfg, d, L, permuted, dh, x, y);
    for (std::int64_t t = 0; t < T; ++t) {
      bool any = false;
      for (std::int32_t j = 0; j < k; ++j) any = any || d.expert[t * k + j] >= 0;
      const bool pass = cfg.dispatch.dropped == drop_policy::residual && !any &&
                        d.fates[t * k] != fate::masked;
      for (std::int64_t col = 0; col < dh; ++col) {
        float acc = 0.0f;
        for (std::int32_t j = 0; j < k; ++j)
          if (d.expert[t * k + j] >= 0) acc += d.weight[t * k + j] * x[t * dh + col];
        MOEROUTE_FUZZ_CHECK(y[t * dh + col] == (pass ? x[t * dh + col] : acc));
      }
    }
    if (y_first.empty()) {
      y_first = y;
    } else {
      MOEROUTE_FUZZ_CHECK(y_first == y);  // both layouts give the same combine
    }
    const auto st = reference::compute_stats(d, L);
    MOEROUTE_FUZZ_CHECK(st.assignments == T * k && st.kept == kept && st.dropped == dropped &&
                        st.rerouted == rerouted && st.masked == masked);
    MOEROUTE_FUZZ_CHECK(st.drop_rate >= 0.0 && st.drop_rate <= 1.0);
    MOEROUTE_FUZZ_CHECK(st.padding_waste >= 0.0 && st.padding_waste <= 1.0);
    MOEROUTE_FUZZ_CHECK(st.rows == L.num_rows && st.empty_rows == L.padding_rows());
    MOEROUTE_FUZZ_CHECK(st.dead_experts >= 0 && st.dead_experts <= E);
    std::int64_t fully = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      bool any = false;
      for (std::int32_t j = 0; j < k; ++j) any = any || d.expert[t * k + j] >= 0;
      if (!any && d.fates[t * k] != fate::masked) ++fully;
    }
    MOEROUTE_FUZZ_CHECK(st.fully_dropped_tokens == fully);
  }
  return 0;
}

}  // namespace moeroute::fuzz
