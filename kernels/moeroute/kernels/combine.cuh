// SPDX-License-Identifier: Apache-2.0
// Weighted sum of expert outputs back into token order: y[t] = sum_j w[t,j] * out[row(t,j)],
// the k terms added in rank order j = 0..k-1 in fp32, each multiply and add rounded on its
// own (no fma), so the result is bitwise reproducible and equal to the CPU reference.
#pragma once

#include <cstdint>

#include <moeroute/kernels/element.cuh>
#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

/// One block per token (grid-stride), threads over V-element chunks of the row. With
/// `residual`, a valid token with no row gets x[t] (copied).
template <class T, int V>
__global__ void combine_kernel(const T* __restrict__ d_expert_out,      // [rows, d]
                               const const_layout_result layout,        // assignment_row [T, k]
                               const const_dispatch_result dispatched,  // weight, fate [T, k]
                               const T* __restrict__ d_x,               // [T, d] (residual)
                               std::int64_t tokens, std::int32_t k, std::int64_t hidden,
                               bool residual, T* __restrict__ d_y) {  // [T, d]
  enter_after_prior_grid();
  using vec = element_vec<T, V>;
  const std::int64_t* assignment_row = layout.d_assignment_row;
  const std::int64_t chunks = hidden / V;
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    bool any = false;
    for (std::int32_t j = 0; j < k; ++j) any = any || assignment_row[t * k + j] >= 0;
    vec* y = reinterpret_cast<vec*>(d_y + t * hidden);
    if (residual && !any && dispatched.d_fate[t * k] != fate::masked) {
      const vec* x = reinterpret_cast<const vec*>(d_x + t * hidden);
      for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) y[c] = x[c];
      continue;
    }
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float acc[V];
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] = 0.0f;
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int64_t row = assignment_row[t * k + j];
        if (row < 0) continue;
        const float w = dispatched.d_weight[t * k + j];
        const vec o = reinterpret_cast<const vec*>(d_expert_out + row * hidden)[c];
#pragma unroll
        for (int i = 0; i < V; ++i)
          acc[i] = __fadd_rn(acc[i], __fmul_rn(w, element_to_float(o.v[i])));
      }
      vec out;
#pragma unroll
      for (int i = 0; i < V; ++i) out.v[i] = element_from_float<T>(acc[i]);
      y[c] = out;
    }
  }
}

}  // namespace moeroute::kernels
