// SPDX-License-Identifier: Apache-2.0
// CPU backend: the router-logit gradient — the routing term (d combine weight through the
// gates) and the aux, sequence-aux and z-loss terms — with the params of
// cuda::gating_backward and the formulas of reference::gating_backward (docs/numerics.md,
// "Gradients"). Per token, every intermediate in double, each term rounded to float and added
// in the reference's order; tokens run in fixed blocks, so the bits do not depend on threads.
// Three paths (numerics.md, "Losses, logit gradient"): the row path (rows of up to 512
// experts: vectors of the ISA's width, moeroute's own exp / log, sums in 8 fixed lanes: the
// same bits on every ISA), the column path (softmax rows of at most 8: W tokens side by side,
// the row path's bits), and the element path for wider rows (libm, the reference's
// per-element expressions).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <moeroute/config.hpp>
#include <moeroute/cpu/detail/math.hpp>
#include <moeroute/cpu/gating.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/gating_backward.hpp>
#include <moeroute/rng.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512BW__)
// the row path's choices as the lanes of one vector (row_token)
#define MOEROUTE_CPU_CHOICE_LANES 1
#include <immintrin.h>
#endif

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::cpu {

using moeroute::gating_backward_params;

/// @brief Checks config, shape and pointers (check_params), and with a routing term each
///        valid token's ids (the rows it indexes) in [0, num_experts); names the first bad
///        field or element. An id named twice in a token is allowed: its parts add up.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const gating_backward_params<Element>& p) {
  static_assert(is_element_v<Element>, "Element must be float, half_bits or bf16_bits");
  if (auto s = check_params(cfg, p); !s) return s;
  if (p.d_grad_weight == nullptr || p.weights.routing == 0.0) return status::success();
  const std::int32_t k = cfg.top_k, E = cfg.num_experts;
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    if (p.d_valid != nullptr && p.d_valid[t] == 0) continue;
    for (std::int32_t j = 0; j < k; ++j) {
      const std::int32_t e = p.gated.d_ids[t * k + j];
      if (e < 0 || e >= E)
        return status::make(
            status_code::invalid_argument,
            "gated.d_ids[" + std::to_string(t * k + j) + "] = " + std::to_string(e) +
                ": outside [0, num_experts = " + std::to_string(E) + ") in a valid token");
    }
  }
  return status::success();
}

namespace detail {

namespace bwd {
inline double sanitize(double x) {
  if (x != x) return -static_cast<double>(FLT_MAX);
  return std::clamp(x, -static_cast<double>(FLT_MAX), static_cast<double>(FLT_MAX));
}
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double score(score_function f, double x) {
  if (f == score_function::sigmoid) return sigmoid(x);
  const double sp = x > 0.0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  return std::sqrt(sp);
}
inline double score_deriv(score_function f, double x, double s) {
  if (f == score_function::sigmoid) return s * (1.0 - s);
  return s > 0.0 ? sigmoid(x) / (2.0 * s) : 0.0;
}
}  // namespace bwd

/// Rows up to this wide, with up to row_max_k choices, take the row path (arrays on the stack);
/// the rest the element path.
inline constexpr std::int32_t gating_backward_row_max = 512;
inline constexpr std::int32_t gating_backward_row_max_k = 64;

/// One row's values, made once per token by the row path (38 KB on the stack, one per task).
/// Arrays are padded to whole blocks of 8 lanes; pad lanes hold values that add nothing.
struct gating_backward_row {
  static constexpr std::int32_t n = gating_backward_row_max;
  alignas(64) double x[n];       ///< the clean (sanitised) logits; pads -FLT_MAX
  alignas(64) double xg[n];      ///< the gate logits: x plus noise (noise on the gates only)
  alignas(64) double ex[n];      ///< exp(x - max x): the softmax of x times its sum
  alignas(64) double gex[n];     ///< exp(xg - max xg) (noise on the gates only; else ex)
  alignas(64) double sc[n];      ///< score(x) of a per-expert score (sigmoid, sqrt-softplus)
  alignas(64) double dv[n];      ///< d score / d x at x
  alignas(64) double gp_aux[n];  ///< dL/dP of the batch aux loss: c_aux * count(e); per call
  alignas(64) double gp_seq[n];  ///< dL/dP of the sequence aux loss, for sequence seq_q
  alignas(64) float res[n];      ///< the row of d logits being made
  std::int64_t chosen_in[n];     ///< the last token whose choices named expert e (else -1)
  bool ready = false;            ///< gp_aux filled (the same for every token)
  std::int64_t seq_q = -1;       ///< the sequence gp_seq is filled for
};

// The row path's vectors: W doubles, the ISA's own width (AVX-512 8, AVX 4, else 2). A wider
// generic vector than the ISA's has no machine mode, and GCC keeps such a variable in memory:
// 8-double blocks made the AVX2 build 3-4x slower. Rows are still padded to whole blocks of 8,
// and every sum over experts puts element e in lane e % 8 of an 8-lane accumulator (lanes8):
// the same rounding, so the same bits, on every ISA. Vectors are read and written in place
// through block(p).v (any address, may alias) and never pass a call by value (-Wpsabi).
inline constexpr std::int32_t W = math::native_lanes / 2;  // doubles in a native register
using f64w = double __attribute__((vector_size(8 * W)));
using i64w = std::int64_t __attribute__((vector_size(8 * W)));
using f32w = float __attribute__((vector_size(4 * W)));
using i32w = std::int32_t __attribute__((vector_size(4 * W)));
// A vector at any address, as the one member of a struct. Clang drops an under-aligned vector
// type's alignment through a reference (block() returned one until 2026-12: clang took aligned
// moves for unaligned rows and backward_test died of SIGSEGV) but keeps a packed struct's. GCC
// keeps either; with an under-aligned member its code was as fast as before or faster, with a
// packed struct up to 9 % slower (Switch's 29-expert rows).
#if defined(__clang__)
struct __attribute__((packed, may_alias)) f64u {
  f64w v;
};
struct __attribute__((packed, may_alias)) f32u {
  f32w v;
};
#else
typedef double f64_any_address __attribute__((vector_size(8 * W), aligned(8)));
typedef float f32_any_address __attribute__((vector_size(4 * W), aligned(4)));
struct __attribute__((may_alias)) f64u {
  f64_any_address v;
};
struct __attribute__((may_alias)) f32u {
  f32_any_address v;
};
#endif
[[gnu::always_inline]] inline const f64u& block(const double* a) {
  return *reinterpret_cast<const f64u*>(a);
}
[[gnu::always_inline]] inline f64u& block(double* a) { return *reinterpret_cast<f64u*>(a); }
[[gnu::always_inline]] inline const f32u& block(const float* a) {
  return *reinterpret_cast<const f32u*>(a);
}
[[gnu::always_inline]] inline f32u& block(float* a) { return *reinterpret_cast<f32u*>(a); }

/// Stores f's floats as doubles at out: one vcvtps2pd where the ISA has a full-width one (GCC
/// 12 splits __builtin_convertvector's into halves and joins them: four instructions).
[[gnu::always_inline]] inline void store_widened(const f32w& f, double* out) {
#if defined(__AVX512F__)
  // (the zero-masked form: GCC 12 takes the unmasked one's undefined source for uninitialised)
  block(out).v = (f64w)_mm512_maskz_cvtps_pd(0xff, (__m256)f);
#elif defined(__AVX2__)
  block(out).v = (f64w)_mm256_cvtps_pd((__m128)f);
#else
  block(out).v = __builtin_convertvector(f, f64w);
#endif
}

/// A double or a vector of W doubles rounded to float(s).
[[gnu::always_inline]] inline float to_f32(double x) { return static_cast<float>(x); }
[[gnu::always_inline]] inline f32w to_f32(const f64w& x) {
  return __builtin_convertvector(x, f32w);
}

/// An 8-lane sum as W-lane vectors: part h holds lanes h * W .. h * W + W - 1 (loops add the
/// vector at e + h * W, e a multiple of 8, to part[h] in an inner loop the compiler unrolls:
/// a constant index keeps the parts in registers).
struct lanes8 {
  f64w part[8 / W] = {};
  /// The sum of the 8 lanes folded as math::fold_sum folds an f64x8: (l + l+4), (+2), (+1).
  [[nodiscard]] double fold() const {
#if defined(__AVX512F__)
    return math::fold_sum(part[0]);
#elif defined(__AVX__)
    const f64w c = part[0] + part[1];
    return (c[0] + c[2]) + (c[1] + c[3]);
#else
    const f64w f = (part[0] + part[2]) + (part[1] + part[3]);
    return f[0] + f[1];
#endif
  }
};

/// Multiplies the pad lanes of the vector at element i (lanes past a row of n) by 0 (v
/// finite): a multiply by a mask from a table, not a lane loop or a ?: (both go through
/// memory in GCC's hands).
[[gnu::always_inline]] inline void zero_pads(f64w& v, std::int32_t i, std::int32_t n) {
  alignas(64) static constexpr double ones_then_zeros[16] = {1, 1, 1, 1, 1, 1, 1, 1,
                                                             0, 0, 0, 0, 0, 0, 0, 0};
  const std::int32_t live = std::clamp(n - i, 0, 8);
  v *= block(ones_then_zeros + 8 - live).v;
}
/// x = m ? a : x, lane-wise, as bit operations (see zero_pads).
[[gnu::always_inline]] inline void select_lanes(f64w& x, const i64w& m, const f64w& a) {
  x = __builtin_bit_cast(f64w,
                         (__builtin_bit_cast(i64w, x) & ~m) | (__builtin_bit_cast(i64w, a) & m));
}
/// x, through an empty asm statement: the loops over the k choices write their values one
/// choice at a time, and the next step reads them back; at -O3 GCC vectorised those loops
/// (k = 2 too), whose vector loads then waited on the scalar stores before them (the
/// Megatron logit gradient 9 % slower than at -O2). A loop holding an asm is left scalar.
[[gnu::always_inline]] inline double scalar_choice(double x) {
#if defined(__SSE2__)
  __asm__("" : "+x"(x));
#elif defined(__aarch64__)
  __asm__("" : "+w"(x));
#endif
  return x;
}
/// The sum of f(0..k-1), lane j % 8 holding f(j), folded as math::fold_sum: the bits an
/// 8-lane sum gives, in scalar code (for the k choices' few values).
template <class F>
[[gnu::always_inline]] inline double choice_sum(std::int32_t k, F&& f) {
  double acc[8] = {};
  for (std::int32_t j = 0; j < k; ++j) acc[j & 7] += f(j);
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}
/// The largest of the row x (pads -FLT_MAX; n a multiple of 8), from -FLT_MAX as the
/// reference's: exact. One running maximum per vector of a block of 8 (below AVX-512 one
/// chain of compare + select per vector was the pass's whole cost); the order a maximum is
/// taken in cannot change it (no NaN here, and a -0 / +0 tie gives the same exps).
[[gnu::always_inline]] inline double max_row(const double* x, std::int32_t n) {
  f64w mv[8 / W];
  for (auto& m : mv) m = f64w{} - static_cast<double>(FLT_MAX);
  for (std::int32_t e = 0; e < n; e += 8)
    for (std::int32_t h = 0; h < 8 / W; ++h) {
      const f64w v = block(x + e + h * W).v;
      select_lanes(mv[h], v > mv[h], v);
    }
  for (std::int32_t h = 1; h < 8 / W; ++h) select_lanes(mv[0], mv[h] > mv[0], mv[h]);
  double m = mv[0][0];
  for (std::int32_t l = 1; l < W; ++l) m = mv[0][l] > m ? mv[0][l] : m;
  return m;
}
/// out = exp(x - m) over the row (pads 0); returns the sum of out in lanes8. With `gp`, also
/// gp_dot = the sum of gp * out in the same lanes. The exps go four vectors at a time
/// (math::exp_lanes' lock-step); `moderate`: every element of the row's whole vectors has
/// x - m >= -700, and those take exp_lanes' moderate path (a vector holding pads, whose x is
/// -FLT_MAX, the full one). The same bits either way.
inline double exps_row(const double* x, std::int32_t n, double m, double* out,
                       const double* gp = nullptr, double* gp_dot = nullptr,
                       bool moderate = false) {
  constexpr std::int32_t exp_group = 4;
  const std::int32_t n8 = (n + 7) & ~7;
  lanes8 acc, dot;
  // (h: the vector's place in its block of 8, a constant where the loops below unroll, so the
  // parts stay in registers; i a multiple of 8 where each loop starts)
  const auto finish = [&](std::int32_t i, std::int32_t h, f64w & v) __attribute__((always_inline)) {
    block(out + i).v = v;
    acc.part[h] += v;
    if (gp != nullptr) dot.part[h] += block(gp + i).v * v;
  };
  std::int32_t i = 0;  // (a group is whole blocks of 8: 4 W is 8, 16 or 32)
  for (; i + exp_group * W <= n8; i += exp_group * W) {
    f64w v[exp_group];
    math::each_lane_vector<exp_group>([&](auto j) __attribute__((always_inline)) {
      v[j] = block(x + i + j * W).v - m;
    });
    if (i + exp_group * W <= n) {  // no pads
      if (moderate) {
        math::exp_lanes<exp_group, true>(v);
      } else {
        math::exp_lanes(v);
      }
    } else {
      math::exp_lanes(v);
      math::each_lane_vector<exp_group>([&](auto j) __attribute__((always_inline)) {
        zero_pads(v[j], i + j * W, n);
      });
    }
    math::each_lane_vector<exp_group>([&](auto j) __attribute__((always_inline)) {
      finish(i + j * W, j % (8 / W), v[j]);
    });
  }
  for (; i < n8; i += 8)
    for (std::int32_t h = 0; h < 8 / W; ++h) {
      f64w v[1] = {block(x + i + h * W).v - m};
      if (moderate && i + h * W + W <= n) {
        math::exp_lanes<1, true>(v);
      } else {
        math::exp_lanes(v);
        if (i + h * W + W > n) zero_pads(v[0], i + h * W, n);
      }
      finish(i + h * W, h, v[0]);
    }
  if (gp_dot != nullptr) *gp_dot = dot.fold();
  return acc.fold();
}

template <class Element>
struct gating_backward_agent {
  const routing_config& cfg;
  const gating_backward_params<Element>& p;
  std::int32_t E, k;
  score_function score;
  bool softmax_after, before_drop, after_drop, noisy_gates, row_path, column_path = false;
  double routing_weight, aux_weight = 0.0, seq_weight = 0.0, z_weight = 0.0;
  // seq_divisor: the sequences with a valid token (sequence_reduction::mean) or 1 (sum)
  std::int64_t sequences = 0, seq_len = 0, seq_divisor = 0, valid_tokens = 0;

