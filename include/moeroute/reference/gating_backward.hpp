// SPDX-License-Identifier: Apache-2.0
// CPU reference, backward of stage 1 and of the losses: gradients with respect to the router
// logits from the combine weights (routing), the load-balancing loss and the z-loss.
// Plain loops, one token at a time, every intermediate in double; the formulas are in
// docs/numerics.md ("Gradients"). The four terms are the passes routing_backward,
// aux_loss_backward, sequence_aux_loss_backward and z_loss_backward; cpu::gating_backward and
// the kernel name their per-element helpers the same, and add the terms in this order.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/reference/dispatch.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/reference/losses.hpp>
#include <moeroute/rng.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::reference {

/// Read-only span whose element type is not deduced: `std::vector<float>` converts to it and the
/// float type of a backward call defaults to float (`gating_backward<double>(...)` for double).
template <class F>
using grad_cspan = std::type_identity_t<std::span<const F>>;
/// Writable span, not deduced (see grad_cspan).
template <class F>
using grad_span = std::type_identity_t<std::span<F>>;

namespace detail {

inline void grad_check_size(const char* what, std::size_t got, std::int64_t want) {
  if (static_cast<std::int64_t>(got) != want)
    throw error(status::make(status_code::invalid_shape,
                             std::string(what) + " has " + std::to_string(got) +
                                 " elements, expected " + std::to_string(want)));
}

/// The sanitised logit in double (NaN -> -FLT_MAX, +-Inf -> +-FLT_MAX, as the forward does).
inline double sanitize_d(double x) {
  if (std::isnan(x)) return -static_cast<double>(FLT_MAX);
  return std::clamp(x, -static_cast<double>(FLT_MAX), static_cast<double>(FLT_MAX));
}

/// Softmax of n values in double, max-subtracted.
inline void softmax_d(const double* x, std::int64_t n, double* out) {
  double m = -static_cast<double>(FLT_MAX);
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(x[i] - m);
    sum += out[i];
  }
  for (std::int64_t i = 0; i < n; ++i) out[i] /= sum;
}

inline double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

