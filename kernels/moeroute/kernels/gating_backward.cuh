// SPDX-License-Identifier: Apache-2.0
// The router-logit gradient (cuda::gating_backward): the routing term (d combine weight through
// the gates) and the aux, sequence-aux and z-loss terms, fused in one pass over each row.
// Deterministic: no atomics; Lanes threads per token (a warp, lanes over the experts; or one
// thread for small E), every sum in a fixed order in double: each lane's strided part, then a
// fixed xor butterfly (warp::group_sum: every lane ends with the same bits). One thread per token
// for every E, as this kernel began, ran E-long serial passes of double exp: 0.2-0.7 ms at any T on
// an H200 for E >= 64; a warp per token for E = 8 left three quarters of each warp idle (24 -> 67
// us at T = 16384), so small E keeps a thread per token. Formulas: docs/numerics.md ("Gradients");
// semantics: reference::gating_backward.
#pragma once

#include <cfloat>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/kernels/element.cuh>
#include <moeroute/kernels/gating_semantics.cuh>
#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/kernels/shared_memory.cuh>
#include <moeroute/kernels/warp_topk.cuh>
#include <moeroute/rng.hpp>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

namespace bwd {

__device__ inline double sanitize(double x) {
  if (x != x) return -static_cast<double>(FLT_MAX);
  return x < -static_cast<double>(FLT_MAX)
             ? -static_cast<double>(FLT_MAX)
             : (x > static_cast<double>(FLT_MAX) ? static_cast<double>(FLT_MAX) : x);
}
__device__ inline bool finite(double x) { return x == x && x <= DBL_MAX && x >= -DBL_MAX; }
__device__ inline double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ inline double score(score_function f, double x) {
  if (f == score_function::sigmoid) return sigmoid(x);
  const double sp = x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
  return sqrt(sp);
}
__device__ inline double score_deriv(score_function f, double x, double s) {
  if (f == score_function::sigmoid) return s * (1.0 - s);
  return s > 0.0 ? sigmoid(x) / (2.0 * s) : 0.0;
}
}  // namespace bwd

/// The widest row gating_backward_kernel<..., Cached = true> takes with a warp per token (a
/// lane's elements fit the 32 bits of its finite mask; with a thread per token, E <= 16), and
/// its dynamic shared memory for a block of `groups` token groups.
inline constexpr std::int32_t gating_backward_cached_max = 512;
inline std::size_t gating_backward_cached_smem(int groups, std::int32_t experts) {
  return static_cast<std::size_t>(groups) * static_cast<std::size_t>(experts) *
         (2 * sizeof(double) + sizeof(float));
}

/// Everything the fused logit-gradient kernel reads; see cuda::gating_backward_params.
template <class Element>
struct gating_backward_args {
  const Element* logits = nullptr;  // [T, E]
  std::int64_t tokens = 0;
  const std::uint8_t* valid = nullptr;  // [T] or null
  const_gating_result gated{};          // d_ids [T, k]; sums: aux_count, valid_tokens, seq_*
  const fate* fates = nullptr;          // [T, k]
  const float* grad_weight = nullptr;   // [T, k] or null: no routing term
  gating_semantics sem{};
  std::int64_t sequences = 0, seq_len = 0;  // S, L (0: no sequence term)
  token_order seq_order = token_order::sequence_major;
  bool seq_sum = false;  // sequence_reduction::sum: no 1 / (sequences with a valid token)
  // term weights (already multiplied by the loss coefficients and scales, except 1/T^2, 1/T);
  // 0 = no such term
  double routing_weight = 1.0, aux_weight = 0.0, seq_weight = 0.0, z_weight = 0.0;
  bool accumulate = true;
  float* grad_logits = nullptr;         // [T, E]
  std::int64_t* invalid_ids = nullptr;  // [1] or null: tokens skipped for an id outside [0, E)
};

template <class Element>
__device__ inline double load_logit(const gating_backward_args<Element>& a, std::int64_t t,
                                    std::int32_t e) {
  return static_cast<double>(element_to_float(a.logits[t * a.sem.experts + e]));
}