  gating_backward_agent(const routing_config& c, const gating_backward_params<Element>& params)
      : cfg(c), p(params) {
    const auto& g = cfg.gating;
    E = cfg.num_experts;
    k = cfg.top_k;
    score = g.score;
    softmax_after = g.score == score_function::softmax && g.stage == softmax_stage::after_topk;
    before_drop = g.renorm == renormalize::before_drop && !softmax_after;
    after_drop = g.renorm == renormalize::after_drop;
    noisy_gates = cfg.noise_active() && g.noise.target == noise_target::selection_and_gates;
    row_path = E <= gating_backward_row_max && k <= gating_backward_row_max_k;
    routing_weight = p.weights.routing;
    const double scale = aux_loss_scale(cfg);
    if (p.weights.aux != 0.0 && cfg.loss.aux_coefficient != 0.0f)
      aux_weight = p.weights.aux * cfg.loss.aux_coefficient * scale;
    if (cfg.loss.sequence_length > 0 && p.weights.sequence_aux != 0.0 &&
        cfg.loss.aux_coefficient != 0.0f && p.gated.sums.d_seq_count != nullptr) {
      sequences = p.tokens / cfg.loss.sequence_length;
      seq_len = cfg.loss.sequence_length;
      seq_weight = p.weights.sequence_aux * cfg.loss.aux_coefficient * scale;
      for (std::int64_t i = 0; i < sequences; ++i)
        seq_divisor += p.gated.sums.d_seq_tokens[i] > 0 ? 1 : 0;
      if (cfg.loss.sequence_reduce == sequence_reduction::sum && seq_divisor > 0) seq_divisor = 1;
    }
    z_weight = cfg.loss.z_coefficient != 0.0f ? p.weights.z * cfg.loss.z_coefficient : 0.0;
    valid_tokens = p.gated.sums.d_valid_tokens ? *p.gated.sums.d_valid_tokens : p.tokens;
    column_path = row_path && E <= 8 && k <= 8 && score == score_function::softmax &&
                  !noisy_gates && seq_weight == 0.0;
  }

  /// The upstream d weight of choice j: 0 for a dropped assignment (weight 0 whatever the
  /// logits), routing * d weight rounded to float as the reference scales it.
  [[nodiscard]] double d_weight(std::int64_t t, std::int32_t j) const {
    if (!holds_row(p.dispatched.d_fate[t * k + j])) return 0.0;
    const float gw = p.d_grad_weight[t * k + j];
    return routing_weight == 1.0 ? static_cast<double>(gw)
                                 : static_cast<double>(static_cast<float>(routing_weight * gw));
  }