inline double softplus_d(double x) {
  return x > 0.0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

/// Per-expert score (sigmoid or sqrt-softplus) in double.
inline double score_d(score_function f, double x) {
  return f == score_function::sigmoid ? sigmoid_d(x) : std::sqrt(softplus_d(x));
}

/// d score / d x for the per-expert scores, given s = score(x).
inline double score_deriv_d(score_function f, double x, double s) {
  if (f == score_function::sigmoid) return s * (1.0 - s);
  // s = sqrt(softplus(x)): ds/dx = sigmoid(x) / (2 s)
  return s > 0.0 ? sigmoid_d(x) / (2.0 * s) : 0.0;
}

/// Row t of the logits, sanitised, in double; `finite[e]` records which inputs were finite.
template <class F>
void load_row(std::span<const F> logits, std::int64_t t, std::int32_t E, std::vector<double>& x,
              std::vector<std::uint8_t>& finite) {
  for (std::int32_t e = 0; e < E; ++e) {
    const double raw = static_cast<double>(logits[t * E + e]);
    finite[e] = std::isfinite(raw) ? 1 : 0;
    x[e] = sanitize_d(raw);
  }
}

/// Adds `grad` (row t, double) into d_logits, skipping non-finite inputs (their gradient is 0:
/// the sanitising clamp is flat there).
template <class F>
void add_row(std::span<F> d_logits, std::int64_t t, std::int32_t E, const std::vector<double>& grad,
             const std::vector<std::uint8_t>& finite) {
  for (std::int32_t e = 0; e < E; ++e)
    if (finite[e]) d_logits[t * E + e] += static_cast<F>(grad[e]);
}

template <class F>
void check_logit_grad_shapes(const routing_config& cfg, const gating_output& g,
                             std::span<const F> logits, std::span<F> d_logits) {
  throw_if_error(validate(cfg));
  if (g.k != cfg.top_k || g.experts != cfg.num_experts)
    throw error(status::make(status_code::invalid_argument, "gating_output does not match config"));
  grad_check_size("logits", logits.size(), g.tokens * g.experts);
  grad_check_size("d_logits", d_logits.size(), g.tokens * g.experts);
  grad_check_size("gating_output ids", g.ids.size(), g.tokens * g.k);
  grad_check_size("gating_output valid", g.valid.size(), g.tokens);
  for (std::int64_t t = 0; t < g.tokens; ++t)
    for (std::int32_t j = 0; g.valid[t] && j < g.k; ++j)
      if (g.ids[t * g.k + j] < 0 || g.ids[t * g.k + j] >= g.experts)
        throw error(status::make(status_code::invalid_argument,
                                 "gating_output ids[" + std::to_string(t * g.k + j) + "] = " +
                                     std::to_string(g.ids[t * g.k + j]) + ": not an expert"));
}

/// Backward of the aux-loss score P[t, :] for one token: given dL/dP (gp, [E]), adds dL/dx.
///   softmax:  P = softmax(x),            dx_e = P_e (gp_e - sum_i gp_i P_i)
///   others:   P = s / (sum s + 1e-20),   dx_e = s'(x_e) (gp_e - sum_i gp_i P_i) / (sum s + 1e-20)
inline void aux_p_backward_row(score_function f, const std::vector<double>& x, const double* gp,
                               std::vector<double>& p, std::vector<double>& s,
                               std::vector<double>& grad) {
  const std::int32_t E = static_cast<std::int32_t>(x.size());
  if (f == score_function::softmax) {
    softmax_d(x.data(), E, p.data());
    double dot = 0.0;
    for (std::int32_t e = 0; e < E; ++e) dot += gp[e] * p[e];
    for (std::int32_t e = 0; e < E; ++e) grad[e] += p[e] * (gp[e] - dot);
    return;
  }
  double sum = 0.0;
  for (std::int32_t e = 0; e < E; ++e) {
    s[e] = score_d(f, x[e]);
    sum += s[e];
  }
  const double denom = sum + 1e-20;
  double dot = 0.0;
  for (std::int32_t e = 0; e < E; ++e) dot += gp[e] * (s[e] / denom);
  for (std::int32_t e = 0; e < E; ++e)
    grad[e] += score_deriv_d(f, x[e], s[e]) * (gp[e] - dot) / denom;
}

}  // namespace detail

