// SPDX-License-Identifier: Apache-2.0
// Kernel: permute backward — each token's distinct rows of d buf summed into d x, in rank order
// (fp32, no float atomics).
#pragma once

#include <cstdint>

#include <moeroute/kernels/element.cuh>
#include <moeroute/kernels/grid_dependency.cuh>

namespace moeroute::kernels {

/// d x[t, c] = (accumulate ? d x[t, c] : 0) + sum of d buf[row, c] over the distinct rows of
/// token t in rank order (fp32, each add rounded on its own): equal to reference::permute_backward.
/// One block per token (grid-stride); threads over V-element chunks.
template <class T, int V>
__global__ void permute_backward_kernel(const T* __restrict__ d_buf,  // [rows, d]
                                        const std::int64_t* __restrict__ assignment_row,  // [T, k]
                                        std::int64_t tokens, std::int32_t k, std::int64_t hidden,
                                        bool accumulate, T* __restrict__ d_x) {  // [T, d]
  enter_after_prior_grid();
  using vec = element_vec<T, V>;
  const std::int64_t chunks = hidden / V;
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const std::int64_t* rows = assignment_row + t * k;
    vec* out = reinterpret_cast<vec*>(d_x + t * hidden);
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float acc[V];
      if (accumulate) {
        load_elements<T, V>(d_x + t * hidden + c * V, acc);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] = 0.0f;
      }
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int64_t row = rows[j];
        if (row < 0) continue;
        bool seen = false;
        for (std::int32_t i = 0; i < j; ++i) seen = seen || rows[i] == row;
        if (seen) continue;
        float g[V];
        load_elements<T, V>(d_buf + row * hidden + c * V, g);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] = __fadd_rn(acc[i], g[i]);
      }
      vec o;
#pragma unroll
      for (int i = 0; i < V; ++i) o.v[i] = element_from_float<T>(acc[i]);
      out[c] = o;
    }
  }
}

}  // namespace moeroute::kernels
