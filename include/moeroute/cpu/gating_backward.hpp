// SPDX-License-Identifier: Apache-2.0
// CPU backend: the router-logit gradient — the routing term (d combine weight through the
// gates) and the aux, sequence-aux and z-loss terms — with the params of
// cuda::gating_backward and the formulas of reference::gating_backward (docs/numerics.md,
// "Gradients"). Per token, every intermediate in double, each term rounded to float and added
// in the reference's order; tokens run in fixed blocks, so the bits do not depend on threads.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/cpu/gating.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/gating_backward.hpp>
#include <moeroute/rng.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::cpu {

using moeroute::gating_backward_params;

/// @brief Checks config, shape and pointers (check_params); names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const gating_backward_params<Element>& p) {
  static_assert(is_element_v<Element>, "Element must be float, half_bits or bf16_bits");
  return check_params(cfg, p);
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

/// The gradient of one token's row (see the file comment); `out` is its row of d logits.
/// Rows up to this wide keep their exps, softmaxes and choice map on the stack.
inline constexpr std::int32_t gating_backward_cache_max = 512;

template <class Element>
struct gating_backward_agent {
  const routing_config& cfg;
  const gating_backward_params<Element>& p;
  std::int32_t E, k;
  score_function score;
  bool softmax_after, before_drop, after_drop, noisy_gates;
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
  }

  /// max (from its start value) and sum of exp(x(e) - max) over the row, in e order, as the
  /// reference makes them; with `keep`, keep[e] = exp(x(e) - max) / sum. Returns keep.
  template <class X>
  const double* softmax_row(const X& x, double& max, double& sum, double* keep) const {
    for (std::int32_t e = 0; e < E; ++e) max = std::fmax(max, x(e));
    for (std::int32_t e = 0; e < E; ++e) {
      const double ex = std::exp(x(e) - max);
      if (keep != nullptr) keep[e] = ex;
      sum += ex;
    }
    if (keep != nullptr)
      for (std::int32_t e = 0; e < E; ++e) keep[e] /= sum;
    return keep;
  }

  void token(std::int64_t t, std::int8_t* choice_of) const {
    float* out = p.d_grad_logits + t * E;
    const bool valid = p.d_valid == nullptr || p.d_valid[t] != 0;
    if (!valid || valid_tokens == 0) {
      if (!p.accumulate) std::fill(out, out + E, 0.0f);
      return;
    }
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
    // exp(xg(e) - gm) and exp(clean(e) - cm), each made once per element and kept (rows up to
    // cache_max wide): the formulas read them up to six times, and the same double expression
    // gives the same bits, so the result is unchanged
    constexpr std::int32_t cache_max = gating_backward_cache_max;
    const bool cached = E <= cache_max;
    double gex[cache_max], cex[cache_max];
    const double* g_soft = nullptr;  // exp(xg - gm) / gsum per element, once made
    const auto s_of = [&](std::int32_t e) {
      if (score != score_function::softmax) return bwd::score(score, xg(e));
      return g_soft != nullptr ? g_soft[e] : std::exp(xg(e) - gm) / gsum;
    };
    const auto h_of = [&](std::int32_t j) {
      return softmax_after ? std::exp(xg(ids[j]) - gm) / gsum : s_of(ids[j]);
    };
    const auto dw_of = [&](std::int32_t j) {
      if (!alive(j)) return 0.0;
      const float gw = p.d_grad_weight[t * k + j];
      return routing_weight == 1.0 ? static_cast<double>(gw)
                                   : static_cast<double>(static_cast<float>(routing_weight * gw));
    };
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
        g_soft = softmax_row(xg, gm, gsum, cached ? gex : nullptr);
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
    const std::int64_t* aux_count = aux_weight != 0.0 ? p.gated.sums.d_aux_count : nullptr;
    const bool aux = aux_count != nullptr;
    const bool zl = z_weight != 0.0;
    const std::int64_t q =
        seq_len > 0 ? sequence_of_token(cfg.loss.sequence_order, t, sequences, seq_len) : 0;
    const double Ls = seq_len > 0 ? static_cast<double>(p.gated.sums.d_seq_tokens[q]) : 0.0;
    const bool seq = seq_weight != 0.0 && seq_divisor > 0 && Ls > 0.0;
    const double seq_base = seq ? seq_weight / static_cast<double>(seq_divisor) : 0.0;
    const double seq_L2 = seq ? Ls * Ls : 1.0;
    const auto gp_seq = [&](std::int32_t e) {
      return seq_base * static_cast<double>(p.gated.sums.d_seq_count[q * E + e]) / seq_L2;
    };
    double cm = -static_cast<double>(FLT_MAX), cse = 0.0, ssum = 0.0, dot_aux = 0.0, dot_seq = 0.0;
    const double Tn = static_cast<double>(valid_tokens);
    const double c_aux = aux_weight / (Tn * Tn), c_z = z_weight * 2.0 / Tn;
    const double* c_soft = nullptr;  // exp(clean - cm) / cse per element, once made
    if ((aux || seq || zl) && g_soft != nullptr && !noisy_gates) {
      // the routing softmax above is this one: the same logits, max and sum, in the same order
      cm = gm;
      cse = gsum;
      c_soft = g_soft;
    } else if (aux || seq || zl) {
      c_soft = softmax_row(clean, cm, cse, cached ? cex : nullptr);
    }
    if ((aux || seq) && score != score_function::softmax)
      for (std::int32_t e = 0; e < E; ++e) ssum += bwd::score(score, clean(e));
    // the softmax of the clean logits
    const auto soft = [&](std::int32_t e) {
      return c_soft != nullptr ? c_soft[e] : std::exp(clean(e) - cm) / cse;
    };
    const auto P_of = [&](std::int32_t e) {
      return score == score_function::softmax ? soft(e)
                                              : bwd::score(score, clean(e)) / (ssum + 1e-20);
    };
    if (aux)
      for (std::int32_t e = 0; e < E; ++e)
        dot_aux += c_aux * static_cast<double>(aux_count[e]) * P_of(e);
    if (seq)
      for (std::int32_t e = 0; e < E; ++e) dot_seq += gp_seq(e) * P_of(e);
    const auto p_backward = [&](std::int32_t e, double gp, double dot) {
      if (score == score_function::softmax) return soft(e) * (gp - dot);
      const double x = clean(e);
      const double sc = bwd::score(score, x);
      return bwd::score_deriv(score, x, sc) * (gp - dot) / (ssum + 1e-20);
    };
    const double lse = cm + std::log(cse);
    // which choice j names expert e (cached rows, distinct ids): the element loop then looks
    // up its one match instead of scanning the k ids; reset for the next token below
    std::int8_t* jof = choice_of;
    bool mapped = any && cached && k <= 127;
    if (mapped)
      for (std::int32_t j = 0; j < k; ++j) {
        if (jof[ids[j]] >= 0) {  // a repeated id (an engine's own ids): scan instead
          for (std::int32_t i = 0; i < j; ++i) jof[ids[i]] = -1;
          mapped = false;
          break;
        }
        jof[ids[j]] = static_cast<std::int8_t>(j);
      }
    // The four terms at element e, named as the reference's passes that add them
    // (reference::routing_backward, aux_loss_backward, sequence_aux_loss_backward,
    // z_loss_backward) and as the kernel's helpers.
    const auto routing_backward = [&](std::int32_t e) {
      double r = 0.0;
      // the choices naming e, in j order: the mapped one, or all k scanned
      const std::int32_t j_lo = mapped ? (jof[e] >= 0 ? jof[e] : k) : 0;
      const std::int32_t j_hi = mapped ? (jof[e] >= 0 ? jof[e] + 1 : k) : k;
      if (softmax_after) {
        for (std::int32_t j = j_lo; j < j_hi; ++j)
          if (ids[j] == e) r += h_of(j) * (dgpre_of(j) - dot3);
        return r;
      }
      if (score == score_function::softmax) r = -s_of(e) * dot3;
      for (std::int32_t j = j_lo; j < j_hi; ++j) {
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
      return p_backward(e, c_aux * static_cast<double>(aux_count[e]), dot_aux);
    };
    const auto sequence_aux_loss_backward = [&](std::int32_t e) {
      return p_backward(e, gp_seq(e), dot_seq);
    };
    const auto z_loss_backward = [&](std::int32_t e) { return c_z * lse * soft(e); };
    // ---- one pass over the row: routing, aux, sequence-aux, z, each rounded and added
    for (std::int32_t e = 0; e < E; ++e) {
      float v = p.accumulate ? out[e] : 0.0f;
      if (std::isfinite(raw(e))) {
        if (any) v += static_cast<float>(routing_backward(e));
        if (aux) v += static_cast<float>(aux_loss_backward(e));
        if (seq) v += static_cast<float>(sequence_aux_loss_backward(e));
        if (zl) v += static_cast<float>(z_loss_backward(e));
      }
      out[e] = v;
    }
    if (mapped)
      for (std::int32_t j = 0; j < k; ++j) jof[ids[j]] = -1;
  }
};

}  // namespace detail