/// @brief Routing backward (the first term of gating_backward): the gradient of
///        sum_a d_weight[a] * weight[a] with respect to the logits,
///        where weight is the combine weight `dispatch_output::weight` (renormalised after drop
///        and scaled, when the config says so). ADDS into d_logits (zero it first).
/// @tparam F float or double: the element type of logits, d_weight and d_logits. Every
///        intermediate is computed in double either way.
/// @param cfg      the config the forward ran with
/// @param logits   [T, E] the router logits the forward saw (float: exactly; for half/bf16
///                 inputs pass their float conversion)
/// @param g        the forward's gating_output (expert ids, valid mask)
/// @param dsp      the forward's dispatch_output (fates)
/// @param d_weight [T, k] dL/d weight. Entries of dropped and masked assignments are ignored:
///                 such an assignment has weight 0 whatever the logits, so passes no gradient.
///                 A rerouted assignment carries the gate of the expert it chose, so its
///                 gradient goes to that expert's logit.
/// @param d_logits [T, E] accumulated
/// @note Routing decisions (ids, fates) are piecewise constant: they get no gradient, nor does
///       the expert bias. With noise, the noisy logits are x + noise with noise a constant, so
///       with noise_target::selection_and_gates the gradient with respect to the noisy logits
///       passes unchanged to x (the noise is recomputed from cfg.gating.noise). Non-finite
///       logits get gradient 0. After-drop renormalisation divides by max(S, FLT_EPSILON); when
///       S < FLT_EPSILON the divisor is a constant (as torch.clamp's gradient).
///       Throws moeroute::error on a shape mismatch. No synchronisation (CPU, plain loops).
template <class F = float>
void routing_backward(const routing_config& cfg, grad_cspan<F> logits, const gating_output& g,
                      const dispatch_output& dsp, grad_cspan<F> d_weight, grad_span<F> d_logits) {
  detail::check_logit_grad_shapes<F>(cfg, g, logits, d_logits);
  const std::int64_t T = g.tokens;
  const std::int32_t E = g.experts, k = g.k;
  detail::grad_check_size("d_weight", d_weight.size(), T * k);
  if (dsp.tokens != T || dsp.k != k)
    throw error(status::make(status_code::invalid_argument,
                             "dispatch_output does not match gating_output"));
  detail::grad_check_size("dispatch_output fates", dsp.fates.size(), T * k);
  const auto& gc = cfg.gating;
  const bool softmax_after =
      gc.score == score_function::softmax && gc.stage == softmax_stage::after_topk;
  const bool noisy_gates =
      cfg.noise_active() && gc.noise.target == noise_target::selection_and_gates;
  const bool after_drop = gc.renorm == renormalize::after_drop;
  const bool before_drop = gc.renorm == renormalize::before_drop && !softmax_after;
  const double sf = gc.scaling_factor, eps = gc.renorm_epsilon;

  std::vector<double> x(E), s(E), grad(E);
  std::vector<std::uint8_t> finite(E);
  std::vector<double> dw(k), h(k), gpre(k), gates(k), dgates(k), dgpre(k), dh(k), p(k), chosen(k);
  std::vector<std::uint8_t> m(k);
  for (std::int64_t t = 0; t < T; ++t) {
    if (!g.valid[t]) continue;
    bool any = false;
    for (std::int32_t j = 0; j < k; ++j) {
      const fate f = dsp.fates[t * k + j];
      m[j] = holds_row(f) ? 1 : 0;
      dw[j] = m[j] ? static_cast<double>(d_weight[t * k + j]) : 0.0;
      any = any || dw[j] != 0.0;
    }
    if (!any) continue;
    detail::load_row<F>(logits, t, E, x, finite);
    if (noisy_gates) {  // the same Philox draw as the forward; d(noisy)/d(x) = 1
      for (std::int32_t e = 0; e < E; ++e) {
        const float z = rng::gating_noise(gc.noise.seed, gc.noise.offset,
                                          gc.noise.kind == noise_kind::gaussian, t, E, e);
        x[e] = detail::sanitize_d(x[e] + static_cast<double>(gc.noise.scale) * z);
      }
    }
    const std::int32_t* ids = &g.ids[t * k];
    double denom = 1.0;  // before-drop divisor sum_j h_j + epsilon

    // forward of this token's gates, in double
    if (softmax_after) {
      for (std::int32_t j = 0; j < k; ++j) chosen[j] = x[ids[j]];
      detail::softmax_d(chosen.data(), k, p.data());
      for (std::int32_t j = 0; j < k; ++j) gpre[j] = p[j];
    } else {
      if (gc.score == score_function::softmax) {
        detail::softmax_d(x.data(), E, s.data());
      } else {
        for (std::int32_t e = 0; e < E; ++e) s[e] = detail::score_d(gc.score, x[e]);
      }
      for (std::int32_t j = 0; j < k; ++j) h[j] = s[ids[j]];
      denom = 1.0;
      if (before_drop) {
        double sum = 0.0;
        for (std::int32_t j = 0; j < k; ++j) sum += h[j];
        denom = sum + eps;
      }
      for (std::int32_t j = 0; j < k; ++j)
        gpre[j] = before_drop ? (denom > 0.0 ? h[j] / denom : 0.0) : h[j];
    }
    for (std::int32_t j = 0; j < k; ++j) gates[j] = after_drop ? gpre[j] : sf * gpre[j];

    // combine weight -> pre-drop gate
    if (after_drop) {
      double S = 0.0, dot = 0.0;
      for (std::int32_t j = 0; j < k; ++j)
        if (m[j]) S += gates[j];
      const double D = std::max(S, static_cast<double>(FLT_EPSILON));
      const bool clamped = S < static_cast<double>(FLT_EPSILON);
      for (std::int32_t j = 0; j < k; ++j)
        if (m[j]) dot += dw[j] * gates[j];
      for (std::int32_t j = 0; j < k; ++j)
        dgates[j] = m[j] ? sf * (dw[j] / D - (clamped ? 0.0 : dot / (D * D))) : 0.0;
    } else {
      for (std::int32_t j = 0; j < k; ++j) dgates[j] = dw[j];
    }
    for (std::int32_t j = 0; j < k; ++j) dgpre[j] = after_drop ? dgates[j] : sf * dgates[j];

    std::fill(grad.begin(), grad.end(), 0.0);
    if (softmax_after) {
      double dot = 0.0;
      for (std::int32_t j = 0; j < k; ++j) dot += dgpre[j] * p[j];
      for (std::int32_t j = 0; j < k; ++j) grad[ids[j]] += p[j] * (dgpre[j] - dot);
    } else {
      if (before_drop) {
        double dot = 0.0;
        for (std::int32_t j = 0; j < k; ++j) dot += dgpre[j] * h[j];
        for (std::int32_t j = 0; j < k; ++j)
          dh[j] = denom > 0.0 ? dgpre[j] / denom - dot / (denom * denom) : 0.0;
      } else {
        for (std::int32_t j = 0; j < k; ++j) dh[j] = dgpre[j];
      }
      if (gc.score == score_function::softmax) {
        double dot = 0.0;
        for (std::int32_t j = 0; j < k; ++j) dot += dh[j] * s[ids[j]];
        for (std::int32_t e = 0; e < E; ++e) grad[e] = -s[e] * dot;
        for (std::int32_t j = 0; j < k; ++j) grad[ids[j]] += s[ids[j]] * dh[j];
      } else {
        for (std::int32_t j = 0; j < k; ++j)
          grad[ids[j]] += dh[j] * detail::score_deriv_d(gc.score, x[ids[j]], s[ids[j]]);
      }
    }
    detail::add_row<F>(d_logits, t, E, grad, finite);
  }
}