/// Lanes (1 or 32) threads per token; per element the routing, aux, sequence-aux and z terms,
/// each computed in double, rounded to float and added in that order (the order of
/// reference::gating_backward). Block: whole warps.
/// @tparam Cached false: each pass over the row reloads the logits and recomputes its double
///         exps (any E). true (E <= gating_backward_cached_max): each token group keeps its
///         token's row in its slice of dynamic shared memory — the clean logits, the softmax
///         P of the clean logits and the per-expert scores, gating_backward_cached_smem bytes a
///         block — made once per token by the expressions the uncached passes evaluate, so the
///         same values: one double exp per element (two with a sigmoid score) where the passes
///         took up to six (the gate softmax, the aux and the z term each recomputed P). Each lane
///         reads back only the elements it wrote: no barrier.
template <class Element, int Lanes, bool Cached = false>
__global__ void gating_backward_kernel(const gating_backward_args<Element> a) {
  enter_after_prior_grid();
  constexpr bool cached = Cached;
  const gating_semantics& sem = a.sem;
  const std::int32_t E = sem.experts, k = sem.k;
  const std::int64_t* d_valid_tokens = a.gated.sums.d_valid_tokens;
  const std::int64_t* aux_count = a.aux_weight != 0.0 ? a.gated.sums.d_aux_count : nullptr;
  const std::int64_t Tvalid = d_valid_tokens ? *d_valid_tokens : a.tokens;
  // the sequences with a valid token (the sequence mean's divisor): counted once per block by
  // all its threads, not once per token (integer atomics only)
  __shared__ unsigned long long s_used;
  if (threadIdx.x == 0) s_used = 0;
  __syncthreads();
  if (a.gated.sums.d_seq_tokens != nullptr && a.seq_weight != 0.0 && a.seq_len > 0) {
    unsigned long long mine = 0;
    for (std::int64_t i = threadIdx.x; i < a.sequences; i += blockDim.x)
      mine += a.gated.sums.d_seq_tokens[i] > 0 ? 1ull : 0ull;
    if (mine != 0) atomicAdd(&s_used, mine);
  }
  __syncthreads();
  const auto used_sequences = static_cast<std::int64_t>(s_used);
  const int lane = static_cast<int>(threadIdx.x) % Lanes;
  // cached: [G * E] doubles of P, [G * E] doubles of scores, [G * E] floats of clean logits,
  // G = the block's token groups; group g's element e at g * E + e for a warp per token (a
  // lane's run is consecutive across the lanes), at e * G + g for a thread per token (the
  // threads' e-th elements side by side): no bank conflict either way
  double* c_ps = nullptr;
  double* c_sc = nullptr;
  float* c_cx = nullptr;
  std::size_t c_stride = 1;
  if constexpr (cached) {
    const std::size_t groups = blockDim.x / Lanes, g = threadIdx.x / Lanes;
    double* d = dynamic_shared<double>();
    const std::size_t n = groups * static_cast<std::size_t>(E);
    const std::size_t first = Lanes == 1 ? g : g * static_cast<std::size_t>(E);
    c_stride = Lanes == 1 ? groups : 1;
    c_ps = d + first;
    c_sc = d + n + first;
    c_cx = reinterpret_cast<float*>(d + 2 * n) + first;
  }
  const std::int64_t groups = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / Lanes);
  for (std::int64_t t = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / Lanes;
       t < a.tokens; t += groups) {  // uniform over a token's lanes
    float* out = a.grad_logits + t * E;
    const bool valid = a.valid == nullptr || a.valid[t] != 0;
    if (!valid || Tvalid == 0) {
      if (!a.accumulate)
        for (std::int32_t e = lane; e < E; e += Lanes) out[e] = 0.0f;
      continue;
    }
    const std::int32_t* ids = a.gated.d_ids + t * k;
    // f(s, e) for each element e of this lane, in the strided order every sum takes
    // (s: the element's place in this lane's run, e / Lanes)
    auto each = [&](auto&& f) {
      int s = 0;
      for (std::int32_t e = lane; e < E; e += Lanes, ++s) f(s, e);
    };
    // the cached row: clean logits (sanitised: a float exactly) and which raw ones were finite
    // (bit s: at most 32 elements a thread)
    std::uint32_t finite_slots = 0;
    if constexpr (cached) {
      each([&](int s, std::int32_t e) {
        const double raw = load_logit<Element>(a, t, e);
        if (bwd::finite(raw)) finite_slots |= 1u << s;
        c_cx[e * c_stride] = static_cast<float>(bwd::sanitize(raw));
      });
    }
    auto clean = [&](std::int32_t e) { return bwd::sanitize(load_logit<Element>(a, t, e)); };
    // gate logits (noisy with selection_and_gates), recomputed on the fly
    auto xg = [&](std::int32_t e) {
      double x = clean(e);
      if (sem.noisy_gates) {
        const float z = rng::gating_noise(sem.noise_seed, sem.noise_offset, sem.gaussian, t, E, e);
        x = bwd::sanitize(x + static_cast<double>(sem.noise_scale) * z);
      }
      return x;
    };
    auto clean_at = [&](std::int32_t e) {
      if constexpr (cached) {
        return static_cast<double>(c_cx[e * c_stride]);
      } else {
        return clean(e);
      }
    };
    auto alive = [&](std::int32_t j) { return holds_row(a.fates[t * k + j]); };
    // ---- routing term: scalars of the per-token chain (docs/numerics.md, "Gradients")
    const bool routing = a.grad_weight != nullptr && a.routing_weight != 0.0;
    double gm = -static_cast<double>(FLT_MAX), gsum = 0.0;  // softmax stats of the gate logits
    double denom = 1.0, S = 0.0, dot_w = 0.0, dot2 = 0.0;
    auto s_of = [&](std::int32_t e) {  // score of expert e (not for softmax_after)
      return sem.score == score_function::softmax ? exp(xg(e) - gm) / gsum
                                                  : bwd::score(sem.score, xg(e));
    };
    auto h_of = [&](std::int32_t j) {  // raw gate of choice j (softmax_after: p_j over the chosen)
      return sem.softmax_after ? exp(xg(ids[j]) - gm) / gsum : s_of(ids[j]);
    };
    auto dw_of = [&](std::int32_t j) {
      if (!alive(j)) return 0.0;
      const float gw = a.grad_weight[t * k + j];
      // as the reference: a non-unit weight scales d weight in float first
      return a.routing_weight == 1.0
                 ? static_cast<double>(gw)
                 : static_cast<double>(static_cast<float>(a.routing_weight * gw));
    };
    auto gpre_of = [&](std::int32_t j) {
      const double h = h_of(j);
      return sem.before_drop ? (denom > 0.0 ? h / denom : 0.0) : h;
    };
    auto gates_of = [&](std::int32_t j) {
      return sem.after_drop ? gpre_of(j) : static_cast<double>(sem.scaling) * gpre_of(j);
    };
    // an id outside [0, E) (bad input, which the CPU backends refuse): the token gets no
    // routing term, and is counted; below, ids index the logits only when `any`
    bool ids_ok = true;
    if (routing)
      for (std::int32_t j = 0; j < k; ++j) ids_ok = ids_ok && ids[j] >= 0 && ids[j] < E;
    if (!ids_ok && lane == 0 && a.invalid_ids != nullptr)
      atomicAdd(reinterpret_cast<unsigned long long*>(a.invalid_ids), 1ull);
    bool any = false;
    if (routing && ids_ok) {
      for (std::int32_t j = 0; j < k; ++j) any = any || dw_of(j) != 0.0;
    }
    // ---- the softmax of the clean logits (aux, sequence aux, z; and the gate softmax where the
    // gate logits are the clean ones): max cm, sum cse; cached, P = exp(x - cm) / cse per slot
    const bool aux = aux_count != nullptr;
    const bool zl = a.z_weight != 0.0;
    // sequence aux: dL/dP[t, e] = seq_weight / used * count[q, e] / L_q^2, q the sequence of t
    // (used = 1 for sequence_reduction::sum)
    bool seq = a.gated.sums.d_seq_count != nullptr && a.seq_weight != 0.0 && a.seq_len > 0;
    const bool gate_softmax = any && !sem.softmax_after && sem.score == score_function::softmax;
    // cached, a gate softmax of the clean logits is this one: gm = cm and gsum = cse exactly
    // (the same values, the same order)
    const bool gate_is_clean = cached && gate_softmax && !sem.noisy_gates;
    double cm = -static_cast<double>(FLT_MAX), cse = 0.0;
    if (aux || seq || zl || gate_is_clean) {
      each([&](int, std::int32_t e) { cm = fmax(cm, clean_at(e)); });
      cm = warp::group_max<Lanes>(cm);
      each([&](int, std::int32_t e) {
        const double ex = exp(clean_at(e) - cm);
        if constexpr (cached) c_ps[e * c_stride] = ex;
        cse += ex;
      });
      cse = warp::group_sum<Lanes>(cse);
      if constexpr (cached)
        each([&](int, std::int32_t e) { c_ps[e * c_stride] = c_ps[e * c_stride] / cse; });
    }
    if (any) {
      if (sem.softmax_after) {
        for (std::int32_t j = 0; j < k; ++j) gm = fmax(gm, xg(ids[j]));
        for (std::int32_t j = 0; j < k; ++j) gsum += exp(xg(ids[j]) - gm);
      } else if (gate_is_clean) {
        gm = cm;
        gsum = cse;
      } else if (sem.score == score_function::softmax) {
        for (std::int32_t e = lane; e < E; e += Lanes) gm = fmax(gm, xg(e));
        gm = warp::group_max<Lanes>(gm);
        for (std::int32_t e = lane; e < E; e += Lanes) gsum += exp(xg(e) - gm);
        gsum = warp::group_sum<Lanes>(gsum);
      }
      if (sem.before_drop) {
        double sum = 0.0;
        for (std::int32_t j = 0; j < k; ++j) sum += h_of(j);
        denom = sum + static_cast<double>(sem.renorm_epsilon);
      }
      if (sem.after_drop) {
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
      if (sem.after_drop)
        return alive(j) ? static_cast<double>(sem.scaling) *
                              (dw_of(j) / D - (clamped ? 0.0 : dot_w / (D * D)))
                        : 0.0;
      return static_cast<double>(sem.scaling) * dw_of(j);
    };
    auto dh_of = [&](std::int32_t j) {  // before-drop backward (dot2 = sum dgpre h)
      if (!sem.before_drop) return dgpre_of(j);
      return denom > 0.0 ? dgpre_of(j) / denom - dot2 / (denom * denom) : 0.0;
    };
    double dot3 = 0.0;  // softmax_after: sum dgpre p; softmax over all: sum dh s
    if (any) {
      if (sem.softmax_after) {
        for (std::int32_t j = 0; j < k; ++j) dot3 += dgpre_of(j) * h_of(j);
      } else {
        if (sem.before_drop)
          for (std::int32_t j = 0; j < k; ++j) dot2 += dgpre_of(j) * h_of(j);
        if (sem.score == score_function::softmax)
          for (std::int32_t j = 0; j < k; ++j) dot3 += dh_of(j) * h_of(j);
      }
    }
    // ---- aux and z terms: softmax / normalised scores of the clean logits
    double seq_base = 0.0, seq_L2 = 1.0, dot_seq = 0.0;
    const std::int64_t q = seq ? sequence_of_token(a.seq_order, t, a.sequences, a.seq_len) : 0;
    if (seq) {
      const std::int64_t used = a.seq_sum && used_sequences > 0 ? 1 : used_sequences;
      const double Ls = static_cast<double>(a.gated.sums.d_seq_tokens[q]);
      seq = used > 0 && Ls > 0.0;
      seq_base = seq ? a.seq_weight / static_cast<double>(used) : 0.0;
      seq_L2 = Ls * Ls;
    }
    auto gp_seq = [&](std::int32_t e) {
      return seq_base * static_cast<double>(a.gated.sums.d_seq_count[q * E + e]) / seq_L2;
    };
    double ssum = 0.0, dot_aux = 0.0;
    const double Tn = static_cast<double>(Tvalid);
    const double c_aux = a.aux_weight / (Tn * Tn), c_z = a.z_weight * 2.0 / Tn;
    // the softmax P of the clean logits at element e, and the per-expert score
    auto softmax_at = [&](std::int32_t e) {
      if constexpr (cached) {
        return c_ps[e * c_stride];
      } else {
        return exp(clean(e) - cm) / cse;
      }
    };
    const bool scored = (aux || seq) && sem.score != score_function::softmax;
    auto score_at = [&](std::int32_t e) {
      if constexpr (cached) {
        return c_sc[e * c_stride];
      } else {
        return bwd::score(sem.score, clean(e));
      }
    };
    if (scored) {
      each([&](int, std::int32_t e) {
        const double v = bwd::score(sem.score, clean_at(e));
        if constexpr (cached) c_sc[e * c_stride] = v;
        ssum += v;
      });
      ssum = warp::group_sum<Lanes>(ssum);
    }
    auto P_at = [&](std::int32_t e) {
      return sem.score == score_function::softmax ? softmax_at(e) : score_at(e) / (ssum + 1e-20);
    };
    if (aux) {
      each([&](int, std::int32_t e) {
        dot_aux += c_aux * static_cast<double>(aux_count[e]) * P_at(e);
      });
      dot_aux = warp::group_sum<Lanes>(dot_aux);
    }
    if (seq) {
      each([&](int, std::int32_t e) { dot_seq += gp_seq(e) * P_at(e); });
      dot_seq = warp::group_sum<Lanes>(dot_seq);
    }
    // backward of P for a given dL/dP (gp) and sum_i gp_i P_i (dot)
    auto p_backward = [&](std::int32_t e, double gp, double dot) {
      if (sem.score == score_function::softmax) return softmax_at(e) * (gp - dot);
      const double x = clean_at(e);
      const double sc = score_at(e);
      return bwd::score_deriv(sem.score, x, sc) * (gp - dot) / (ssum + 1e-20);
    };
    const double lse = cm + log(cse);
    // The four terms at element e, named as the reference's passes that add them
    // (reference::routing_backward, aux_loss_backward, sequence_aux_loss_backward,
    // z_loss_backward) and as the CPU backend's helpers.
    auto routing_backward = [&](std::int32_t e) {
      double r = 0.0;
      if (sem.softmax_after) {
        for (std::int32_t j = 0; j < k; ++j)
          if (ids[j] == e) r += h_of(j) * (dgpre_of(j) - dot3);
        return r;
      }
      // the gate softmax at e: the cached clean P where the gate logits are the clean ones
      const auto gate_s = [&] { return gate_is_clean ? softmax_at(e) : s_of(e); };
      if (sem.score == score_function::softmax) r = -gate_s() * dot3;
      for (std::int32_t j = 0; j < k; ++j) {
        if (ids[j] != e) continue;
        if (sem.score == score_function::softmax) {
          r += gate_s() * dh_of(j);
        } else {
          const double x = xg(e);
          r += dh_of(j) * bwd::score_deriv(sem.score, x, bwd::score(sem.score, x));
        }
      }
      return r;
    };
    auto aux_loss_backward = [&](std::int32_t e) {
      return p_backward(e, c_aux * static_cast<double>(aux_count[e]), dot_aux);
    };
    auto sequence_aux_loss_backward = [&](std::int32_t e) {
      return p_backward(e, gp_seq(e), dot_seq);
    };
    auto z_loss_backward = [&](std::int32_t e) { return c_z * lse * softmax_at(e); };
    // ---- one pass over the row: routing, aux, sequence-aux, z, each rounded and added
    each([&](int s, std::int32_t e) {
      bool finite;
      if constexpr (cached) {
        finite = ((finite_slots >> s) & 1u) != 0u;
      } else {
        finite = bwd::finite(load_logit<Element>(a, t, e));
      }
      float v = a.accumulate ? out[e] : 0.0f;
      if (finite) {
        if (any) v = __fadd_rn(v, static_cast<float>(routing_backward(e)));
        if (aux) v = __fadd_rn(v, static_cast<float>(aux_loss_backward(e)));
        if (seq) v = __fadd_rn(v, static_cast<float>(sequence_aux_loss_backward(e)));
        if (zl) v = __fadd_rn(v, static_cast<float>(z_loss_backward(e)));
      }
      out[e] = v;
    });
  }
}

}  // namespace moeroute::kernels
