// SPDX-License-Identifier: Apache-2.0
// The NCCL transport (opt-in: link moeroute::ep_nccl). NCCL 2.28, the one in the CUDA toolkit
// here, has no all-to-all-v: rows travel as grouped ncclSend / ncclRecv per peer, or one
// ncclAlltoAll when every peer gets the same number of rows. It is also the host transport of
// make_plan, whose all-gather goes through a device buffer and synchronises the stream: the
// layer's one host sync.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <string>

#include <moeroute/ep/cuda/transport.cuh>
#include <moeroute/ep/transport.hpp>
#include <moeroute/status.hpp>

namespace moeroute::ep {

/// @brief ep::transport and ep::cuda::device_transport over a NCCL communicator (not owned).
class nccl_transport final : public transport, public cuda::device_transport {
 public:
  /// @param comm   an initialised communicator; the caller keeps ownership
  /// @param stream the stream make_plan's all-gather runs on (and synchronises)
  nccl_transport(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
    int r = 0, n = 0;
    throw_if_error(check(ncclCommUserRank(comm, &r), "ncclCommUserRank"));
    throw_if_error(check(ncclCommCount(comm, &n), "ncclCommCount"));
    rank_ = r;
    ranks_ = n;
  }
  nccl_transport(const nccl_transport&) = delete;
  nccl_transport& operator=(const nccl_transport&) = delete;
  ~nccl_transport() override {
    if (scratch_) (void)cudaFree(scratch_);
  }

  [[nodiscard]] std::int32_t rank() const override { return rank_; }
  [[nodiscard]] std::int32_t ranks() const override { return ranks_; }

  /// Host all-gather (make_plan only): through a device buffer this transport owns, grown on
  /// demand; synchronises the stream.
  void allgather(const void* send, void* recv, std::size_t bytes) override {
    const std::size_t need = bytes * (static_cast<std::size_t>(ranks_) + 1);
    if (need > scratch_bytes_) {
      if (scratch_) throw_if_error(cuda_check(cudaFree(scratch_), "cudaFree"));
      scratch_ = nullptr;
      throw_if_error(cuda_check(cudaMalloc(&scratch_, need), "cudaMalloc"));
      scratch_bytes_ = need;
    }
    char* d_send = static_cast<char*>(scratch_);
    char* d_recv = d_send + bytes;
    throw_if_error(cuda_check(cudaMemcpyAsync(d_send, send, bytes, cudaMemcpyHostToDevice, stream_),
                              "cudaMemcpyAsync"));
    throw_if_error(
        check(ncclAllGather(d_send, d_recv, bytes, ncclChar, comm_, stream_), "ncclAllGather"));
    throw_if_error(
        cuda_check(cudaMemcpyAsync(recv, d_recv, bytes * ranks_, cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpyAsync"));
    throw_if_error(cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  }

  /// Host rows are not moved over NCCL: the host path uses MPI or loopback.
  void alltoallv(const void*, std::span<const std::int64_t>, std::span<const std::int64_t>, void*,
                 std::span<const std::int64_t>, std::span<const std::int64_t>,
                 std::size_t) override {
    throw error(status::make(status_code::unsupported,
                             "nccl_transport moves device rows only: use the ep::cuda launchers "
                             "(host rows: ep::mpi_transport or ep::loopback_group)"));
  }

  [[nodiscard]] status alltoallv(const void* d_send, std::span<const std::int64_t> send_rows,
                                 std::span<const std::int64_t> send_offsets, void* d_recv,
                                 std::span<const std::int64_t> recv_rows,
                                 std::span<const std::int64_t> recv_offsets, std::size_t row_bytes,
                                 cudaStream_t stream) override {
    if (row_bytes == 0) return status::success();
    const auto R = static_cast<std::size_t>(ranks_);
    // Equal blocks laid out in rank order: one ncclAlltoAll.
    bool equal = true;
    for (std::size_t p = 0; p < R && equal; ++p)
      equal = send_rows[p] == send_rows[0] && recv_rows[p] == send_rows[0] &&
              send_offsets[p] == static_cast<std::int64_t>(p) * send_rows[0] &&
              recv_offsets[p] == static_cast<std::int64_t>(p) * send_rows[0];
    if (equal && send_rows[0] > 0)
      return check(ncclAlltoAll(d_send, d_recv, static_cast<std::size_t>(send_rows[0]) * row_bytes,
                                ncclChar, comm_, stream),
                   "ncclAlltoAll");
    if (auto s = check(ncclGroupStart(), "ncclGroupStart"); !s) return s;
    status st;
    for (std::size_t p = 0; p < R && st; ++p) {
      const int peer = static_cast<int>(p);
      if (send_rows[p] > 0)
        st = check(ncclSend(static_cast<const char*>(d_send) + send_offsets[p] * row_bytes,
                            static_cast<std::size_t>(send_rows[p]) * row_bytes, ncclChar, peer,
                            comm_, stream),
                   "ncclSend");
      if (st && recv_rows[p] > 0)
        st = check(ncclRecv(static_cast<char*>(d_recv) + recv_offsets[p] * row_bytes,
                            static_cast<std::size_t>(recv_rows[p]) * row_bytes, ncclChar, peer,
                            comm_, stream),
                   "ncclRecv");
    }
    const status end = check(ncclGroupEnd(), "ncclGroupEnd");
    return st ? end : st;
  }

 private:
  static status check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return status::success();
    return status::make(status_code::communication_error,
                        std::string(what) + " failed: " + ncclGetErrorString(r));
  }
  static status cuda_check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return status::success();
    return status::make(status_code::cuda_error, std::string(what) + ": " + cudaGetErrorString(e));
  }
  ncclComm_t comm_;
  cudaStream_t stream_;
  std::int32_t rank_ = 0, ranks_ = 1;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
};

}  // namespace moeroute::ep