namespace detail {
/// The loop both aux backward passes share: for every valid token t, fill_gp(t, gp) writes the
/// [E] dL/dP of token t and the row's dL/dx (through the score function) is added to d_logits.
template <class F, class FillGp>
void add_aux_p_backward(const routing_config& cfg, grad_cspan<F> logits, const gating_output& g,
                        grad_span<F> d_logits, FillGp fill_gp) {
  const std::int32_t E = g.experts;
  std::vector<double> gp(E), x(E), p(E), s(E), grad(E);
  std::vector<std::uint8_t> finite(E);
  for (std::int64_t t = 0; t < g.tokens; ++t) {
    if (!g.valid[t]) continue;
    fill_gp(t, gp.data());
    load_row<F>(logits, t, E, x, finite);
    std::fill(grad.begin(), grad.end(), 0.0);
    aux_p_backward_row(cfg.gating.score, x, gp.data(), p, s, grad);
    add_row<F>(d_logits, t, E, grad, finite);
  }
}
}  // namespace detail

/// @brief Aux-loss backward for a loss over a global batch whose counts and token total are
///        given (e.g. all-reduced over the ranks that share the batch; see docs/numerics.md):
///        adds d_loss * d aux / d x for this shard's logits, where
///        aux = coefficient * scale * sum_i (counts_i / tokens) * (P_sum_i / tokens).
///        The gradient flows through P only: f is a count. ADDS into d_logits.
/// @param counts [E] f counts summed over the whole batch; tokens: valid tokens of the batch
/// @param d_loss dL/d aux (1 for the loss itself)
template <class F = float>
void aux_loss_backward_from_sums(const routing_config& cfg, grad_cspan<F> logits,
                                 const gating_output& g, std::span<const std::int64_t> counts,
                                 std::int64_t tokens, grad_span<F> d_logits, double d_loss = 1.0) {
  detail::check_logit_grad_shapes<F>(cfg, g, logits, d_logits);
  const std::int32_t E = g.experts;
  detail::grad_check_size("counts", counts.size(), E);
  if (tokens <= 0 || d_loss == 0.0) return;
  const double Tn = static_cast<double>(tokens);
  const double c = d_loss * cfg.loss.aux_coefficient * aux_loss_scale(cfg) / (Tn * Tn);
  detail::add_aux_p_backward<F>(cfg, logits, g, d_logits, [&](std::int64_t, double* gp) {
    for (std::int32_t e = 0; e < E; ++e) gp[e] = c * static_cast<double>(counts[e]);
  });
}

