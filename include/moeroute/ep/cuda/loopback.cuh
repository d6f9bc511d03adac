// SPDX-License-Identifier: Apache-2.0
// R simulated ranks on one GPU: loopback_group::run calls a body once per rank, each on its own
// host thread with its own stream and a transport that is both the host ep::transport (for
// make_plan) and a device_transport whose all-to-all-v is device-to-device copies ordered by
// events. Multi-rank device kernels are checked on a single device this way; NCCL 2.28 refuses
// two ranks on one GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <moeroute/ep/cuda/transport.cuh>
#include <moeroute/ep/loopback.hpp>

namespace moeroute::ep::cuda {

namespace detail {
struct device_slot {
  const void* send = nullptr;
  std::span<const std::int64_t> send_rows, send_offsets, recv_rows;
  std::size_t row_bytes = 0;
  cudaEvent_t ready = nullptr, done = nullptr;
};
struct device_loopback_state {
  explicit device_loopback_state(std::int32_t ranks) : barrier(ranks), slots(ranks) {}
  moeroute::ep::detail::breakable_barrier barrier;
  std::vector<device_slot> slots;
};
inline status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return status::success();
  return status::make(status_code::cuda_error, std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace detail

/// @brief One rank of a device loopback group: host collectives through the host loopback,
///        device rows through peer copies on this rank's stream.
class loopback_transport final : public ep::transport, public device_transport {
 public:
  loopback_transport(ep::transport& host, detail::device_loopback_state& s) : host_(host), s_(s) {
    const std::int32_t r = host.rank();
    throw_if_error(detail::cuda_status(
        cudaEventCreateWithFlags(&s_.slots[r].ready, cudaEventDisableTiming), "cudaEventCreate"));
    throw_if_error(detail::cuda_status(
        cudaEventCreateWithFlags(&s_.slots[r].done, cudaEventDisableTiming), "cudaEventCreate"));
  }
  ~loopback_transport() override {
    (void)cudaEventDestroy(s_.slots[host_.rank()].ready);
    (void)cudaEventDestroy(s_.slots[host_.rank()].done);
  }
  [[nodiscard]] std::int32_t rank() const override { return host_.rank(); }
  [[nodiscard]] std::int32_t ranks() const override { return host_.ranks(); }
  void allgather(const void* send, void* recv, std::size_t bytes) override {
    host_.allgather(send, recv, bytes);
  }
  void alltoallv(const void* send, std::span<const std::int64_t> send_rows,
                 std::span<const std::int64_t> send_offsets, void* recv,
                 std::span<const std::int64_t> recv_rows,
                 std::span<const std::int64_t> recv_offsets, std::size_t row_bytes) override {
    host_.alltoallv(send, send_rows, send_offsets, recv, recv_rows, recv_offsets, row_bytes);
  }

  [[nodiscard]] status alltoallv(const void* d_send, std::span<const std::int64_t> send_rows,
                                 std::span<const std::int64_t> send_offsets, void* d_recv,
                                 std::span<const std::int64_t> recv_rows,
                                 std::span<const std::int64_t> recv_offsets, std::size_t row_bytes,
                                 cudaStream_t stream) override {
    const std::int32_t me = rank(), R = ranks();
    auto& mine = s_.slots[me];
    // 1. publish: my rows are ready once the work before this point on my stream is done
    if (auto s = detail::cuda_status(cudaEventRecord(mine.ready, stream), "cudaEventRecord"); !s)
      return s;
    mine.send = d_send;
    mine.send_rows = send_rows;
    mine.send_offsets = send_offsets;
    mine.recv_rows = recv_rows;
    mine.row_bytes = row_bytes;
    s_.barrier.arrive_and_wait();
    // 2. every rank checks the whole count matrix (same verdict everywhere), then pulls its rows
    status st;
    for (std::int32_t p = 0; p < R && st; ++p)
      for (std::int32_t q = 0; q < R && st; ++q)
        if (s_.slots[p].send_rows[q] != s_.slots[q].recv_rows[p] ||
            s_.slots[p].row_bytes != row_bytes)
          st = status::make(status_code::communication_error,
                            "device loopback alltoallv: rank " + std::to_string(p) + " sends " +
                                std::to_string(s_.slots[p].send_rows[q]) + " rows to rank " +
                                std::to_string(q) + ", which expects " +
                                std::to_string(s_.slots[q].recv_rows[p]));
    for (std::int32_t p = 0; p < R && st; ++p) {
      const auto& src = s_.slots[p];
      const std::size_t n = static_cast<std::size_t>(recv_rows[p]) * row_bytes;
      if (n == 0) continue;
      st = detail::cuda_status(cudaStreamWaitEvent(stream, src.ready, 0), "cudaStreamWaitEvent");
      if (st)
        st = detail::cuda_status(
            cudaMemcpyAsync(static_cast<char*>(d_recv) + recv_offsets[p] * row_bytes,
                            static_cast<const char*>(src.send) + src.send_offsets[me] * row_bytes,
                            n, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync");
    }
    if (st) st = detail::cuda_status(cudaEventRecord(mine.done, stream), "cudaEventRecord");
    s_.barrier.arrive_and_wait();
    // 3. my send buffer is free once every peer's copies are: later work on my stream waits
    for (std::int32_t p = 0; p < R && st; ++p)
      st = detail::cuda_status(cudaStreamWaitEvent(stream, s_.slots[p].done, 0),
                               "cudaStreamWaitEvent");
    s_.barrier.arrive_and_wait();  // slots may be overwritten by the next collective now
    return st;
  }

 private:
  ep::transport& host_;
  detail::device_loopback_state& s_;
};

/// @brief R ranks as host threads sharing the current device.
class loopback_group {
 public:
  explicit loopback_group(std::int32_t ranks) : host_(ranks) {}
  [[nodiscard]] std::int32_t ranks() const noexcept { return host_.ranks(); }
  /// @brief Runs body(transport, stream) once per rank, concurrently; each rank gets a stream
  ///        of its own (synchronised and destroyed after the body). Failures as
  ///        ep::loopback_group::run.
  void run(const std::function<void(loopback_transport&, cudaStream_t)>& body) const {
    detail::device_loopback_state state(host_.ranks());
    host_.run([&](ep::transport& host) {
      loopback_transport t(host, state);
      cudaStream_t stream = nullptr;
      throw_if_error(detail::cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                         "cudaStreamCreate"));
      struct guard {
        cudaStream_t s;
        ~guard() {
          (void)cudaStreamSynchronize(s);
          (void)cudaStreamDestroy(s);
        }
      } g{stream};
      body(t, stream);
    });
  }

 private:
  ep::loopback_group host_;
};

}  // namespace moeroute::ep::cuda
