// SPDX-License-Identifier: Apache-2.0
// A thin *owning* convenience layer for the examples and the GPU benchmarks: it allocates every
// device buffer the routing launchers need for one (config, T, d, layout) and runs the stages
// gating -> losses -> dispatch -> layout -> permute -> combine on a stream. The library's
// launchers never allocate; this file does (cudaMalloc in the constructor), and says so.
// Copy it into your project as a starting point.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <moeroute/capacity.hpp>
#include <moeroute/config.hpp>
#include <moeroute/cuda/combine.cuh>
#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/gating.cuh>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/cuda/losses.cuh>
#include <moeroute/cuda/permute.cuh>
#include <moeroute/dtype.hpp>
#include <moeroute/reference.hpp>
#include <moeroute/status.hpp>

namespace moeroute::examples {

/// Throws moeroute::error when a launcher returned an error (examples only; the library
/// returns statuses and never throws).
inline void check(const status& s, const char* what) {
  if (!s.ok()) throw error(status::make(s.code, std::string(what) + ": " + s.message));
}

using cuda::device_buffer;

/// What a routing call did, copied back to the host (synchronises).
struct routing_summary {
  dispatch_totals totals{};
  std::int64_t num_rows = 0;
  std::vector<std::int64_t> requested, kept, load;
  double aux_loss = 0.0, z_loss = 0.0;
  std::int64_t assignments = 0;
  [[nodiscard]] double drop_rate() const {
    const std::int64_t live = assignments - totals.masked;
    return live > 0 ? static_cast<double>(totals.dropped) / static_cast<double>(live) : 0.0;
  }
};

/// @brief Every buffer of one MoE routing for a fixed config and batch shape, and the stages.
/// @tparam Element the type of the hidden states and of the router logits: float, __half or
///         __nv_bfloat16.
template <class Element>
struct moe_pipeline {
  routing_config cfg;
  std::int64_t T = 0, d = 0;
  std::int32_t E = 0, k = 0, ET = 0, R = 0;
  layout_kind kind = layout_kind::compact;
  std::int64_t block_size = 1;
  std::int64_t max_rows = 0;

  // gating
  device_buffer<Element> logits;                                   // [T, E]
  device_buffer<float> bias;                                       // [E] (expert_bias only)
  device_buffer<std::int32_t> ids, reroute_ids;                    // [T, k], [T, R]
  device_buffer<float> gates, logsumexp;                           // [T, k], [T]
  device_buffer<double> aux_score_sum, z_sum;                      // [E], [1]
  device_buffer<std::int64_t> aux_count, valid_tokens, nonfinite;  // [E], [1], [1]
  device_buffer<double> seq_score_sum;                             // [S, E]
  device_buffer<std::int64_t> seq_count, seq_tokens;               // [S, E], [S]
  device_buffer<std::byte> gating_ws, dispatch_ws;
  // losses
  device_buffer<double> aux_loss, seq_aux_loss, z_loss;  // [1] each
  // dispatch
  device_buffer<std::int32_t> expert, slot;                        // [T, k]
  device_buffer<float> weight;                                     // [T, k]
  device_buffer<fate> fates;                                       // [T, k]
  device_buffer<std::int64_t> requested, kept, rerouted, dropped;  // [E]
  device_buffer<std::int64_t> received, load;                      // [ET]
  device_buffer<dispatch_totals> totals;                           // [1]
  // layout
  device_buffer<std::int64_t> offsets, rows_used, assignment_row,
      num_rows;                                         // [ET+1], [ET], [T,k], [1]
  device_buffer<std::int32_t> row_token, block_expert;  // [max_rows], [max_rows / block]
  // hidden states
  device_buffer<Element> x, xe, ye, y;  // [T,d], [max_rows,d], [max_rows,d], [T,d]

