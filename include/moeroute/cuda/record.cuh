// SPDX-License-Identifier: Apache-2.0
// Launcher: the record stage on the GPU (routing replay, docs/replay.md): one layer's ids into
// a caller-owned device record, the CUDA twin of cpu::record. Asynchronous and allocation
// free, so a captured CUDA graph records every replay of it into the same static buffer.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/kernels/record.cuh>
#include <moeroute/params/record.hpp>
#include <moeroute/status.hpp>

namespace moeroute::cuda {

using moeroute::record_params;

/// @brief Checks config, extents and pointers; names the first bad field.
template <class Id>
[[nodiscard]] status validate(const routing_config& cfg, const record_params<Id>& p) {
  return check_params(cfg, p);
}

/// @brief Writes p.d_ids (device) as layer p.layer of the device record, rows [first_token,
///        first_token + T): bitwise reference::record.
/// @note Asynchronous, no allocation, no synchronisation; capturable in a CUDA graph.
template <class Id>
[[nodiscard]] status record(const routing_config& cfg, const record_params<Id>& p,
                            cudaStream_t stream = nullptr) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0) return status::success();
  constexpr int threads = 256;
  const std::int64_t n = p.tokens * cfg.top_k;
  const auto blocks =
      static_cast<unsigned>(std::min<std::int64_t>((n + threads - 1) / threads, 4096));
  return launch("record_kernel", kernels::record_kernel<Id>, {blocks, threads, 0}, stream, p,
                cfg.top_k);
}

}  // namespace moeroute::cuda