  /// The batch and sequence aux terms' per-token constants (see token()).
  struct loss_terms {
    const std::int64_t* aux_count = nullptr;
    bool aux = false, seq = false, zl = false;
    std::int64_t q = 0;  ///< the token's sequence
    double seq_base = 0.0, seq_L2 = 1.0, c_aux = 0.0, c_z = 0.0;
    /// d loss / d P(e) of the sequence aux term
    [[nodiscard]] double gp_seq(const std::int64_t* seq_count, std::int32_t experts,
                                std::int32_t e) const {
      return seq_base * static_cast<double>(seq_count[q * experts + e]) / seq_L2;
    }
  };
  [[nodiscard]] loss_terms losses_of(std::int64_t t) const {
    loss_terms l;
    l.aux_count = aux_weight != 0.0 ? p.gated.sums.d_aux_count : nullptr;
    l.aux = l.aux_count != nullptr;
    l.zl = z_weight != 0.0;
    l.q = seq_len > 0 ? sequence_of_token(cfg.loss.sequence_order, t, sequences, seq_len) : 0;
    const double Ls = seq_len > 0 ? static_cast<double>(p.gated.sums.d_seq_tokens[l.q]) : 0.0;
    l.seq = seq_weight != 0.0 && seq_divisor > 0 && Ls > 0.0;
    l.seq_base = l.seq ? seq_weight / static_cast<double>(seq_divisor) : 0.0;
    l.seq_L2 = l.seq ? Ls * Ls : 1.0;
    const double Tn = static_cast<double>(valid_tokens);
    l.c_aux = aux_weight / (Tn * Tn);
    l.c_z = z_weight * 2.0 / Tn;
    return l;
  }

  /// One token's row of d logits: zero for padding, else the row path or the element path
  /// (the column path takes whole groups of tokens: column_groups).
  void token(std::int64_t t, gating_backward_row* row) const {
    float* out = p.d_grad_logits + t * E;
    const bool valid = p.d_valid == nullptr || p.d_valid[t] != 0;
    if (!valid || valid_tokens == 0) {
      if (!p.accumulate) std::fill(out, out + E, 0.0f);
      return;
    }
    if (row != nullptr) {
      row_token(t, *row);
    } else {
      element_token(t);
    }
  }