  /// Allocates everything (cudaMalloc). kind = padded needs a bounded capacity.
  moe_pipeline(const routing_config& c, std::int64_t tokens, std::int64_t hidden,
               layout_kind layout, std::int64_t block)
      : cfg(c), T(tokens), d(hidden), kind(layout), block_size(block) {
    check(validate(cfg), "config");
    E = cfg.num_experts;
    k = cfg.top_k;
    ET = cfg.total_experts();
    R = cfg.candidates_per_token() - k;
    max_rows = cuda::layout_max_rows(cfg, T, kind, block_size);
    if (max_rows < 0)
      throw std::invalid_argument(
          "padded layout needs a bounded capacity (capacity_mode::unbounded is compact-only)");
    const auto n = static_cast<std::size_t>(T * k);
    const std::int64_t S = cfg.loss.sequence_length > 0 ? T / cfg.loss.sequence_length : 0;
    logits = device_buffer<Element>(static_cast<std::size_t>(T * E));
    if (cfg.gating.expert_bias) bias = device_buffer<float>(E);
    ids = device_buffer<std::int32_t>(n);
    reroute_ids = device_buffer<std::int32_t>(static_cast<std::size_t>(T * R));
    gates = device_buffer<float>(n);
    logsumexp = device_buffer<float>(T);
    aux_score_sum = device_buffer<double>(E);
    z_sum = device_buffer<double>(1);
    aux_count = device_buffer<std::int64_t>(E);
    valid_tokens = device_buffer<std::int64_t>(1);
    nonfinite = device_buffer<std::int64_t>(1);
    seq_score_sum = device_buffer<double>(static_cast<std::size_t>(S * E));
    seq_count = device_buffer<std::int64_t>(static_cast<std::size_t>(S * E));
    seq_tokens = device_buffer<std::int64_t>(static_cast<std::size_t>(S));
    gating_ws = device_buffer<std::byte>(cuda::gating_workspace_bytes(cfg, T));
    dispatch_ws = device_buffer<std::byte>(cuda::dispatch_workspace_bytes(cfg, T));
    aux_loss = device_buffer<double>(1);
    seq_aux_loss = device_buffer<double>(1);
    z_loss = device_buffer<double>(1);
    expert = device_buffer<std::int32_t>(n);
    slot = device_buffer<std::int32_t>(n);
    weight = device_buffer<float>(n);
    fates = device_buffer<fate>(n);
    requested = device_buffer<std::int64_t>(E);
    kept = device_buffer<std::int64_t>(E);
    rerouted = device_buffer<std::int64_t>(E);
    dropped = device_buffer<std::int64_t>(E);
    received = device_buffer<std::int64_t>(ET);
    load = device_buffer<std::int64_t>(ET);
    totals = device_buffer<dispatch_totals>(1);
    offsets = device_buffer<std::int64_t>(ET + 1);
    rows_used = device_buffer<std::int64_t>(ET);
    assignment_row = device_buffer<std::int64_t>(n);
    num_rows = device_buffer<std::int64_t>(1);
    row_token = device_buffer<std::int32_t>(static_cast<std::size_t>(max_rows));
    if (kind == layout_kind::compact)
      block_expert = device_buffer<std::int32_t>(static_cast<std::size_t>(max_rows / block_size));
    x = device_buffer<Element>(static_cast<std::size_t>(T * d));
    xe = device_buffer<Element>(static_cast<std::size_t>(max_rows * d));
    ye = device_buffer<Element>(static_cast<std::size_t>(max_rows * d));
    y = device_buffer<Element>(static_cast<std::size_t>(T * d));
  }

  /// Host float -> device element of type E (float, or the 16-bit bits of __half / bf16).
  template <class Dev>
  static std::vector<Dev> convert(const std::vector<float>& h) {
    std::vector<Dev> out(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) {
      if constexpr (sizeof(Dev) == 4) {
        std::memcpy(static_cast<void*>(&out[i]), &h[i], 4);
      } else if constexpr (std::is_same_v<Dev, __half>) {
        const half_bits b = to_half(h[i]);
        std::memcpy(static_cast<void*>(&out[i]), &b.bits, 2);
      } else {
        const bf16_bits b = to_bf16(h[i]);
        std::memcpy(static_cast<void*>(&out[i]), &b.bits, 2);
      }
    }
    return out;
  }
  /// Uploads router logits [T, E] (rounded to Element).
  void upload_logits(const std::vector<float>& h) {
    if (h.size() != static_cast<std::size_t>(T * E))
      throw std::invalid_argument("upload_logits: size != T * E");
    logits.upload(convert<Element>(h));
  }
  /// Uploads hidden states [T, d].
  void upload_x(const std::vector<float>& h) { x.upload(convert<Element>(h)); }
  /// Downloads a device array of Element as floats (synchronous).
  static std::vector<float> to_host_floats(const device_buffer<Element>& b) {
    const auto raw = b.download();
    std::vector<float> out(raw.size());
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if constexpr (sizeof(Element) == 4) {
        std::memcpy(&out[i], &raw[i], 4);
      } else if constexpr (std::is_same_v<Element, __half>) {
        half_bits b;
        std::memcpy(&b.bits, &raw[i], 2);
        out[i] = to_float(b);
      } else {
        bf16_bits b;
        std::memcpy(&b.bits, &raw[i], 2);
        out[i] = to_float(b);
      }
    }
    return out;
  }

