// SPDX-License-Identifier: Apache-2.0
// The two collectives expert parallelism needs, as an interface the host backend calls:
// an all-gather of one fixed-size record per rank (the plan's counts exchange) and an
// all-to-all-v of rows (dispatch and combine). Implementations: ep/loopback.hpp (R ranks as
// threads of one process), ep/mpi.hpp (an MPI communicator). An engine with its own
// communicator implements these two functions and gets every expert-parallel operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace moeroute::ep {

/// @brief A group of R ranks that can exchange bytes. Every member function is collective:
///        every rank calls it, in the same order, with agreeing sizes.
class transport {
 public:
  virtual ~transport() = default;
  [[nodiscard]] virtual std::int32_t rank() const = 0;   ///< this rank, 0 .. ranks()-1
  [[nodiscard]] virtual std::int32_t ranks() const = 0;  ///< R

  /// @brief recv[r * bytes .. (r+1) * bytes) = rank r's send[0 .. bytes). recv holds R * bytes.
  virtual void allgather(const void* send, void* recv, std::size_t bytes) = 0;

  /// @brief Rows of row_bytes each: this rank's rows [send_offsets[p], + send_rows[p]) go to
  ///        rank p and land at its recv_offsets[this rank]. Offsets and counts in rows, [R]
  ///        each; send_rows[p] on this rank must equal recv_rows[this rank] on rank p.
  virtual void alltoallv(const void* send, std::span<const std::int64_t> send_rows,
                         std::span<const std::int64_t> send_offsets, void* recv,
                         std::span<const std::int64_t> recv_rows,
                         std::span<const std::int64_t> recv_offsets, std::size_t row_bytes) = 0;
};

}  // namespace moeroute::ep