  /// The row path, in vectors of W lanes over rows padded to blocks of 8 (GCC / Clang generic
  /// vectors, math::exp_lanes in double): a pass loading the logits, one making the exps with
  /// their sums and the aux dot, the k choices' scalars, and one pass adding every term, each
  /// rounded to float in the reference's order. The reference's formulas; its sums over experts are
  /// in 8 lanes here, a softmax is exp * (1 / sum), and its exp / log are math::exp_lanes /
  /// math::log (within 1e-15 relative of libm's): the result agrees with it to ~1e-15 relative
  /// before the float rounding. Fixed lanes, so the bits do not depend on the ISA or the thread
  /// count.
  void row_token(std::int64_t t, gating_backward_row& s) const {
    constexpr std::int32_t max_k = gating_backward_row_max_k;
    const std::int32_t E8 = (E + 7) & ~7;
    float* out = p.d_grad_logits + t * E;
    const auto& g = cfg.gating;
    const std::int32_t* ids = p.gated.d_ids != nullptr ? p.gated.d_ids + t * k : nullptr;
    const Element* row = p.d_logits + t * E;
    const bool softmax = score == score_function::softmax;
    const loss_terms L = losses_of(t);
    if (!s.ready) {  // once per task: the aux loss's dL/dP
      for (std::int32_t e = 0; e < E8; ++e)
        s.gp_aux[e] = L.aux && e < E ? L.c_aux * static_cast<double>(L.aux_count[e]) : 0.0;
      std::fill(s.chosen_in, s.chosen_in + E, std::int64_t{-1});
      s.ready = true;
    }
    if (L.seq && s.seq_q != L.q) {
      for (std::int32_t e = 0; e < E8; ++e)
        s.gp_seq[e] = e < E ? L.gp_seq(p.gated.sums.d_seq_count, E, e) : 0.0;
      s.seq_q = L.q;
    }
    // ---- pass 1: the clean logits (pads -FLT_MAX) and whether any was NaN / Inf; the
    // smallest clean logit of the whole vectors (for exps_row's `moderate`) and the row's
    // largest, in max_row's lanes and order: widening keeps the order, so the same value (a
    // -0 / +0 tie included), without a pass over the doubles on the row's critical path
    i32w exponents = {};  // the largest exponent field seen, per lane
    f32w lowest = f32w{} + FLT_MAX;
    f32w highest[8 / W];
    for (auto& m : highest) m = f32w{} - FLT_MAX;
    const auto take = [&](std::int32_t i, std::int32_t h, f32w f, bool whole)
        __attribute__((always_inline)) {
      const i32w exponent = __builtin_bit_cast(i32w, f) & 0x7F800000;
      exponents = exponent > exponents ? exponent : exponents;
#if defined(__AVX2__) && defined(__FMA__)
      f = math::clamp(f, -FLT_MAX, FLT_MAX);  // sanitize_lanes' two selects as maxps / minps
#else
      f = math::sanitize_lanes(f);
#endif
      if (whole) lowest = f < lowest ? f : lowest;
      highest[h] = f > highest[h] ? f : highest[h];
      store_widened(f, s.x + i);
    };
    const std::int32_t whole_blocks = E / 8 * 8;
    // the d logits row two tokens on, fetched for writing as this row's logits are read: the
    // row's stores had waited on their lines (Switch's gradient 2.20-2.26 -> 1.86-1.93 ns per
    // logit, DeepSeek-V3 4.0-4.2 -> 3.6-3.8; prefetching the logits instead changed nothing)
    float* const out_ahead = t + 2 < p.tokens ? out + 2 * E : nullptr;
    for (std::int32_t e = 0; e < whole_blocks; e += 8) {
      if (out_ahead != nullptr && e % 16 == 0) __builtin_prefetch(out_ahead + e, 1, 3);
      for (std::int32_t h = 0; h < 8 / W; ++h) {
        f32w f;
        for (std::int32_t l = 0; l < W; ++l) f[l] = math::load(row[e + h * W + l]);
        take(e + h * W, h, f, true);
      }
    }
    if (whole_blocks < E8)  // the last block, partly pads
      for (std::int32_t h = 0; h < 8 / W; ++h) {
        const std::int32_t i = whole_blocks + h * W;
        f32w f;
        for (std::int32_t l = 0; l < W; ++l) f[l] = i + l < E ? math::load(row[i + l]) : -FLT_MAX;
        take(i, h, f, i + W <= E);
      }
    for (std::int32_t h = 1; h < 8 / W; ++h)
      highest[0] = highest[h] > highest[0] ? highest[h] : highest[0];
    bool any_nonfinite = false;
    float row_lowest = FLT_MAX, row_highest = highest[0][0];
    for (std::int32_t l = 0; l < W; ++l) {
      any_nonfinite = any_nonfinite || exponents[l] == 0x7F800000;
      row_lowest = lowest[l] < row_lowest ? lowest[l] : row_lowest;
      if (l > 0) row_highest = highest[0][l] > row_highest ? highest[0][l] : row_highest;
    }
    const double* xg = s.x;  // the gate logits
    if (noisy_gates) {
      for (std::int32_t e = 0; e < E; ++e) {
        const float z = rng::gating_noise(g.noise.seed, g.noise.offset,
                                          g.noise.kind == noise_kind::gaussian, t, E, e);
        s.xg[e] = bwd::sanitize(s.x[e] + static_cast<double>(g.noise.scale) * z);
      }
      std::fill(s.xg + E, s.xg + E8, -static_cast<double>(FLT_MAX));
      xg = s.xg;
    }
    // the upstream gradient of each choice (0 for a dropped one); `any`: the routing term
    // has work
    double dw[max_k], alive[max_k];
    bool any = false;
    if (p.d_grad_weight != nullptr && routing_weight != 0.0) {
      for (std::int32_t j = 0; j < k; ++j) {
        alive[j] = holds_row(p.dispatched.d_fate[t * k + j]) ? 1.0 : 0.0;
        dw[j] = d_weight(t, j);
        any = any || dw[j] != 0.0;
      }
    }
    // ---- pass 2: the exps of x for the losses (and the gates, without noise), of xg for
    // the gates with noise; with a softmax score the aux dots in the same pass
    const bool need_soft = L.zl || ((L.aux || L.seq) && softmax);
    const bool need_gsoft = any && softmax && !softmax_after;
    double cm = 0.0, inv = 0.0, lse = 0.0, dot_aux = 0.0, dot_seq = 0.0;
    if (need_soft || (need_gsoft && !noisy_gates)) {
      cm = static_cast<double>(row_highest);  // max_row(s.x, E8)
      const bool dots = (L.aux || L.seq) && softmax;
      // x - cm is at most 0; at least -700 for every whole vector when the lowest is
      // (rounding is monotonic): exp's clamp and subnormal scaling are then not needed
      const bool moderate = static_cast<double>(row_lowest) - cm >= -700.0;
      const double sum =
          exps_row(s.x, E, cm, s.ex, dots && L.aux ? s.gp_aux : nullptr, &dot_aux, moderate);
      inv = 1.0 / sum;  // (softmax = exp * inv: a multiply per element, not a divide)
      dot_aux *= inv;
      if (dots && L.seq) {
        lanes8 acc;
        for (std::int32_t e = 0; e < E8; e += 8)
          for (std::int32_t h = 0; h < 8 / W; ++h)
            acc.part[h] += block(s.gp_seq + e + h * W).v * block(s.ex + e + h * W).v;
        dot_seq = acc.fold() * inv;
      }
      lse = cm + math::log(sum);
    }
    const double* gex = s.ex;  // the gates' exps and 1 / sum
    double ginv = inv;
    if (need_gsoft && noisy_gates) {
      ginv = 1.0 / exps_row(xg, E, max_row(xg, E8), s.gex);
      gex = s.gex;
    }
    // ---- a per-expert score and its derivative at x, for the aux terms (pads 0)
    double p_scale = 1.0;  // P(e) = sc(e) * p_scale for a per-expert score
    const bool have_sc = (L.aux || L.seq) && !softmax;
    if (have_sc) {
      lanes8 acc, da, ds;
      for (std::int32_t e = 0; e < E8; e += 8)
        for (std::int32_t h = 0; h < 8 / W; ++h) {
          const std::int32_t i = e + h * W;
          f64w sc, dv;
          if (score == score_function::sigmoid) {
            f64w em = -block(s.x + i).v;
            math::exp_lanes(em);
            sc = 1.0 / (1.0 + em);
            dv = sc * (1.0 - sc);
          } else {
            for (std::int32_t l = 0; l < W; ++l) {
              sc[l] = bwd::score(score, s.x[i + l]);
              dv[l] = bwd::score_deriv(score, s.x[i + l], sc[l]);
            }
          }
          if (i + W > E) {
            zero_pads(sc, i, E);
            zero_pads(dv, i, E);
          }
          block(s.sc + i).v = sc;
          block(s.dv + i).v = dv;
          acc.part[h] += sc;
          da.part[h] += block(s.gp_aux + i).v * sc;
          if (L.seq) ds.part[h] += block(s.gp_seq + i).v * sc;
        }
      p_scale = 1.0 / (acc.fold() + 1e-20);
      dot_aux = da.fold() * p_scale;
      dot_seq = ds.fold() * p_scale;
    }
    const auto score_at = [&](std::int32_t e) {  // score(xg[e]), reusing sc without noise
      if (have_sc && !noisy_gates) return s.sc[e];
      if (score == score_function::sigmoid) return 1.0 / (1.0 + math::exp(-xg[e]));
      return bwd::score(score, xg[e]);
    };
    // ---- the routing term's scalars over the k choices, and its part at each chosen expert
    // into ct (a repeated id adds twice, as the reference's scan does); the dense part
    // -s(e) dot3 of a softmax score is added in pass 3
    double dense = 0.0;    // the routing term is dense * gsoft(e) + the chosen parts at e
    double chosen[max_k];  // choice j's part of the routing term at its expert ids[j]
#if defined(MOEROUTE_CPU_CHOICE_LANES)
    // AVX-512, at most 8 choices, no after-drop renormalisation, and a softmax score before
    // top-k (OLMoE, Qwen3, Switch) or a sigmoid one whose scores the aux terms made
    // (DeepSeek-V3): the choices are the lanes of one vector (pads 0), their sums
    // fold_sum(v + 0.0) (choice_sum's lanes and order: each lane from +0), every other step
    // the scalar one lane-wise: the same bits. The chosen parts are then made by gathers
    // (pass 3's vector patch).
    const bool sigmoid_sc = score == score_function::sigmoid && have_sc && !noisy_gates;
    const bool lanes = any && ((softmax && !softmax_after) || sigmoid_sc) && !after_drop && k <= 8;
    const auto live = static_cast<__mmask8>(k >= 8 ? 0xffu : (1u << k) - 1u);  // (k may be 64)
    const __m256i id_lanes = lanes ? _mm256_maskz_loadu_epi32(live, ids) : __m256i{};
    const auto gather = [&](const double* a) __attribute__((always_inline)) {
      return (f64w)_mm512_mask_i32gather_pd(_mm512_setzero_pd(), live, id_lanes, a, 8);
    };
    f64w chosen_v = {};
    if (lanes) {
      const auto fold = [](const f64w& v) __attribute__((always_inline)) {
        return math::fold_sum(v + 0.0);
      };
      // d_weight's lanes: the gradient where the fate holds a row, else 0
      const __m128i fb = _mm_maskz_loadu_epi8(live, p.dispatched.d_fate + t * k);
      const __m256i f32 = _mm256_cvtepu8_epi32(fb);
      const __mmask8 held =
          _mm256_mask_cmpeq_epi32_mask(live, f32, _mm256_set1_epi32(static_cast<int>(fate::kept))) |
          _mm256_mask_cmpeq_epi32_mask(live, f32,
                                       _mm256_set1_epi32(static_cast<int>(fate::rerouted)));
      const __m256 gw = _mm256_maskz_loadu_ps(live, p.d_grad_weight + t * k);
      f64w dwv = (f64w)_mm512_maskz_cvtps_pd(0xff, gw);
      if (routing_weight != 1.0)
        dwv = (f64w)_mm512_maskz_cvtps_pd(0xff, (__m256)to_f32(routing_weight * dwv));
      dwv = (f64w)_mm512_maskz_mov_pd(held, (__m512d)dwv);
      const f64w hv = softmax ? gather(gex) * ginv : gather(s.sc);
      const double sf = static_cast<double>(g.scaling_factor);
      const double denom = before_drop ? fold(hv) + static_cast<double>(g.renorm_epsilon) : 1.0;
      const double inv_denom = denom > 0.0 ? 1.0 / denom : 0.0;
      const f64w dgpre = sf * dwv;
      const double dot2 = before_drop ? fold(dgpre * hv) : 0.0;
      const double dot2_d2 = dot2 * inv_denom * inv_denom;
      const f64w dh = before_drop ? dgpre * inv_denom - dot2_d2 : dgpre;
      if (softmax) {
        dense = -fold(dh * hv);
        chosen_v = hv * dh;
      } else {
        chosen_v = dh * gather(s.dv);  // dh * score_deriv: dv is sc * (1 - sc)
      }
      block(chosen).v = chosen_v;  // (the scalar patch's, for a row with a repeated id)
    }
#else
    constexpr bool lanes = false;
#endif
    if (any && !lanes) {
      // the choices' gates h; the sums over j in 8 lanes, as over the experts
      double h[max_k], dgpre[max_k], dh[max_k];
      if (softmax_after) {
        double gm = -static_cast<double>(FLT_MAX), gsum = 0.0;
        for (std::int32_t j = 0; j < k; ++j) gm = std::fmax(gm, xg[ids[j]]);
        // the row's exps are these when the best choice is the row's max (no bias, no noise)
        const bool reuse = need_soft && !noisy_gates && gm == cm;
        for (std::int32_t j = 0; j < k; ++j) {
          h[j] = reuse ? s.ex[ids[j]] : math::exp(xg[ids[j]] - gm);
          gsum += h[j];
        }
        const double inv_gsum = 1.0 / gsum;
        for (std::int32_t j = 0; j < k; ++j) h[j] = scalar_choice(h[j] * inv_gsum);
      } else {
        for (std::int32_t j = 0; j < k; ++j) h[j] = softmax ? gex[ids[j]] * ginv : score_at(ids[j]);
      }
      // (scalar over j: h was just stored element by element, and a vector load of it would
      // wait for those stores; the sums fold 8 lanes as math::fold_sum, the same bits)
      const double sf = static_cast<double>(g.scaling_factor);
      // before-drop renormalisation: the gates are h / denom
      const double denom = before_drop ? choice_sum(k, [&](std::int32_t j) { return h[j]; }) +
                                             static_cast<double>(g.renorm_epsilon)
                                       : 1.0;
      const double inv_denom = denom > 0.0 ? 1.0 / denom : 0.0;
      // after-drop renormalisation (never with before-drop): S, the held gates' sum, clamped
      // to FLT_EPSILON; dw is 0 for a dropped choice
      double inv_D = 0.0, dot_w_D2 = 0.0;
      if (after_drop) {
        const double S = choice_sum(k, [&](std::int32_t j) { return alive[j] * h[j]; });
        const double dot_w = choice_sum(k, [&](std::int32_t j) { return dw[j] * h[j]; });
        const double D =
            S > static_cast<double>(FLT_EPSILON) ? S : static_cast<double>(FLT_EPSILON);
        inv_D = 1.0 / D;
        dot_w_D2 = S < static_cast<double>(FLT_EPSILON) ? 0.0 : dot_w * inv_D * inv_D;
      }
      for (std::int32_t j = 0; j < k; ++j)
        dgpre[j] =
            scalar_choice(after_drop ? alive[j] * (sf * (dw[j] * inv_D - dot_w_D2)) : sf * dw[j]);
      // dot2 (before-drop) and softmax-after's dot3 are both sum dgpre * h
      const double dgh = choice_sum(k, [&](std::int32_t j) { return dgpre[j] * h[j]; });
      const double dot2 = before_drop ? dgh : 0.0;
      const double dot2_d2 = dot2 * inv_denom * inv_denom;
      for (std::int32_t j = 0; j < k; ++j)
        dh[j] = scalar_choice(before_drop ? dgpre[j] * inv_denom - dot2_d2 : dgpre[j]);
      double dot3 = 0.0;
      if (softmax_after) {
        dot3 = dgh;
      } else if (softmax) {
        dot3 = choice_sum(k, [&](std::int32_t j) { return dh[j] * h[j]; });
        dense = -dot3;
      }
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int32_t e = ids[j];
        if (softmax_after) {
          chosen[j] = h[j] * (dgpre[j] - dot3);
        } else if (softmax) {
          chosen[j] = h[j] * dh[j];
        } else {
          chosen[j] = dh[j] * bwd::score_deriv(score, xg[e], score_at(e));
        }
      }
    }
    // ---- pass 3: every term per block, each rounded to float and added in the reference's
    // order (routing, aux, sequence-aux, z); dL/dx(e) from dL/dP(e) = gp and the row's dot:
    // softmax s(e) (gp - dot), a per-expert score score'(x) (gp - dot) / (ssum + 1e-20)
    const double czl = L.c_z * lse;
    const double gdense = ginv * dense;
    // One loop per combination of the terms a row has (as constants): GCC kept the loop whole,
    // testing every flag and broadcasting every scalar again per block (about 48 instructions
    // a block of 4 on AVX2 where the terms take 15). The chosen experts' parts of the routing
    // term are not in that loop: it adds the rest (the dense part of a softmax before top-k,
    // with a chosen part of +0 as at every other expert; else +0), and each chosen expert's
    // element is then made again from its terms, one at a time, in the same order and
    // precision (the same bits). Adding the parts into a row the loop read took scalar stores
    // that the loop's vector loads then waited on (a store is not forwarded to a wider load):
    // Megatron (64, 2) is 7 % faster this way, rows of 8 choices 5 % slower (k scalar
    // elements); both ways in one function, chosen by k, made both slower.
    enum routing_part { no_routing, chosen_only, dense_and_chosen };
    const auto pass3 = [&](auto routing_c, auto aux_c, auto z_c) __attribute__((always_inline)) {
      constexpr routing_part routing = decltype(routing_c)::value;
      constexpr bool aux = decltype(aux_c)::value, z = decltype(z_c)::value;
      // the terms at element(s) `at` (a block of W lanes or one element), added to v in the
      // reference's order: routing (`chosen_part`: the chosen parts there, +0 elsewhere), aux,
      // sequence-aux, z
      // (`fresh`: v is +0, the routing term the first added and its chosen part +0 — a
      // written row's whole vectors: +0 + float(y) is +0 + float(y + 0) for every y, -0
      // included, so the + 0 is left out, and a zero routing term is not added at all: one or
      // three operations of a vector's ~16; 1.5-3 % in a harness, best of 30, within
      // bench_cpu's noise on a noisy VM — backward_test checks the two bit for bit)
      const auto add_terms = [&](auto at, auto chosen_part, auto& v, auto fresh_c)
          __attribute__((always_inline)) {
        using D = decltype(chosen_part);
        constexpr bool fresh = decltype(fresh_c)::value;
        if constexpr (routing == dense_and_chosen) {
          if constexpr (fresh) {
            v += to_f32(at(gex) * gdense);
          } else {
            v += to_f32(at(gex) * gdense + chosen_part);
          }
        } else if constexpr (routing == chosen_only) {
          if constexpr (!fresh) v += to_f32(D{} + chosen_part);
        }
        D soft{};  // the softmax s(e) = ex * inv: the aux terms' factor and the z term's
        if (z || (softmax && (aux || L.seq))) soft = at(s.ex) * inv;
        if (aux || L.seq) {
          const D fac = softmax ? soft : at(s.dv) * p_scale;
          if (aux) v += to_f32(fac * (at(s.gp_aux) - dot_aux));
          if (L.seq) v += to_f32(fac * (at(s.gp_seq) - dot_seq));
        }
        if constexpr (z) v += to_f32(czl * soft);
      };
      const auto block_terms = [&](std::int32_t i, f32w & v, auto fresh_c)
          __attribute__((always_inline)) {
        add_terms(
            [i](const double* a) __attribute__((always_inline)) { return block(a + i).v; }, f64w{},
            v, fresh_c);
      };
      // the chosen elements' values before the loop writes them (accumulating into out)
      float before[max_k];
#if defined(MOEROUTE_CPU_CHOICE_LANES)
      f32w before_v = {};
      if (lanes && p.accumulate)
        before_v = (f32w)_mm256_mmask_i32gather_ps(_mm256_setzero_ps(), live, id_lanes, out, 4);
#endif
      if (routing != no_routing && p.accumulate && !lanes)
        for (std::int32_t j = 0; j < k; ++j) before[j] = out[ids[j]];
      // whole vectors to out (to res when the row has a non-finite logit), the tail to res
      float* const to = any_nonfinite ? s.res : out;
      const std::int32_t whole = E / W * W;
      std::int32_t i = 0;
      if (p.accumulate) {
        for (; i < whole; i += W) {
          f32w v = block(out + i).v;
          block_terms(i, v, std::false_type{});
          block(to + i).v = v;
        }
      } else {
        for (; i < whole; i += W) {
          f32w v = {};
          block_terms(i, v, std::true_type{});
          block(to + i).v = v;
        }
      }
      for (; i < E8; i += W) {
        f32w v = {};
        if (p.accumulate)
          for (std::int32_t l = 0; i + l < E; ++l) v[l] = out[i + l];
        block_terms(i, v, std::false_type{});
        block(s.res + i).v = v;
      }
      if constexpr (routing != no_routing) {
        // an id named twice in a token (an engine's own ids may): its parts add up, in choice
        // order, at its first choice (marks: the last token each expert was chosen in)
        bool repeated = false;
        for (std::int32_t j = 0; j < k; ++j) {
          repeated = repeated || s.chosen_in[ids[j]] == t;
          s.chosen_in[ids[j]] = t;
        }
#if defined(MOEROUTE_CPU_CHOICE_LANES)
        if (lanes) {
          if (!repeated) {  // every chosen element at once, the scalar patch's terms lane-wise
            f32w v = before_v;
            add_terms(gather, chosen_v + 0.0, v, std::false_type{});
            for (std::int32_t j = 0; j < k; ++j) (ids[j] < whole ? to : s.res)[ids[j]] = v[j];
            return;
          }
          if (p.accumulate)
            for (std::int32_t j = 0; j < k; ++j) before[j] = before_v[j];
        }
#endif
        for (std::int32_t j = 0; j < k; ++j) {
          const std::int32_t e = ids[j];
          double part = 0.0 + chosen[j];  // (a sum over the expert's choices, from +0)
          if (repeated) {
            bool first = true;
            for (std::int32_t q = 0; q < j; ++q) first = first && ids[q] != e;
            if (!first) continue;
            part = 0.0;
            for (std::int32_t q = j; q < k; ++q)
              if (ids[q] == e) part += chosen[q];
          }
          float v = p.accumulate ? before[j] : 0.0f;
          add_terms(
              [e](const double* a) __attribute__((always_inline)) { return a[e]; }, part, v,
              std::false_type{});
          (e < whole ? to : s.res)[e] = v;
        }
      }
    };
    const auto with_z = [&](auto routing_c, auto aux_c) __attribute__((always_inline)) {
      if (L.zl) {
        pass3(routing_c, aux_c, std::true_type{});
      } else {
        pass3(routing_c, aux_c, std::false_type{});
      }
    };
    const auto with_aux = [&](auto routing_c) __attribute__((always_inline)) {
      if (L.aux) {
        with_z(routing_c, std::true_type{});
      } else {
        with_z(routing_c, std::false_type{});
      }
    };
    using std::integral_constant;
    if (!any) {
      with_aux(integral_constant<routing_part, no_routing>{});
    } else if (softmax && !softmax_after) {
      with_aux(integral_constant<routing_part, dense_and_chosen>{});
    } else {
      with_aux(integral_constant<routing_part, chosen_only>{});
    }
    // the tail vector went to res; with a non-finite logit every vector did, and such an
    // element gets no gradient: it keeps what it held (a rare row)
    if (!any_nonfinite) {
      for (std::int32_t e = E / W * W; e < E; ++e) out[e] = s.res[e];
    } else {
      for (std::int32_t e = 0; e < E; ++e)
        if (math::nonfinite(math::load(row[e])) == 0) {
          out[e] = s.res[e];
        } else if (!p.accumulate) {
          out[e] = 0.0f;
        }
    }
  }