/// @brief Batch-level aux-loss backward (the loss of reference::aux_loss): adds d_loss * d aux/dx.
///        dL/dP[t, i] = d_loss * coefficient * scale * count_i / T^2 for every valid token t.
template <class F = float>
void aux_loss_backward(const routing_config& cfg, grad_cspan<F> logits, const gating_output& g,
                       grad_span<F> d_logits, double d_loss = 1.0) {
  aux_loss_backward_from_sums<F>(cfg, logits, g, g.aux_count, g.valid_tokens, d_logits, d_loss);
}

/// @brief Sequence-level aux-loss backward (the loss of reference::sequence_aux_loss): for a
///        valid token t of sequence s, dL/dP[t, i] = d_loss * coefficient * scale * count_{s,i} /
///        (L_s^2 * n), L_s its valid tokens, n the sequences with any (sequence_reduction::mean)
///        or 1 (sum). ADDS.
template <class F = float>
void sequence_aux_loss_backward(const routing_config& cfg, grad_cspan<F> logits,
                                const gating_output& g, grad_span<F> d_logits,
                                double d_loss = 1.0) {
  detail::check_logit_grad_shapes<F>(cfg, g, logits, d_logits);
  const std::int32_t E = g.experts;
  const std::int64_t L = cfg.loss.sequence_length;
  if (g.sequences == 0 || L <= 0 || d_loss == 0.0) return;
  if (g.sequences * L != g.tokens)
    throw error(
        status::make(status_code::invalid_argument,
                     "gating_output sequences = " + std::to_string(g.sequences) +
                         " does not match config loss.sequence_length = " + std::to_string(L)));
  detail::grad_check_size("gating_output seq_tokens", g.seq_tokens.size(), g.sequences);
  detail::grad_check_size("gating_output seq_count", g.seq_count.size(), g.sequences * E);
  std::int64_t used = 0;
  for (std::int64_t q = 0; q < g.sequences; ++q) used += g.seq_tokens[q] > 0 ? 1 : 0;
  if (used == 0) return;
  if (cfg.loss.sequence_reduce == sequence_reduction::sum) used = 1;
  const double base =
      d_loss * cfg.loss.aux_coefficient * aux_loss_scale(cfg) / static_cast<double>(used);
  detail::add_aux_p_backward<F>(cfg, logits, g, d_logits, [&](std::int64_t t, double* gp) {
    const std::int64_t q = sequence_of_token(cfg.loss.sequence_order, t, g.sequences, L);
    const double Ls = static_cast<double>(g.seq_tokens[q]);
    for (std::int32_t e = 0; e < E; ++e)
      gp[e] = base * static_cast<double>(g.seq_count[q * E + e]) / (Ls * Ls);
  });
}

