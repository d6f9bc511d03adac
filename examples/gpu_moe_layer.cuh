// SPDX-License-Identifier: Apache-2.0
// What the GPU examples share around the library's owning router (moeroute::cuda::router,
// which allocates every routing buffer once and runs the launchers on a stream): device rows
// read back as floats, the same MoE layer on the CPU reference to check a GPU
// run against, and a naive grouped GEMM over the compact layout's blocks. Copy what you need.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/router.cuh>
#include <moeroute/dtype.hpp>
#include <moeroute/reference.hpp>
#include <moeroute/status.hpp>

namespace moeroute::examples {

/// Throws moeroute::error when a call returned an error (the examples' error handling; the
/// library returns statuses from every launch).
inline void check(const status& s, const char* what) {
  if (!s.ok()) throw error(status::make(s.code, std::string(what) + ": " + s.message));
}

using cuda::device_buffer;

/// `n` device elements at `d` as host floats (synchronous).
template <class Dev>
std::vector<float> host_floats(const Dev* d, std::size_t n) {
  std::vector<Dev> raw(n);
  if (n)
    cuda::throw_if_cuda_error(cudaMemcpy(raw.data(), d, n * sizeof(Dev), cudaMemcpyDeviceToHost),
                              "cudaMemcpy D2H");
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (sizeof(Dev) == 4) {
      std::memcpy(&out[i], &raw[i], 4);
    } else if constexpr (std::is_same_v<Dev, __half>) {
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
  reference::combine<float>(cfg, L, r.dispatch, ye, d, x, y);
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
