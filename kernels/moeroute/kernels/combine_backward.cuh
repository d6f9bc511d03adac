// SPDX-License-Identifier: Apache-2.0
// Backward of combine (d expert outputs, d combine weights, the residual pass-through; permute's
// backward is permute_backward.cuh). Deterministic: no atomics; every sum runs in a fixed order
// (a token's assignments in rank order, or a fixed butterfly over a warp).
#pragma once

#include <cstdint>

#include <moeroute/kernels/element.cuh>
#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

/// d expert_out[r, c] = sum over the assignments j of row r's token that hold r, in rank order,
/// of w[t, j] * dy[t, c] (fp32, each multiply and add rounded on its own). Block-stride rows;
/// threads over V-element chunks (V = vec16_elems<T>: 16-byte accesses, or 1).
template <class T, int V>
__global__ void combine_backward_rows_kernel(
    const T* __restrict__ dy,                         // [T, d]
    const std::int32_t* __restrict__ row_token,       // [rows]
    const std::int64_t* __restrict__ assignment_row,  // [T, k]
    const float* __restrict__ weight,                 // [T, k]
    std::int64_t rows, std::int32_t k, std::int64_t hidden,
    T* __restrict__ d_expert_out) {  // [rows, d]
  enter_after_prior_grid();
  using vec = element_vec<T, V>;
  const std::int64_t chunks = hidden / V;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int32_t t = row_token[r];
    vec* out = reinterpret_cast<vec*>(d_expert_out + r * hidden);
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float acc[V];
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] = 0.0f;
      if (t >= 0) {
        float g[V];
        load_elements<T, V>(dy + static_cast<std::int64_t>(t) * hidden + c * V, g);
        for (std::int32_t j = 0; j < k; ++j)
          if (assignment_row[static_cast<std::int64_t>(t) * k + j] == r) {
            const float w = weight[static_cast<std::int64_t>(t) * k + j];
#pragma unroll
            for (int i = 0; i < V; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(w, g[i]));
          }
      }
      vec o;
#pragma unroll
      for (int i = 0; i < V; ++i) o.v[i] = element_from_float<T>(acc[i]);
      out[c] = o;
    }
  }
}

/// One block per token: warp w computes d weight of assignments j = w, w + warps, ... (lane
/// partial sums over its V-element chunks lane, lane + 32, ..., then a fixed butterfly); the
/// whole block writes the residual pass-through d x (dy for a valid token with nothing kept,
/// else 0).
template <class T, int V>
__global__ void combine_backward_tokens_kernel(
    const T* __restrict__ dy,                         // [T, d]
    const T* __restrict__ expert_out,                 // [rows, d]
    const std::int64_t* __restrict__ assignment_row,  // [T, k]
    const fate* __restrict__ fates,                   // [T, k]
    std::int64_t tokens, std::int32_t k, std::int64_t hidden, bool residual,
    float* __restrict__ d_weight,  // [T, k]
    T* __restrict__ d_x) {         // [T, d] or null
  enter_after_prior_grid();
  using vec = element_vec<T, V>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const std::int64_t chunks = hidden / V;
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    bool any = false;
    for (std::int32_t j = 0; j < k; ++j) any = any || assignment_row[t * k + j] >= 0;
    for (std::int32_t j = warp; j < k; j += warps) {
      const std::int64_t row = assignment_row[t * k + j];
      const bool live = row >= 0 && holds_row(fates[t * k + j]);
      float acc = 0.0f;
      if (live)
        for (std::int64_t c = lane; c < chunks; c += 32) {
          float g[V], o[V];
          load_elements<T, V>(dy + t * hidden + c * V, g);
          load_elements<T, V>(expert_out + row * hidden + c * V, o);
#pragma unroll
          for (int i = 0; i < V; ++i) acc = __fadd_rn(acc, __fmul_rn(g[i], o[i]));
        }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
      if (lane == 0) d_weight[t * k + j] = acc;
    }
    if (d_x != nullptr) {
      const bool pass = residual && !any && k > 0 && fates[t * k] != fate::masked;
      const vec* in = reinterpret_cast<const vec*>(dy + t * hidden);
      vec* out = reinterpret_cast<vec*>(d_x + t * hidden);
      vec z;
#pragma unroll
      for (int i = 0; i < V; ++i) z.v[i] = element_zero<T>();
      for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) out[c] = pass ? in[c] : z;
    }
  }
}

}  // namespace moeroute::kernels