  /// The column path, for rows of at most 8 experts with softmax scores and no noise or
  /// sequence aux loss (Mixtral): W tokens side by side, one per vector lane, each expert and
  /// each choice one vector. A row of 8 is one vector, so the row path is a chain of dependent
  /// steps per token; here the chain's every step serves W tokens at once. The row path's
  /// operations in its order (sums folded as its 8 lanes are, the same selects and
  /// reciprocals), so a token gets the same bits in either path (backward_test checks it).
  ///
  /// A group's steps are still one chain of dependent steps (load, max, exps, sum,
  /// reciprocal, the choices' scalars, each term), longer than the core's reorder window
  /// reaches: taking the max by halves rather than expert by expert gained 3 %. So up to
  /// column_block groups go through each stage before the next stage starts — the loads and
  /// maxima, the softmax, the routing scalars, the terms — their state in a column_state
  /// each: a stage's groups are independent chains the core overlaps. Measured on Mixtral
  /// (8, 2), one thread (docs/performance.md, session 37): AVX2 5.6 -> 4.9 ns per logit, on
  /// AVX-512 (twice the lanes, half the groups) within noise; 2 and 8 groups measured as 4.
  static constexpr std::int32_t column_block = 4;
  struct column_state {
    f64w x[8], ex[8], dw[8], alive[8], id[8], chosen[8];
    f64w cm, inv, lse, dot_aux, dense;
    i64w any;
    bool moderate;
  };

