// SPDX-License-Identifier: Apache-2.0
// R simulated ranks in one process: loopback_group::run calls a body once per rank, each on its
// own thread with its own transport, and the collectives copy between the threads' buffers.
// Every expert-parallel test body runs here without MPI, and a single machine (or a single
// GPU's host side) can check multi-rank behaviour. A rank that throws breaks the group: its
// peers waiting in a collective throw too, so a failure is an error, never a hang.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <moeroute/ep/transport.hpp>
#include <moeroute/status.hpp>

namespace moeroute::ep {

namespace detail {
/// A barrier that a failing thread can break: waiters then throw instead of waiting forever.
class breakable_barrier {
 public:
  explicit breakable_barrier(std::int32_t parties) : parties_(parties) {}
  void arrive_and_wait() {
    std::unique_lock lock(m_);
    if (broken_) throw_broken();
    const std::uint64_t gen = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || broken_; });
    if (generation_ == gen) throw_broken();
  }
  void break_barrier() {
    std::lock_guard lock(m_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  [[noreturn]] static void throw_broken() {
    throw error(
        status::make(status_code::communication_error,
                     "loopback: a peer rank failed while this rank waited in a collective"));
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::int32_t parties_;
  std::int32_t arrived_ = 0;
  std::uint64_t generation_ = 0;
  bool broken_ = false;
};

/// What each rank publishes for one collective; peers read it between two barriers.
struct loopback_slot {
  const void* send = nullptr;
  std::span<const std::int64_t> send_rows, send_offsets, recv_rows;
  std::span<const row_block> send_blocks, recv_blocks;
  std::size_t bytes = 0;
};

/// Rows a block list holds for `peer`.
inline std::int64_t rows_for(std::span<const row_block> blocks, std::int32_t peer) {
  std::int64_t n = 0;
  for (const auto& b : blocks) n += b.peer == peer ? b.rows : 0;
  return n;
}

struct loopback_state {
  explicit loopback_state(std::int32_t ranks) : barrier(ranks), slots(ranks) {}
  breakable_barrier barrier;
  std::vector<loopback_slot> slots;
};
}  // namespace detail

/// @brief One rank of a loopback group (made by loopback_group::run).
class loopback_transport final : public transport {
 public:
  loopback_transport(detail::loopback_state& s, std::int32_t rank) : s_(s), rank_(rank) {}
  [[nodiscard]] std::int32_t rank() const override { return rank_; }
  [[nodiscard]] std::int32_t ranks() const override {
    return static_cast<std::int32_t>(s_.slots.size());
  }

  void allgather(const void* send, void* recv, std::size_t bytes) override {
    s_.slots[rank_] = {send, {}, {}, {}, {}, {}, bytes};
    s_.barrier.arrive_and_wait();
    // Every rank checks every rank's size, so a disagreement is the same error everywhere.
    for (std::int32_t r = 0; r < ranks(); ++r)
      if (s_.slots[r].bytes != bytes) mismatch("allgather bytes", r, s_.slots[r].bytes, bytes);
    for (std::int32_t r = 0; r < ranks(); ++r)
      if (bytes) std::memcpy(static_cast<char*>(recv) + r * bytes, s_.slots[r].send, bytes);
    s_.barrier.arrive_and_wait();
  }

  void alltoallv(const void* send, std::span<const std::int64_t> send_rows,
                 std::span<const std::int64_t> send_offsets, void* recv,
                 std::span<const std::int64_t> recv_rows,
                 std::span<const std::int64_t> recv_offsets, std::size_t row_bytes) override {
    const auto R = static_cast<std::size_t>(ranks());
    if (send_rows.size() != R || send_offsets.size() < R || recv_rows.size() != R ||
        recv_offsets.size() < R)
      throw error(status::make(status_code::invalid_shape,
                               "loopback alltoallv: count and offset arrays need ranks() entries"));
    s_.slots[rank_] = {send, send_rows, send_offsets, recv_rows, {}, {}, row_bytes};
    s_.barrier.arrive_and_wait();
    for (std::size_t p = 0; p < R; ++p) {
      const auto& src = s_.slots[p];
      if (src.bytes != row_bytes)
        mismatch("alltoallv row_bytes", static_cast<std::int32_t>(p), src.bytes, row_bytes);
      for (std::size_t q = 0; q < R; ++q) {
        const auto& dst = s_.slots[q];
        if (src.send_rows[q] != dst.recv_rows[p])
          throw error(status::make(status_code::invalid_argument,
                                   "loopback alltoallv: rank " + std::to_string(p) + " sends " +
                                       std::to_string(src.send_rows[q]) + " rows to rank " +
                                       std::to_string(q) + ", which expects " +
                                       std::to_string(dst.recv_rows[p])));
      }
    }
    for (std::size_t p = 0; p < R; ++p) {
      const auto& src = s_.slots[p];
      const std::size_t n = static_cast<std::size_t>(recv_rows[p]) * row_bytes;
      if (n)
        std::memcpy(static_cast<char*>(recv) + recv_offsets[p] * row_bytes,
                    static_cast<const char*>(src.send) + src.send_offsets[rank_] * row_bytes, n);
    }
    s_.barrier.arrive_and_wait();
  }

  /// Copy-free: each receiver copies straight from the source's blocks into its own.
  void alltoallv_blocks(const void* send, std::span<const row_block> send_blocks, void* recv,
                        std::span<const row_block> recv_blocks, std::size_t row_bytes) override {
    s_.slots[rank_] = {send, {}, {}, {}, send_blocks, recv_blocks, row_bytes};
    s_.barrier.arrive_and_wait();
    const std::int32_t R = ranks();
    for (std::int32_t p = 0; p < R; ++p) {
      const auto& src = s_.slots[p];
      if (src.bytes != row_bytes) mismatch("alltoallv row_bytes", p, src.bytes, row_bytes);
      for (std::int32_t q = 0; q < R; ++q) {
        const std::int64_t out = detail::rows_for(src.send_blocks, q),
                           in = detail::rows_for(s_.slots[q].recv_blocks, p);
        if (out != in)
          throw error(status::make(status_code::communication_error,
                                   "loopback alltoallv: rank " + std::to_string(p) + " sends " +
                                       std::to_string(out) + " rows to rank " + std::to_string(q) +
                                       ", which expects " + std::to_string(in)));
      }
    }
    for (std::int32_t p = 0; p < R; ++p) {
      const auto& src = s_.slots[p];
      detail::copy_matching_blocks(src.send, src.send_blocks, rank_, recv, recv_blocks, p,
                                   row_bytes);
    }
    s_.barrier.arrive_and_wait();
  }

 private:
  [[noreturn]] static void mismatch(const char* what, std::int32_t r, std::size_t got,
                                    std::size_t mine) {
    throw error(status::make(status_code::invalid_argument,
                             std::string("loopback ") + what + ": rank " + std::to_string(r) +
                                 " passed " + std::to_string(got) + ", another rank " +
                                 std::to_string(mine)));
  }
  detail::loopback_state& s_;
  std::int32_t rank_;
};

/// @brief R ranks as threads of this process.
class loopback_group {
 public:
  explicit loopback_group(std::int32_t ranks) : ranks_(ranks) {
    if (ranks < 1 || ranks > 4096)
      throw error(status::make(
          status_code::invalid_argument,
          "loopback_group ranks = " + std::to_string(ranks) + ": must be in [1, 4096]"));
  }
  [[nodiscard]] std::int32_t ranks() const noexcept { return ranks_; }

  /// @brief Runs body(transport&) once per rank, concurrently, and waits for all. If any rank
  ///        throws, its peers' collectives fail too, and run rethrows the lowest rank's
  ///        original exception (a peer's "a peer rank failed" only when nothing else was thrown).
  void run(const std::function<void(transport&)>& body) const {
    detail::loopback_state state(ranks_);
    std::vector<std::exception_ptr> failed(ranks_);
    std::vector<char> secondary(ranks_, 0);
    std::vector<std::thread> threads;
    threads.reserve(ranks_);
    for (std::int32_t r = 0; r < ranks_; ++r) {
      threads.emplace_back([&, r] {
        loopback_transport t(state, r);
        try {
          body(t);
        } catch (const error& e) {
          failed[r] = std::current_exception();
          secondary[r] =
              e.get_status().code == status_code::communication_error &&
              std::string(e.what()).find("loopback: a peer rank failed") != std::string::npos;
          state.barrier.break_barrier();
        } catch (...) {
          failed[r] = std::current_exception();
          state.barrier.break_barrier();
        }
      });
    }
    for (auto& th : threads) th.join();
    for (std::int32_t r = 0; r < ranks_; ++r)
      if (failed[r] && !secondary[r]) std::rethrow_exception(failed[r]);
    for (std::int32_t r = 0; r < ranks_; ++r)
      if (failed[r]) std::rethrow_exception(failed[r]);
  }

 private:
  std::int32_t ranks_;
};

}  // namespace moeroute::ep
