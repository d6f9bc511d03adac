// SPDX-License-Identifier: Apache-2.0
// Backward kernels: router-logit gradients (routing + aux + z-loss, fused), combine backward,
// permute backward and the expert-bias update. The CUDA twins of reference/backward.hpp.
// Deterministic: no atomics; every sum runs in a fixed order (one thread per token over its
// k assignments in rank order, or a fixed butterfly over a warp).
#pragma once

#include <cfloat>
#include <cstdint>

#include <moeroute/kernels/permute_element.cuh>
#include <moeroute/rng.hpp>

namespace moeroute::kernels {

namespace bwd {

// moeroute::fate values (dispatch.hpp)
constexpr std::uint8_t fate_kept = 0, fate_rerouted = 1, fate_masked = 3;
// score functions, as moeroute::score_function
constexpr int score_softmax = 0, score_sigmoid = 1, score_sqrt_softplus = 2;

__device__ inline double sanitize(double x) {
  if (x != x) return -static_cast<double>(FLT_MAX);
  return x < -static_cast<double>(FLT_MAX) ? -static_cast<double>(FLT_MAX)
                                           : (x > static_cast<double>(FLT_MAX) ? static_cast<double>(FLT_MAX) : x);
}
__device__ inline bool finite(double x) { return x == x && x <= DBL_MAX && x >= -DBL_MAX; }
__device__ inline double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ inline double score(int f, double x) {
  if (f == score_sigmoid) return sigmoid(x);
  const double sp = x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
  return sqrt(sp);
}
__device__ inline double score_deriv(int f, double x, double s) {
  if (f == score_sigmoid) return s * (1.0 - s);
  return s > 0.0 ? sigmoid(x) / (2.0 * s) : 0.0;
}

}  // namespace bwd

/// Everything the fused logit-gradient kernel reads; see cuda::logit_grads_params.
struct logit_grads_args {
  const void* logits = nullptr;  // [T, E] In
  std::int64_t tokens = 0;
  std::int32_t experts = 0, k = 0;
  const std::uint8_t* valid = nullptr;   // [T] or null
  const std::int32_t* ids = nullptr;     // [T, k]
  const std::uint8_t* fate = nullptr;    // [T, k]
  const float* grad_weight = nullptr;    // [T, k] or null: no routing term
  const std::int64_t* aux_count = nullptr;     // [E] or null: no aux term
  const std::int64_t* valid_tokens = nullptr;  // [1]
  const std::int64_t* seq_count = nullptr;     // [S, E] or null: no sequence-aux term
  const std::int64_t* seq_tokens = nullptr;    // [S]
  std::int64_t sequences = 0, seq_len = 0;     // S, L
  // gating semantics
  int score = 0;
  bool softmax_after = false, before_drop = false, after_drop = false;
  double renorm_epsilon = 0.0, scaling_factor = 1.0;
  bool noisy_gates = false, gaussian = true;
  float noise_scale = 0.0f;
  std::uint64_t noise_seed = 0, noise_offset = 0;
  // term weights (already multiplied by the loss coefficients and scales, except 1/T^2, 1/T)
  double routing_weight = 1.0, aux_weight = 0.0, seq_weight = 0.0, z_weight = 0.0;
  bool accumulate = true;
  float* grad_logits = nullptr;  // [T, E]
};

template <class In>
__device__ inline double load_logit(const logit_grads_args& a, std::int64_t t, std::int32_t e) {
  return static_cast<double>(element_to_float(static_cast<const In*>(a.logits)[t * a.experts + e]));
}

/// One thread per token; per element the routing, aux and z terms, each computed in double,
/// rounded to float and added in that order (the order of reference::accumulate_logit_grads).
template <class In>
__global__ void logit_grads_kernel(logit_grads_args a) {
  const std::int32_t E = a.experts, k = a.k;
  const std::int64_t Tvalid = a.valid_tokens ? *a.valid_tokens : a.tokens;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < a.tokens;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float* out = a.grad_logits + t * E;
    const bool valid = a.valid == nullptr || a.valid[t] != 0;
    if (!valid || Tvalid == 0) {
      if (!a.accumulate)
        for (std::int32_t e = 0; e < E; ++e) out[e] = 0.0f;
      continue;
    }
    const std::int32_t* ids = a.ids + t * k;
    // gate logits (noisy with selection_and_gates), recomputed on the fly
    auto xg = [&](std::int32_t e) {
      double x = bwd::sanitize(load_logit<In>(a, t, e));
      if (a.noisy_gates) {
        const auto r = rng::draw(a.noise_seed, a.noise_offset, rng::stream_gating_noise,
                                 static_cast<std::uint64_t>(t) * E + e);
        const float z = a.gaussian ? rng::normal(r.v[0], r.v[1]) : rng::gumbel(r.v[0]);
        x = bwd::sanitize(x + static_cast<double>(a.noise_scale) * z);
      }
      return x;
    };
    auto alive = [&](std::int32_t j) {
      const std::uint8_t f = a.fate[t * k + j];
      return f == bwd::fate_kept || f == bwd::fate_rerouted;
    };
    // ---- routing term: scalars of the per-token chain (docs/numerics.md, "Gradients")
    const bool routing = a.grad_weight != nullptr && a.routing_weight != 0.0;
    double gm = -static_cast<double>(FLT_MAX), gsum = 0.0;  // softmax stats of the gate logits
    double denom = 1.0, S = 0.0, dot_w = 0.0, dot2 = 0.0;
    auto s_of = [&](std::int32_t e) {  // score of expert e (not for softmax_after)
      return a.score == bwd::score_softmax ? exp(xg(e) - gm) / gsum : bwd::score(a.score, xg(e));
    };
    auto h_of = [&](std::int32_t j) {  // raw gate of choice j (softmax_after: p_j over the chosen)
      return a.softmax_after ? exp(xg(ids[j]) - gm) / gsum : s_of(ids[j]);
    };
    auto dw_of = [&](std::int32_t j) {
      if (!alive(j)) return 0.0;
      const float gw = a.grad_weight[t * k + j];
      // as the reference: a non-unit weight scales d weight in float first
      return a.routing_weight == 1.0 ? static_cast<double>(gw)
                                     : static_cast<double>(static_cast<float>(a.routing_weight * gw));
    };
    auto gpre_of = [&](std::int32_t j) {
      const double h = h_of(j);
      return a.before_drop ? (denom > 0.0 ? h / denom : 0.0) : h;
    };
    auto gates_of = [&](std::int32_t j) { return a.after_drop ? gpre_of(j) : a.scaling_factor * gpre_of(j); };
    bool any = false;
    if (routing) {
      for (std::int32_t j = 0; j < k; ++j) any = any || dw_of(j) != 0.0;
    }
    if (any) {
      if (a.softmax_after) {
        for (std::int32_t j = 0; j < k; ++j) gm = fmax(gm, xg(ids[j]));
        for (std::int32_t j = 0; j < k; ++j) gsum += exp(xg(ids[j]) - gm);
      } else if (a.score == bwd::score_softmax) {
        for (std::int32_t e = 0; e < E; ++e) gm = fmax(gm, xg(e));
        for (std::int32_t e = 0; e < E; ++e) gsum += exp(xg(e) - gm);
      }
      if (a.before_drop) {
        double sum = 0.0;
        for (std::int32_t j = 0; j < k; ++j) sum += h_of(j);
        denom = sum + a.renorm_epsilon;
      }
      if (a.after_drop) {
        for (std::int32_t j = 0; j < k; ++j)
          if (alive(j)) {
            const double g = gates_of(j);
            S += g;
            dot_w += dw_of(j) * g;
          }
      }
    }
    const double D = S > static_cast<double>(FLT_EPSILON) ? S : static_cast<double>(FLT_EPSILON);
    const bool clamped = S < static_cast<double>(FLT_EPSILON);
    auto dgpre_of = [&](std::int32_t j) {
      if (a.after_drop)
        return alive(j) ? a.scaling_factor * (dw_of(j) / D - (clamped ? 0.0 : dot_w / (D * D))) : 0.0;
      return a.scaling_factor * dw_of(j);
    };
    auto dh_of = [&](std::int32_t j) {  // before-drop backward (dot2 = sum dgpre h)
      if (!a.before_drop) return dgpre_of(j);
      return denom > 0.0 ? dgpre_of(j) / denom - dot2 / (denom * denom) : 0.0;
    };
    double dot3 = 0.0;  // softmax_after: sum dgpre p; softmax over all: sum dh s
    if (any) {
      if (a.softmax_after) {
        for (std::int32_t j = 0; j < k; ++j) dot3 += dgpre_of(j) * h_of(j);
      } else {
        if (a.before_drop)
          for (std::int32_t j = 0; j < k; ++j) dot2 += dgpre_of(j) * h_of(j);
        if (a.score == bwd::score_softmax)
          for (std::int32_t j = 0; j < k; ++j) dot3 += dh_of(j) * h_of(j);
      }
    }
    // ---- aux and z terms: softmax / normalised scores of the clean logits
    const bool aux = a.aux_count != nullptr && a.aux_weight != 0.0;
    const bool zl = a.z_weight != 0.0;
    // sequence aux: dL/dP[t, e] = seq_weight / used * count[q, e] / L_q^2, q = t / L
    bool seq = a.seq_count != nullptr && a.seq_weight != 0.0 && a.seq_len > 0;
    double seq_base = 0.0, seq_L2 = 1.0, dot_seq = 0.0;
    const std::int64_t q = seq ? t / a.seq_len : 0;
    if (seq) {
      std::int64_t used = 0;
      for (std::int64_t i = 0; i < a.sequences; ++i) used += a.seq_tokens[i] > 0 ? 1 : 0;
      const double Ls = static_cast<double>(a.seq_tokens[q]);
      seq = used > 0 && Ls > 0.0;
      seq_base = seq ? a.seq_weight / static_cast<double>(used) : 0.0;
      seq_L2 = Ls * Ls;
    }
    auto gp_seq = [&](std::int32_t e) {
      return seq_base * static_cast<double>(a.seq_count[q * E + e]) / seq_L2;
    };
    double cm = -static_cast<double>(FLT_MAX), cse = 0.0, ssum = 0.0, dot_aux = 0.0;
    const double Tn = static_cast<double>(Tvalid);
    const double c_aux = a.aux_weight / (Tn * Tn), c_z = a.z_weight * 2.0 / Tn;
    auto clean = [&](std::int32_t e) { return bwd::sanitize(load_logit<In>(a, t, e)); };
    if (aux || seq || zl) {
      for (std::int32_t e = 0; e < E; ++e) cm = fmax(cm, clean(e));
      for (std::int32_t e = 0; e < E; ++e) cse += exp(clean(e) - cm);
    }
    if ((aux || seq) && a.score != bwd::score_softmax)
      for (std::int32_t e = 0; e < E; ++e) ssum += bwd::score(a.score, clean(e));
    auto P_of = [&](std::int32_t e) {
      return a.score == bwd::score_softmax ? exp(clean(e) - cm) / cse
                                           : bwd::score(a.score, clean(e)) / (ssum + 1e-20);
    };
    if (aux)
      for (std::int32_t e = 0; e < E; ++e) dot_aux += c_aux * static_cast<double>(a.aux_count[e]) * P_of(e);
    if (seq)
      for (std::int32_t e = 0; e < E; ++e) dot_seq += gp_seq(e) * P_of(e);
    // backward of P for a given dL/dP (gp) and sum_i gp_i P_i (dot)
    auto p_backward = [&](std::int32_t e, double gp, double dot) {
      const double x = clean(e);
      if (a.score == bwd::score_softmax) return (exp(x - cm) / cse) * (gp - dot);
      const double sc = bwd::score(a.score, x);
      return bwd::score_deriv(a.score, x, sc) * (gp - dot) / (ssum + 1e-20);
    };
    const double lse = cm + log(cse);
    // ---- one pass over the row
    for (std::int32_t e = 0; e < E; ++e) {
      const double raw = load_logit<In>(a, t, e);
      float v = a.accumulate ? out[e] : 0.0f;
      if (bwd::finite(raw)) {
        if (any) {
          double r = 0.0;
          if (a.softmax_after) {
            for (std::int32_t j = 0; j < k; ++j)
              if (ids[j] == e) r += h_of(j) * (dgpre_of(j) - dot3);
          } else {
            if (a.score == bwd::score_softmax) r = -s_of(e) * dot3;
            for (std::int32_t j = 0; j < k; ++j) {
              if (ids[j] != e) continue;
              if (a.score == bwd::score_softmax) {
                r += s_of(e) * dh_of(j);
              } else {
                const double x = xg(e);
                r += dh_of(j) * bwd::score_deriv(a.score, x, bwd::score(a.score, x));
              }
            }
          }
          v = __fadd_rn(v, static_cast<float>(r));
        }
        if (aux)
          v = __fadd_rn(v, static_cast<float>(p_backward(e, c_aux * static_cast<double>(a.aux_count[e]), dot_aux)));
        if (seq) v = __fadd_rn(v, static_cast<float>(p_backward(e, gp_seq(e), dot_seq)));
        if (zl) v = __fadd_rn(v, static_cast<float>(c_z * lse * (exp(clean(e) - cm) / cse)));
      }
      out[e] = v;
    }
  }
}