/// @brief Router z-loss backward: adds d_loss * coefficient * 2 * lse_t * softmax(x_t) / T_valid
///        for every valid token (lse over the clean logits). ADDS into d_logits.
template <class F = float>
void z_loss_backward(const routing_config& cfg, grad_cspan<F> logits, const gating_output& g,
                     grad_span<F> d_logits, double d_loss = 1.0) {
  detail::check_logit_grad_shapes<F>(cfg, g, logits, d_logits);
  const std::int32_t E = g.experts;
  if (g.valid_tokens == 0 || d_loss == 0.0) return;
  const double c = d_loss * cfg.loss.z_coefficient * 2.0 / static_cast<double>(g.valid_tokens);
  std::vector<double> x(E), p(E), grad(E);
  std::vector<std::uint8_t> finite(E);
  for (std::int64_t t = 0; t < g.tokens; ++t) {
    if (!g.valid[t]) continue;
    detail::load_row<F>(logits, t, E, x, finite);
    double mx = -static_cast<double>(FLT_MAX);
    for (std::int32_t e = 0; e < E; ++e) mx = std::max(mx, x[e]);
    double se = 0.0;
    for (std::int32_t e = 0; e < E; ++e) se += std::exp(x[e] - mx);
    const double lse = mx + std::log(se);
    for (std::int32_t e = 0; e < E; ++e) grad[e] = c * lse * (std::exp(x[e] - mx) / se);
    detail::add_row<F>(d_logits, t, E, grad, finite);
  }
}

/// @brief The loss terms of the router gradient: adds, in this order, the batch aux-loss
///        gradient, the sequence aux-loss gradient (when loss.sequence_length > 0) and the z-loss
///        gradient into d_logits [T, E], each scaled by its weight in `w` (w.routing is not
///        used here). A term whose weight or loss coefficient is 0 is skipped.
template <class F = float>
void losses_backward(const routing_config& cfg, grad_cspan<F> logits, const gating_output& g,
                     grad_span<F> d_logits, const gating_backward_weights& w = {}) {
  detail::check_logit_grad_shapes<F>(cfg, g, logits, d_logits);
  if (w.aux != 0.0 && cfg.loss.aux_coefficient != 0.0f)
    aux_loss_backward<F>(cfg, logits, g, d_logits, w.aux);
  if (w.sequence_aux != 0.0 && cfg.loss.sequence_length > 0 && cfg.loss.aux_coefficient != 0.0f)
    sequence_aux_loss_backward<F>(cfg, logits, g, d_logits, w.sequence_aux);
  if (w.z != 0.0 && cfg.loss.z_coefficient != 0.0f)
    z_loss_backward<F>(cfg, logits, g, d_logits, w.z);
}

/// @brief The router's whole gradient, the op cuda::gating_backward computes: adds, in this
///        order, the routing gradient (routing_backward of w.routing * d_weight; skipped when
///        d_weight is empty or w.routing is 0) and the loss terms (losses_backward) into
///        d_logits [T, E]. Deterministic: every element receives its terms in that fixed order.
/// @tparam F float or double (logits, d_weight and d_logits); intermediates in double.
template <class F = float>
void gating_backward(const routing_config& cfg, grad_cspan<F> logits, const gating_output& g,
                     const dispatch_output& dsp, grad_cspan<F> d_weight, grad_span<F> d_logits,
                     const gating_backward_weights& w = {}) {
  if (!d_weight.empty() && w.routing != 0.0) {
    if (w.routing == 1.0) {
      routing_backward<F>(cfg, logits, g, dsp, d_weight, d_logits);
    } else {
      std::vector<F> scaled(d_weight.begin(), d_weight.end());
      for (auto& v : scaled) v = static_cast<F>(v * w.routing);
      routing_backward<F>(cfg, logits, g, dsp, scaled, d_logits);
    }
  }
  losses_backward<F>(cfg, logits, g, d_logits, w);
}

}  // namespace moeroute::reference
MOEROUTE_PRECISE_FP_END
