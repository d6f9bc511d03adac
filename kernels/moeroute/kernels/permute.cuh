// SPDX-License-Identifier: Apache-2.0
// Gather of hidden states into an expert layout: out[row] = x[row_token[row]], padding rows
// zero. One block per row (grid-stride), threads over 16-byte chunks when rows allow it.
#pragma once

#include <cstdint>

#include <moeroute/kernels/element.cuh>
#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

/// V = elements per access: vec16_elems<T> (16-byte path) or 1 (scalar path). Rows from
/// *d_num_rows (when given) to `rows` are not touched.
template <class T, int V>
__global__ void permute_kernel(const T* __restrict__ d_x,  // [T, d]
                               std::int64_t hidden, const const_layout_result layout,
                               std::int64_t rows,
                               T* __restrict__ d_out) {  // [rows, d]
  enter_after_prior_grid();
  using vec = element_vec<T, V>;
  const std::int64_t* d_num_rows = layout.d_num_rows;
  const std::int64_t used = d_num_rows ? (*d_num_rows < rows ? *d_num_rows : rows) : rows;
  const std::int64_t chunks = hidden / V;
  for (std::int64_t r = blockIdx.x; r < used; r += gridDim.x) {
    const std::int32_t t = layout.d_row_token[r];
    vec* out = reinterpret_cast<vec*>(d_out + r * hidden);
    if (t < 0) {
      vec z;
#pragma unroll
      for (int i = 0; i < V; ++i) z.v[i] = element_zero<T>();
      for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) out[c] = z;
    } else {
      const vec* in = reinterpret_cast<const vec*>(d_x + static_cast<std::int64_t>(t) * hidden);
      for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) out[c] = in[c];
    }
  }
}

}  // namespace moeroute::kernels