  /// The outputs of each stage as the views the next stages read.
  [[nodiscard]] gating_result gated() const {
    return {ids.get(),
            gates.get(),
            R > 0 ? reroute_ids.get() : nullptr,
            logsumexp.get(),
            {aux_score_sum.get(), aux_count.get(), valid_tokens.get(), z_sum.get(), nonfinite.get(),
             seq_score_sum.get(), seq_count.get(), seq_tokens.get()}};
  }
  [[nodiscard]] dispatch_result dispatched() const {
    return {expert.get(),   slot.get(),    weight.get(),   fates.get(), requested.get(), kept.get(),
            rerouted.get(), dropped.get(), received.get(), load.get(),  totals.get()};
  }
  [[nodiscard]] layout_result laid_out() const {
    return {offsets.get(),
            rows_used.get(),
            row_token.get(),
            assignment_row.get(),
            kind == layout_kind::compact ? block_expert.get() : nullptr,
            num_rows.get()};
  }

  status gate(cudaStream_t s = nullptr) {
    cuda::gating_params<Element> p;
    p.d_logits = logits.get();
    p.tokens = T;
    p.d_bias = cfg.gating.expert_bias ? bias.get() : nullptr;
    p.out = gated();
    return cuda::gating(cfg, p, gating_ws.get(), gating_ws.bytes(), s);
  }

  status losses(cudaStream_t s = nullptr) {
    cuda::loss_params p;
    p.tokens = T;
    p.sums = gated().sums;
    p.d_aux_loss = aux_loss.get();
    p.d_sequence_aux_loss = seq_aux_loss.get();
    p.d_z_loss = z_loss.get();
    return cuda::losses(cfg, p, s);
  }

  status dispatch(cudaStream_t s = nullptr) {
    cuda::dispatch_params p;
    p.tokens = T;
    p.gated = gated();
    p.out = dispatched();
    return cuda::dispatch(cfg, p, dispatch_ws.get(), dispatch_ws.bytes(), s);
  }

  status layout(cudaStream_t s = nullptr) {
    cuda::layout_params p;
    p.kind = kind;
    p.block_size = kind == layout_kind::compact ? block_size : 1;
    p.tokens = T;
    p.max_rows = max_rows;
    p.dispatched = dispatched();
    p.out = laid_out();
    return cuda::layout(cfg, p, s);
  }

  status permute(cudaStream_t s = nullptr) {
    cuda::permute_params<Element> p;
    p.d_x = x.get();
    p.tokens = T;
    p.hidden = d;
    p.layout = laid_out();
    p.rows = max_rows;
    p.d_out = xe.get();
    return cuda::permute(cfg, p, s);
  }

  /// y = combine of `ye` (the experts' outputs in layout order).
  status combine(cudaStream_t s = nullptr) {
    cuda::combine_params<Element> p;
    p.d_expert_out = ye.get();
    p.rows = max_rows;
    p.tokens = T;
    p.hidden = d;
    p.layout = laid_out();
    p.dispatched = dispatched();
    p.d_x = x.get();
    p.d_y = y.get();
    return cuda::combine(cfg, p, s);
  }

  /// Routing only: gating, losses, dispatch, layout.
  status route(cudaStream_t s = nullptr) {
    if (auto st = gate(s); !st) return st;
    if (auto st = losses(s); !st) return st;
    if (auto st = dispatch(s); !st) return st;
    return layout(s);
  }

  /// Copies the counts back (synchronises the device).
  routing_summary summary() const {
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    routing_summary r;
    r.assignments = T * k;
    const auto t = totals.download();
    if (!t.empty()) r.totals = t[0];
    const auto nr = num_rows.download();
    r.num_rows = nr.empty() ? 0 : nr[0];
    r.requested = requested.download();
    r.kept = kept.download();
    r.load = load.download();
    const auto a = aux_loss.download();
    const auto z = z_loss.download();
    r.aux_loss = a.empty() ? 0.0 : a[0];
    r.z_loss = z.empty() ? 0.0 : z[0];
    return r;
  }
};