/// @brief d logits [T, E] on the CPU: the routing term, the batch aux loss, the sequence aux
///        loss (when loss.sequence_length > 0) and the z-loss, added per element in that order
///        into d_grad_logits (or written, accumulate = false). Same formulas and order as
///        reference::gating_backward; math in double.
/// @return success, or invalid_* naming the field.
/// @note Synchronous, no allocation; tokens in fixed blocks on `ex`, bit-identical for any
///       thread count. T = 0: no-op. Padding tokens get 0 (written) or nothing (accumulate);
///       non-finite logits get 0.
template <class Element>
[[nodiscard]] status gating_backward(const routing_config& cfg,
                                     const gating_backward_params<Element>& p,
                                     const executor& ex = {}) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  const detail::gating_backward_agent<Element> agent(cfg, p);
  const std::int64_t tasks =
      task_count(p.tokens, std::max<std::int64_t>(1, 4096 / cfg.num_experts + 1));
  parallel_for(ex, tasks, [&](std::int64_t i) {
    std::int64_t begin, end;
    task_range(p.tokens, tasks, i, begin, end);
    // which choice names each expert, -1 between tokens (rows up to cache_max wide)
    std::int8_t choice_of[detail::gating_backward_cache_max];
    std::fill(choice_of, choice_of + detail::gating_backward_cache_max, std::int8_t{-1});
    for (std::int64_t t = begin; t < end; ++t) agent.token(t, choice_of);
  });
  return status::success();
}

}  // namespace moeroute::cpu
MOEROUTE_PRECISE_FP_END