  /// Groups t0 + g W .. t0 + g W + W - 1 for g < groups (<= column_block) by the column path;
  /// returns the groups it did not take (bit g): a token of the group is padding or has a
  /// NaN / Inf logit, and the caller gives the group to the row path (nothing written).
  [[nodiscard]] std::uint32_t column_groups(std::int64_t t0, std::int32_t groups) const {
    constexpr std::int32_t n = 8;  // experts and choices, at most
    if (valid_tokens == 0) return (1u << groups) - 1u;
    const bool routing = p.d_grad_weight != nullptr && routing_weight != 0.0;
    const loss_terms L = losses_of(t0);  // (aux and z are per call without sequences)
    const bool need_soft = L.zl || L.aux;
    double gp_aux[n] = {};  // the aux loss's dL/dP at each expert
    if (L.aux)
      for (std::int32_t e = 0; e < E; ++e)
        gp_aux[e] = L.c_aux * static_cast<double>(L.aux_count[e]);
    column_state st[column_block];
    std::uint32_t skipped = 0;
    // ---- stage 1: load, the maxima and minima, each choice's d weight, fate and id
    for (std::int32_t g = 0; g < groups; ++g) {
      column_state& s = st[g];
      const std::int64_t tg = t0 + g * W;
      alignas(64) double xt[n][W];
      bool ok = true;
      if (p.d_valid != nullptr)
        for (std::int32_t l = 0; l < W; ++l) ok = ok && p.d_valid[tg + l] != 0;
      if (!ok || !load_columns(tg, xt)) {
        skipped |= 1u << g;
        continue;
      }
      s.any = i64w{};
      s.dense = f64w{};
      if (routing) {
        alignas(64) double dwt[n][W], alt[n][W], idt[n][W];
        for (std::int32_t l = 0; l < W; ++l) {
          const std::int64_t t = tg + l;
          for (std::int32_t j = 0; j < k; ++j) {
            dwt[j][l] = d_weight(t, j);
            alt[j][l] = holds_row(p.dispatched.d_fate[t * k + j]) ? 1.0 : 0.0;
            idt[j][l] = static_cast<double>(p.gated.d_ids[t * k + j]);
          }
        }
        for (std::int32_t j = 0; j < k; ++j) {
          s.dw[j] = block(dwt[j]).v;
          s.alive[j] = block(alt[j]).v;
          s.id[j] = block(idt[j]).v;
          s.any |= s.dw[j] != 0.0;
        }
      }
      for (std::int32_t e = 0; e < E; ++e) s.x[e] = block(xt[e]).v;
      // the max and the least by halves (a chain of 3, not E; the order cannot change a max)
      f64w hi[n], lo[n];
      for (std::int32_t e = 0; e < n; ++e) hi[e] = lo[e] = s.x[e < E ? e : 0];
      for (std::int32_t w = n / 2; w >= 1; w /= 2)
        for (std::int32_t e = 0; e < w; ++e) {
          select_lanes(hi[e], hi[e + w] > hi[e], hi[e + w]);
          select_lanes(lo[e], lo[e + w] < lo[e], lo[e + w]);
        }
      s.cm = hi[0];
      s.moderate = true;
      for (std::int32_t l = 0; l < W; ++l) s.moderate = s.moderate && lo[0][l] - s.cm[l] >= -700.0;
    }
    // ---- stage 2: the softmax: exps, their sum folded as the row path's 8 lanes, the aux
    // dot, the logsumexp
    for (std::int32_t g = 0; g < groups; ++g) {
      if ((skipped >> g & 1u) != 0) continue;
      column_state& s = st[g];
      f64w lane[8], dot[8];
      for (std::int32_t e = 0; e < 8; ++e) {
        lane[e] = f64w{};
        dot[e] = f64w{};
        s.ex[e] = e < E ? s.x[e] - s.cm : f64w{};
      }
      // the exps of all 8 in lock-step, by the moderate path where every x - max >= -700
      // (the row path's test: the same bits either way)
      if (s.moderate) {
        math::exp_lanes<n, true>(s.ex);
      } else {
        math::exp_lanes<n>(s.ex);
      }
      for (std::int32_t e = 0; e < E; ++e) {
        lane[e] = f64w{} + s.ex[e];
        if (L.aux) dot[e] = f64w{} + gp_aux[e] * s.ex[e];
      }
      f64w sum;
      fold8(lane, sum);
      fold8(dot, s.dot_aux);
      s.inv = 1.0 / sum;
      s.dot_aux *= s.inv;
      s.lse = sum;
      math::log_lanes(s.lse);
      s.lse = s.cm + s.lse;
    }
    // ---- stage 3: the routing term's scalars, per lane (used where `any`)
    if (routing)
      for (std::int32_t g = 0; g < groups; ++g)
        if ((skipped >> g & 1u) == 0) routing_scalars(st[g], need_soft);
    // ---- stage 4 per expert: each term rounded to float and added in the reference's order
    for (std::int32_t g = 0; g < groups; ++g) {
      if ((skipped >> g & 1u) != 0) continue;
      const column_state& s = st[g];
      float* const rows = p.d_grad_logits + (t0 + g * W) * E;
      const f64w gdense = s.inv * s.dense, czl = L.c_z * s.lse;
      alignas(64) float vt[n][W];
      if (p.accumulate) transpose_rows(rows, vt);
      const i32w keep = __builtin_convertvector(s.any, i32w);  // lanes with a routing term
      f64w chosen[n];  // (0 + chosen: the sum over an expert's choices starts from +0)
      for (std::int32_t j = 0; j < k; ++j) chosen[j] = f64w{} + s.chosen[j];
      for (std::int32_t e = 0; e < E; ++e) {
        f32w v = p.accumulate ? block(vt[e]).v : f32w{};
        if (routing) {
          f64w ct = {};
          for (std::int32_t j = 0; j < k; ++j)
            ct += __builtin_bit_cast(
                f64w, __builtin_bit_cast(i64w, chosen[j]) & (s.id[j] == static_cast<double>(e)));
          const f32w with = v + __builtin_convertvector(s.ex[e] * gdense + ct, f32w);
          v = keep != 0 ? with : v;
        }
        if (L.aux) v += __builtin_convertvector(s.ex[e] * s.inv * (gp_aux[e] - s.dot_aux), f32w);
        if (L.zl) v += __builtin_convertvector(czl * (s.ex[e] * s.inv), f32w);
        block(vt[e]).v = v;
      }
      store_rows(vt, rows);
    }
    return skipped;
  }

  /// The row path's 8-lane fold of v[0..7]: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
  static void fold8(const f64w (&v)[8], f64w& out) {
    out = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  }