/// @brief The same MoE layer on the CPU reference, to check a GPU run against:
///        route -> layout -> permute -> y_e = relu(x_e W1[e]) W2[e] per expert -> combine.
/// @param w1 [ET, d, f] and w2 [ET, f, d] row-major expert weights (ET = cfg.total_experts()).
inline std::vector<float> reference_moe_forward(
    const routing_config& cfg, const std::vector<float>& logits, const std::vector<float>& bias,
    const std::vector<float>& x, std::int64_t T, std::int64_t d, std::int64_t f,
    const std::vector<float>& w1, const std::vector<float>& w2, bool padded,
    std::int64_t block_size, reference::routing_result* out_routing = nullptr) {
  const auto r = reference::route<float>(cfg, logits, T, bias);
  const auto L = padded ? reference::layout(cfg, r.dispatch, layout_kind::padded)
                        : reference::layout(cfg, r.dispatch, layout_kind::compact, block_size);
  std::vector<float> xe(static_cast<std::size_t>(L.num_rows * d)), ye(xe.size(), 0.0f),
      h(static_cast<std::size_t>(f));
  reference::permute<float>(cfg, L, x, T, d, xe);
  for (std::int32_t e = 0; e < L.total_experts; ++e)
    for (std::int64_t row = L.offsets[e]; row < L.offsets[e + 1]; ++row) {
      if (L.row_token[row] < 0) continue;
      for (std::int64_t j = 0; j < f; ++j) {
        float acc = 0.0f;
        for (std::int64_t c = 0; c < d; ++c) acc += xe[row * d + c] * w1[(e * d + c) * f + j];
        h[j] = acc > 0.0f ? acc : 0.0f;
      }
      for (std::int64_t c = 0; c < d; ++c) {
        float acc = 0.0f;
        for (std::int64_t j = 0; j < f; ++j) acc += h[j] * w2[(e * f + j) * d + c];
        ye[row * d + c] = acc;
      }
    }
  std::vector<float> y(static_cast<std::size_t>(T * d));
  reference::combine<float>(cfg, r.dispatch, L, ye, d, x, y);
  if (out_routing) *out_routing = r;
  return y;
}

/// Largest |a - b| / max(1, |b|) over two equally long arrays.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double den = std::fabs(b[i]) > 1.0 ? std::fabs(b[i]) : 1.0;
    const double v = std::fabs(static_cast<double>(a[i]) - b[i]) / den;
    if (!(v <= m)) m = v;  // NaN propagates
  }
  return a.size() == b.size() ? m : INFINITY;
}

/// Row-block "grouped GEMM" for the compact layout: rows [b*B, (b+1)*B) all belong to expert
/// block_expert[b] (-1 = unused block), so C[rows] = A[rows] @ W[e] (+ ReLU). Naive on
/// purpose: a real model hands block_expert to a grouped GEMM (CUTLASS, Triton fused_moe).
/// grid (blocks, ceil(N / 128)), 128 threads; A [rows, K], W [experts, K, N], C [rows, N].
template <class F = float>
__global__ void block_grouped_gemm(const F* __restrict__ A, const F* __restrict__ W,
                                   const std::int32_t* __restrict__ block_expert,
                                   std::int64_t block_rows, std::int64_t K, std::int64_t N,
                                   bool relu, F* __restrict__ C) {
  const std::int32_t e = block_expert[blockIdx.x];
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (e < 0 || n >= N) return;
  const F* w = W + static_cast<std::int64_t>(e) * K * N;
  for (std::int64_t r = blockIdx.x * block_rows; r < (blockIdx.x + 1) * block_rows; ++r) {
    float acc = 0.0f;
    for (std::int64_t c = 0; c < K; ++c)
      acc = __fadd_rn(acc, __fmul_rn(A[r * K + c], w[c * N + n]));
    C[r * N + n] = relu ? fmaxf(acc, 0.0f) : acc;
  }
}

/// Deterministic pseudo-random floats in [-scale, scale) for example inputs.
inline std::vector<float> example_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  std::uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = scale * (static_cast<float>(s >> 40) / 8388608.0f - 1.0f);
  }
  return v;
}

}  // namespace moeroute::examples
