// SPDX-License-Identifier: Apache-2.0
// The device side of a transport: an all-to-all-v of rows in device memory, enqueued on a
// stream. Counts and offsets are the plan's host arrays, so no device-to-host read is needed.
// Implementations: ep::nccl_transport (<moeroute/ep/nccl.cuh>) and ep::cuda::loopback_group
// (R ranks as threads on one GPU, <moeroute/ep/cuda/loopback.cuh>).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include <moeroute/status.hpp>

namespace moeroute::ep::cuda {

/// @brief A group of R ranks that exchanges device rows on a stream. Collective: every rank
///        calls alltoallv in the same order with agreeing counts (the plan's).
class device_transport {
 public:
  virtual ~device_transport() = default;
  [[nodiscard]] virtual std::int32_t rank() const = 0;
  [[nodiscard]] virtual std::int32_t ranks() const = 0;
  /// @brief As ep::transport::alltoallv, with d_send and d_recv in device memory; enqueued on
  ///        `stream`, which orders it after the work that produced d_send. Never synchronises.
  [[nodiscard]] virtual status alltoallv(const void* d_send,
                                         std::span<const std::int64_t> send_rows,
                                         std::span<const std::int64_t> send_offsets, void* d_recv,
                                         std::span<const std::int64_t> recv_rows,
                                         std::span<const std::int64_t> recv_offsets,
                                         std::size_t row_bytes, cudaStream_t stream) = 0;
};

}  // namespace moeroute::ep::cuda