  /// The column path's routing scalars of one group: s.dense and s.chosen (the row path's
  /// choice steps lane-wise).
  void routing_scalars(column_state& s, bool need_soft) const {
    constexpr std::int32_t n = 8;
    const auto& g = cfg.gating;
    f64w h[n], dgpre[n], dh[n];
    for (std::int32_t j = 0; j < k; ++j) {  // x and ex at each lane's chosen expert
      f64w xs = {}, es = {};
      for (std::int32_t e = 0; e < E; ++e) {
        const i64w at = s.id[j] == static_cast<double>(e);
        select_lanes(xs, at, s.x[e]);
        select_lanes(es, at, s.ex[e]);
      }
      h[j] = es;
      dgpre[j] = xs;  // (held here until the softmax after top-k below reads it)
    }
    if (softmax_after) {
      f64w gm = f64w{} - static_cast<double>(FLT_MAX), gsum = {};
      for (std::int32_t j = 0; j < k; ++j) select_lanes(gm, dgpre[j] > gm, dgpre[j]);
      // each lane's exps are the row's where its best choice is its max (no bias, no noise:
      // nearly every token): the choices' own exps only where a lane needs them (Mixtral's
      // gradient, one thread: AVX2 6.4 -> 5.6 ns per logit, AVX-512 3.45 -> 3.2)
      const i64w reuse = need_soft ? i64w{} + (gm == s.cm) : i64w{};
      bool all_reuse = true;
      for (std::int32_t l = 0; l < W; ++l) all_reuse = all_reuse && reuse[l] != 0;
      for (std::int32_t j = 0; j < k; ++j) {
        if (!all_reuse) {
          f64w own = dgpre[j] - gm;
          math::exp_lanes(own);
          select_lanes(own, reuse, h[j]);
          h[j] = own;
        }
        gsum += h[j];
      }
      const f64w inv_gsum = 1.0 / gsum;
      for (std::int32_t j = 0; j < k; ++j) h[j] = h[j] * inv_gsum;
    } else {
      for (std::int32_t j = 0; j < k; ++j) h[j] = h[j] * s.inv;
    }
    const auto choice_fold = [&](auto&& f, f64w& out) {
      f64w acc[8];
      for (std::int32_t j = 0; j < 8; ++j) acc[j] = f64w{};
      for (std::int32_t j = 0; j < k; ++j) f(j, acc[j]);
      fold8(acc, out);
    };
    const double sf = static_cast<double>(g.scaling_factor);
    f64w denom = f64w{} + 1.0, inv_denom, inv_D = {}, dot_w_D2 = {};
    if (before_drop) {
      choice_fold([&](std::int32_t j, f64w& a) { a += h[j]; }, denom);
      denom += static_cast<double>(g.renorm_epsilon);
    }
    inv_denom = 1.0 / denom;
    select_lanes(inv_denom, denom <= 0.0, f64w{});
    if (after_drop) {
      f64w S, dot_w;
      choice_fold([&](std::int32_t j, f64w& a) { a += s.alive[j] * h[j]; }, S);
      choice_fold([&](std::int32_t j, f64w& a) { a += s.dw[j] * h[j]; }, dot_w);
      f64w D = S;
      select_lanes(D, S <= static_cast<double>(FLT_EPSILON),
                   f64w{} + static_cast<double>(FLT_EPSILON));
      inv_D = 1.0 / D;
      dot_w_D2 = dot_w * inv_D * inv_D;
      select_lanes(dot_w_D2, S < static_cast<double>(FLT_EPSILON), f64w{});
    }
    for (std::int32_t j = 0; j < k; ++j)
      dgpre[j] = after_drop ? s.alive[j] * (sf * (s.dw[j] * inv_D - dot_w_D2)) : sf * s.dw[j];
    f64w dgh, dot3 = {};
    choice_fold([&](std::int32_t j, f64w& a) { a += dgpre[j] * h[j]; }, dgh);
    const f64w dot2_d2 = (before_drop ? dgh : f64w{}) * inv_denom * inv_denom;
    for (std::int32_t j = 0; j < k; ++j) {
      dh[j] = dgpre[j];
      if (before_drop) {
        dh[j] = dgpre[j] * inv_denom - dot2_d2;
        select_lanes(dh[j], denom <= 0.0, f64w{});
      }
    }
    if (softmax_after) {
      dot3 = dgh;
    } else {
      choice_fold([&](std::int32_t j, f64w& a) { a += dh[j] * h[j]; }, dot3);
      s.dense = -dot3;
    }
    for (std::int32_t j = 0; j < k; ++j)
      s.chosen[j] = softmax_after ? h[j] * (dgpre[j] - dot3) : h[j] * dh[j];
  }

  // The column path's transposes between W rows of E (<= 8) floats and E columns of W: with
  // E = 8 (Mixtral) an 8 x 8 transpose in registers (on AVX2, W = 4, its upper rows repeat
  // the lower and only W columns are kept), else element by element.

  /// xt[e][l] = the clean logit of token t0 + l at expert e; false when one is NaN or +-Inf.
  [[nodiscard]] bool load_columns(std::int64_t t0, double (&xt)[8][W]) const {
#if defined(MOEROUTE_CPU_TOKEN_COLUMNS)
    if (E == 8) {
      using columns::f32x8;
      using columns::i32x8;
      __m256 r[8];
      i32x8 special = {};  // all-ones exponent fields seen
      const i32x8 exponent = i32x8{} + 0x7F800000;
      for (std::int32_t l = 0; l < 8; ++l) {
        const f32x8 v = math::load_lanes<Element, 8>(p.d_logits + (t0 + l % W) * 8);
        special |= ((i32x8)v & exponent) == exponent;
        r[l] = (__m256)v;
      }
      if (_mm256_testz_si256((__m256i)special, (__m256i)special) == 0) return false;
      columns::transpose8(r);
      for (std::int32_t e = 0; e < 8; ++e) store_widened(low_lanes(r[e]), xt[e]);
      return true;
    }
#endif
    for (std::int32_t l = 0; l < W; ++l) {
      const Element* row = p.d_logits + (t0 + l) * E;
      for (std::int32_t e = 0; e < E; ++e) {
        const float f = math::load(row[e]);
        if (math::nonfinite(f) != 0) return false;
        xt[e][l] = static_cast<double>(math::sanitize(f));
      }
    }
    return true;
  }

  /// vt[e][l] = rows[l * E + e].
  void transpose_rows(const float* rows, float (&vt)[8][W]) const {
#if defined(MOEROUTE_CPU_TOKEN_COLUMNS)
    if (E == 8) {
      __m256 r[8];
      for (std::int32_t l = 0; l < 8; ++l) r[l] = _mm256_loadu_ps(rows + (l % W) * 8);
      columns::transpose8(r);
      for (std::int32_t e = 0; e < 8; ++e) block(vt[e]).v = low_lanes(r[e]);
      return;
    }
#endif
    for (std::int32_t l = 0; l < W; ++l)
      for (std::int32_t e = 0; e < E; ++e) vt[e][l] = rows[l * E + e];
  }

  /// rows[l * E + e] = vt[e][l].
  void store_rows(const float (&vt)[8][W], float* rows) const {
#if defined(MOEROUTE_CPU_TOKEN_COLUMNS)
    if (E == 8) {
      __m256 r[8];
      for (std::int32_t e = 0; e < 8; ++e) r[e] = full_lanes(block(vt[e]).v);
      columns::transpose8(r);
      for (std::int32_t l = 0; l < W; ++l) _mm256_storeu_ps(rows + l * 8, r[l]);
      return;
    }
#endif
    for (std::int32_t l = 0; l < W; ++l)
      for (std::int32_t e = 0; e < E; ++e) rows[l * E + e] = vt[e][l];
  }

#if defined(MOEROUTE_CPU_TOKEN_COLUMNS)
  /// A column register's first W floats, and W floats as a column register (upper lanes 0).
  [[nodiscard, gnu::always_inline]] static f32w low_lanes(__m256 r) {
#if defined(__AVX512F__)  // (W = 8)
    return (f32w)r;
#else  // (W = 4)
    const auto v = (columns::f32x8)r;
    return __builtin_shufflevector(v, v, 0, 1, 2, 3);
#endif
  }
  [[nodiscard, gnu::always_inline]] static __m256 full_lanes(const f32w& v) {
#if defined(__AVX512F__)
    return (__m256)v;
#else
    return (__m256)__builtin_shufflevector(v, f32w{}, 0, 1, 2, 3, 4, 5, 6, 7);
#endif
  }
#endif

  /// max (from its start value) and sum of exp(x(e) - max) over the row, in e order, as the
  /// reference makes them.
  template <class X>
  void softmax_row(const X& x, double& max, double& sum) const {
    for (std::int32_t e = 0; e < E; ++e) max = std::fmax(max, x(e));
    for (std::int32_t e = 0; e < E; ++e) sum += std::exp(x(e) - max);
  }

