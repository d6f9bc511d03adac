// SPDX-License-Identifier: Apache-2.0
// The record kernel (routing replay, docs/replay.md): one layer's ids [T, k] into a record of
// every layer, one thread per id. Semantics: reference::record.
#pragma once

#include <cstdint>

#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/params/record.hpp>

namespace moeroute::kernels {

template <class Id>
__global__ void record_kernel(const record_params<Id> p, std::int32_t k) {
  enter_after_prior_grid();
  const std::int64_t n = p.tokens * k;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / k;
    const auto j = static_cast<std::int32_t>(i - t * k);
    p.d_record[record_offset(p, k, p.first_token + t, j)] = static_cast<Id>(p.d_ids[i]);
  }
}

}  // namespace moeroute::kernels