/// d expert_out[r, c] = sum over the assignments j of row r's token that hold r, in rank order,
/// of w[t, j] * dy[t, c] (fp32, each multiply and add rounded on its own). Block-stride rows.
template <class T>
__global__ void combine_backward_rows_kernel(const T* __restrict__ dy,                       // [T, d]
                                             const std::int32_t* __restrict__ row_token,     // [rows]
                                             const std::int64_t* __restrict__ assignment_row, // [T, k]
                                             const float* __restrict__ weight,               // [T, k]
                                             std::int64_t rows, std::int32_t k, std::int64_t hidden,
                                             T* __restrict__ d_expert_out) {                 // [rows, d]
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int32_t t = row_token[r];
    for (std::int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
      float acc = 0.0f;
      if (t >= 0) {
        const float g = element_to_float(dy[static_cast<std::int64_t>(t) * hidden + c]);
        for (std::int32_t j = 0; j < k; ++j)
          if (assignment_row[static_cast<std::int64_t>(t) * k + j] == r)
            acc = __fadd_rn(acc, __fmul_rn(weight[static_cast<std::int64_t>(t) * k + j], g));
      }
      d_expert_out[r * hidden + c] = element_from_float<T>(acc);
    }
  }
}

/// One block per token: warp w computes d weight of assignments j = w, w + warps, ... (lane
/// partial sums over columns lane, lane + 32, ..., then a fixed butterfly); the whole block
/// writes the residual pass-through d x (dy for a valid token with nothing kept, else 0).
template <class T>
__global__ void combine_backward_tokens_kernel(const T* __restrict__ dy,            // [T, d]
                                               const T* __restrict__ expert_out,    // [rows, d]
                                               const std::int64_t* __restrict__ assignment_row,  // [T, k]
                                               const std::uint8_t* __restrict__ fate,            // [T, k]
                                               std::int64_t tokens, std::int32_t k, std::int64_t hidden,
                                               bool residual,
                                               float* __restrict__ d_weight,        // [T, k]
                                               T* __restrict__ d_x) {               // [T, d] or null
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    bool any = false;
    for (std::int32_t j = 0; j < k; ++j) any = any || assignment_row[t * k + j] >= 0;
    for (std::int32_t j = warp; j < k; j += warps) {
      const std::int64_t row = assignment_row[t * k + j];
      const std::uint8_t f = fate[t * k + j];
      const bool live = row >= 0 && (f == bwd::fate_kept || f == bwd::fate_rerouted);
      float acc = 0.0f;
      if (live)
        for (std::int64_t c = lane; c < hidden; c += 32)
          acc = __fadd_rn(acc, __fmul_rn(element_to_float(dy[t * hidden + c]),
                                         element_to_float(expert_out[row * hidden + c])));
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
      if (lane == 0) d_weight[t * k + j] = acc;
    }
    if (d_x != nullptr) {
      const bool pass = residual && !any && k > 0 && fate[t * k] != bwd::fate_masked;
      for (std::int64_t c = threadIdx.x; c < hidden; c += blockDim.x)
        d_x[t * hidden + c] = pass ? dy[t * hidden + c] : element_zero<T>();
    }
  }
}