  /// The element path (rows wider than row_max, or more than row_max_k choices): each
  /// element's terms from the reference's per-element expressions, libm's exp each time.
  void element_token(std::int64_t t) const {
    float* out = p.d_grad_logits + t * E;
    const auto& g = cfg.gating;
    const std::int32_t* ids = p.gated.d_ids != nullptr ? p.gated.d_ids + t * k : nullptr;
    const Element* row = p.d_logits + t * E;
    const auto raw = [&](std::int32_t e) { return static_cast<double>(math::load(row[e])); };
    const auto clean = [&](std::int32_t e) { return bwd::sanitize(raw(e)); };
    const auto xg = [&](std::int32_t e) {  // gate logits: noisy with selection_and_gates
      double x = clean(e);
      if (noisy_gates) {
        const float z = rng::gating_noise(g.noise.seed, g.noise.offset,
                                          g.noise.kind == noise_kind::gaussian, t, E, e);
        x = bwd::sanitize(x + static_cast<double>(g.noise.scale) * z);
      }
      return x;
    };
    const auto alive = [&](std::int32_t j) { return holds_row(p.dispatched.d_fate[t * k + j]); };
    // ---- routing term
    const bool routing = p.d_grad_weight != nullptr && routing_weight != 0.0;
    double gm = -static_cast<double>(FLT_MAX), gsum = 0.0;
    double denom = 1.0, S = 0.0, dot_w = 0.0, dot2 = 0.0;
    const auto s_of = [&](std::int32_t e) {
      if (score != score_function::softmax) return bwd::score(score, xg(e));
      return std::exp(xg(e) - gm) / gsum;
    };
    const auto h_of = [&](std::int32_t j) {
      return softmax_after ? std::exp(xg(ids[j]) - gm) / gsum : s_of(ids[j]);
    };
    const auto dw_of = [&](std::int32_t j) { return d_weight(t, j); };
    const auto gpre_of = [&](std::int32_t j) {
      const double h = h_of(j);
      return before_drop ? (denom > 0.0 ? h / denom : 0.0) : h;
    };
    const auto gates_of = [&](std::int32_t j) {
      return after_drop ? gpre_of(j) : static_cast<double>(g.scaling_factor) * gpre_of(j);
    };
    bool any = false;
    if (routing)
      for (std::int32_t j = 0; j < k; ++j) any = any || dw_of(j) != 0.0;
    if (any) {
      if (softmax_after) {
        for (std::int32_t j = 0; j < k; ++j) gm = std::fmax(gm, xg(ids[j]));
        for (std::int32_t j = 0; j < k; ++j) gsum += std::exp(xg(ids[j]) - gm);
      } else if (score == score_function::softmax) {
        softmax_row(xg, gm, gsum);
      }
      if (before_drop) {
        double sum = 0.0;
        for (std::int32_t j = 0; j < k; ++j) sum += h_of(j);
        denom = sum + static_cast<double>(g.renorm_epsilon);
      }
      if (after_drop)
        for (std::int32_t j = 0; j < k; ++j)
          if (alive(j)) {
            const double gj = gates_of(j);
            S += gj;
            dot_w += dw_of(j) * gj;
          }
    }
    const double D = S > static_cast<double>(FLT_EPSILON) ? S : static_cast<double>(FLT_EPSILON);
    const bool clamped = S < static_cast<double>(FLT_EPSILON);
    const auto dgpre_of = [&](std::int32_t j) {
      if (after_drop)
        return alive(j) ? static_cast<double>(g.scaling_factor) *
                              (dw_of(j) / D - (clamped ? 0.0 : dot_w / (D * D)))
                        : 0.0;
      return static_cast<double>(g.scaling_factor) * dw_of(j);
    };
    const auto dh_of = [&](std::int32_t j) {
      if (!before_drop) return dgpre_of(j);
      return denom > 0.0 ? dgpre_of(j) / denom - dot2 / (denom * denom) : 0.0;
    };
    double dot3 = 0.0;
    if (any) {
      if (softmax_after) {
        for (std::int32_t j = 0; j < k; ++j) dot3 += dgpre_of(j) * h_of(j);
      } else {
        if (before_drop)
          for (std::int32_t j = 0; j < k; ++j) dot2 += dgpre_of(j) * h_of(j);
        if (score == score_function::softmax)
          for (std::int32_t j = 0; j < k; ++j) dot3 += dh_of(j) * h_of(j);
      }
    }
    // ---- aux, sequence-aux and z terms: softmax / normalised scores of the clean logits
    const loss_terms L = losses_of(t);
    const std::int64_t* seq_count = p.gated.sums.d_seq_count;
    double cm = -static_cast<double>(FLT_MAX), cse = 0.0, ssum = 0.0, dot_aux = 0.0, dot_seq = 0.0;
    if (L.aux || L.seq || L.zl) softmax_row(clean, cm, cse);
    if ((L.aux || L.seq) && score != score_function::softmax)
      for (std::int32_t e = 0; e < E; ++e) ssum += bwd::score(score, clean(e));
    const auto soft = [&](std::int32_t e) { return std::exp(clean(e) - cm) / cse; };
    const auto P_of = [&](std::int32_t e) {
      return score == score_function::softmax ? soft(e)
                                              : bwd::score(score, clean(e)) / (ssum + 1e-20);
    };
    if (L.aux)
      for (std::int32_t e = 0; e < E; ++e)
        dot_aux += L.c_aux * static_cast<double>(L.aux_count[e]) * P_of(e);
    if (L.seq)
      for (std::int32_t e = 0; e < E; ++e) dot_seq += L.gp_seq(seq_count, E, e) * P_of(e);
    const auto p_backward = [&](std::int32_t e, double gp, double dot) {
      if (score == score_function::softmax) return soft(e) * (gp - dot);
      const double x = clean(e);
      const double sc = bwd::score(score, x);
      return bwd::score_deriv(score, x, sc) * (gp - dot) / (ssum + 1e-20);
    };
    const double lse = cm + std::log(cse);
    // The four terms at element e, named as the reference's passes that add them
    // (reference::routing_backward, aux_loss_backward, sequence_aux_loss_backward,
    // z_loss_backward) and as the kernel's helpers.
    const auto routing_backward = [&](std::int32_t e) {
      double r = 0.0;
      if (softmax_after) {
        for (std::int32_t j = 0; j < k; ++j)
          if (ids[j] == e) r += h_of(j) * (dgpre_of(j) - dot3);
        return r;
      }
      if (score == score_function::softmax) r = -s_of(e) * dot3;
      for (std::int32_t j = 0; j < k; ++j) {
        if (ids[j] != e) continue;
        if (score == score_function::softmax) {
          r += s_of(e) * dh_of(j);
        } else {
          const double x = xg(e);
          r += dh_of(j) * bwd::score_deriv(score, x, bwd::score(score, x));
        }
      }
      return r;
    };
    const auto aux_loss_backward = [&](std::int32_t e) {
      return p_backward(e, L.c_aux * static_cast<double>(L.aux_count[e]), dot_aux);
    };
    const auto sequence_aux_loss_backward = [&](std::int32_t e) {
      return p_backward(e, L.gp_seq(seq_count, E, e), dot_seq);
    };
    const auto z_loss_backward = [&](std::int32_t e) { return L.c_z * lse * soft(e); };
    // ---- one pass over the row: routing, aux, sequence-aux, z, each rounded and added
    for (std::int32_t e = 0; e < E; ++e) {
      float v = p.accumulate ? out[e] : 0.0f;
      if (std::isfinite(raw(e))) {
        if (any) v += static_cast<float>(routing_backward(e));
        if (L.aux) v += static_cast<float>(aux_loss_backward(e));
        if (L.seq) v += static_cast<float>(sequence_aux_loss_backward(e));
        if (L.zl) v += static_cast<float>(z_loss_backward(e));
      }
      out[e] = v;
    }
  }
};

}  // namespace detail

/// @brief d logits [T, E] on the CPU: the routing term, the batch aux loss, the sequence aux
///        loss (when loss.sequence_length > 0) and the z-loss, added per element in that order
///        into d_grad_logits (or written, accumulate = false). Same formulas and order as
///        reference::gating_backward; math in double.
/// @return success, or invalid_* naming the field (an id outside [0, E) in a valid token
///         included: d_invalid_ids, when given, is set to 0 on success).
/// @note Synchronous, no allocation; tokens in fixed blocks on `ex`, bit-identical for any
///       thread count. T = 0: no-op. Padding tokens get 0 (written) or nothing (accumulate);
///       non-finite logits get 0.
template <class Element>
[[nodiscard]] status gating_backward(const routing_config& cfg,
                                     const gating_backward_params<Element>& p,
                                     const executor& ex = {}) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.d_invalid_ids != nullptr) *p.d_invalid_ids = 0;  // (validate refused any)
  if (p.tokens == 0) return status::success();
  const detail::gating_backward_agent<Element> agent(cfg, p);
  // about 16k logits a task (tens of microseconds), as cpu::gating: a small call is one task,
  // run on the calling thread, so that OpenMP's fork and join never cost more than they save
  const std::int64_t tasks =
      task_count(p.tokens, std::max<std::int64_t>(1, 16384 / cfg.num_experts + 1));
  parallel_for(ex, tasks, [&](std::int64_t i) {
    std::int64_t begin, end;
    task_range(p.tokens, tasks, i, begin, end);
    if (agent.row_path) {
      detail::gating_backward_row row;  // uninitialised: each row pass writes before reading
      std::int64_t t = begin;
      // rows of at most 8: W tokens at a time where the column path takes them (the same
      // bits: which tokens share a group changes nothing)
      constexpr std::int32_t block = decltype(agent)::column_block;
      while (agent.column_path && t + detail::W <= end) {
        const auto groups =
            static_cast<std::int32_t>(std::min<std::int64_t>(block, (end - t) / detail::W));
        const std::uint32_t skipped = agent.column_groups(t, groups);
        for (std::int32_t g = 0; g < groups; ++g)
          if ((skipped >> g & 1u) != 0)
            for (std::int64_t u = t + g * detail::W; u < t + (g + 1) * detail::W; ++u)
              agent.token(u, &row);
        t += groups * detail::W;
      }
      for (; t < end; ++t) agent.token(t, &row);
    } else {
      for (std::int64_t t = begin; t < end; ++t) agent.token(t, nullptr);
    }
  });
  return status::success();
}

}  // namespace moeroute::cpu
MOEROUTE_PRECISE_FP_END