/// d x[t, c] = (accumulate ? d x[t, c] : 0) + sum of d buf[row, c] over the distinct rows of
/// token t in rank order (fp32, each add rounded on its own): equal to reference::permute_backward.
template <class T>
__global__ void permute_backward_kernel(const T* __restrict__ d_buf,                     // [rows, d]
                                        const std::int64_t* __restrict__ assignment_row, // [T, k]
                                        std::int64_t tokens, std::int32_t k, std::int64_t hidden,
                                        bool accumulate, T* __restrict__ d_x) {         // [T, d]
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const std::int64_t* rows = assignment_row + t * k;
    for (std::int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
      float acc = accumulate ? element_to_float(d_x[t * hidden + c]) : 0.0f;
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int64_t row = rows[j];
        if (row < 0) continue;
        bool seen = false;
        for (std::int32_t i = 0; i < j; ++i) seen = seen || rows[i] == row;
        if (!seen) acc = __fadd_rn(acc, element_to_float(d_buf[row * hidden + c]));
      }
      d_x[t * hidden + c] = element_from_float<T>(acc);
    }
  }
}

/// bias[e] += rate * sign(mean load - load[e]), then optionally bias -= mean(bias). A single
/// thread: E is at most 8192 and the result must not depend on a reduction order.
/// (A template only so that the header can be included by several translation units.)
template <int Unused = 0>
__global__ void expert_bias_update_kernel(float* __restrict__ bias, const std::int64_t* __restrict__ load,
                                          std::int32_t experts, float rate, bool recenter) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0.0;
  for (std::int32_t e = 0; e < experts; ++e) total += static_cast<double>(load[e]);
  const double mean = total / experts;
  for (std::int32_t e = 0; e < experts; ++e) {
    const double off = mean - static_cast<double>(load[e]);
    const float sgn = off > 0.0 ? 1.0f : (off < 0.0 ? -1.0f : 0.0f);
    bias[e] = __fadd_rn(bias[e], __fmul_rn(rate, sgn));
  }
  if (recenter) {
    double s = 0.0;
    for (std::int32_t e = 0; e < experts; ++e) s += bias[e];
    const double mb = s / experts;
    for (std::int32_t e = 0; e < experts; ++e) bias[e] = static_cast<float>(static_cast<double>(bias[e]) - mb);
  }
}

}  // namespace moeroute::kernels
