// SPDX-License-Identifier: Apache-2.0
// The two collectives expert parallelism needs, as an interface the host backend calls:
// an all-gather of one fixed-size record per rank (the plan's counts exchange) and an
// all-to-all-v of rows (dispatch and combine). Implementations: ep/loopback.hpp (R ranks as
// threads of one process), ep/mpi.hpp (an MPI communicator). An engine with its own
// communicator implements these two functions and gets every expert-parallel operation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace moeroute::ep {

/// @brief A contiguous run of rows exchanged with one peer: rows [offset, offset + rows) of a
///        buffer. A peer's rows may lie in several blocks (listed in order).
struct row_block {
  std::int32_t peer = 0;
  std::int64_t offset = 0;
  std::int64_t rows = 0;
  friend constexpr bool operator==(const row_block&, const row_block&) = default;
};

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

  /// @brief As alltoallv, with each peer's rows in blocks of the buffers (blocks grouped by
  ///        peer in rank order; a peer's rows run through its blocks in order). Lets a rank send
  ///        from and receive into its expert-major receive layout with no staging copy. The
  ///        default stages through alltoallv in a temporary buffer (it allocates); the MPI and
  ///        loopback transports override it with a copy-free exchange.
  virtual void alltoallv_blocks(const void* send, std::span<const row_block> send_blocks,
                                void* recv, std::span<const row_block> recv_blocks,
                                std::size_t row_bytes);

  /// @brief alltoallv_blocks for block lists that pair up: the n-th non-empty block this rank
  ///        lists for rank q holds as many rows as the n-th non-empty block q lists for this
  ///        rank (an ep::plan's lists do). A transport may then move each block as one message
  ///        (the MPI transport does: no datatype packing). The default calls alltoallv_blocks.
  virtual void alltoallv_paired_blocks(const void* send, std::span<const row_block> send_blocks,
                                       void* recv, std::span<const row_block> recv_blocks,
                                       std::size_t row_bytes) {
    alltoallv_blocks(send, send_blocks, recv, recv_blocks, row_bytes);
  }
};

namespace detail {
/// Rows per peer [R] of a block list, and the packed offsets [R + 1].
inline void block_counts(std::span<const row_block> blocks, std::int32_t R,
                         std::vector<std::int64_t>& rows, std::vector<std::int64_t>& offsets) {
  rows.assign(static_cast<std::size_t>(R), 0);
  for (const auto& b : blocks) rows[static_cast<std::size_t>(b.peer)] += b.rows;
  offsets.assign(static_cast<std::size_t>(R) + 1, 0);
  for (std::int32_t p = 0; p < R; ++p) offsets[p + 1] = offsets[p] + rows[p];
}
}  // namespace detail

inline void transport::alltoallv_blocks(const void* send, std::span<const row_block> send_blocks,
                                        void* recv, std::span<const row_block> recv_blocks,
                                        std::size_t row_bytes) {
  std::vector<std::int64_t> srows, soff, rrows, roff;
  detail::block_counts(send_blocks, ranks(), srows, soff);
  detail::block_counts(recv_blocks, ranks(), rrows, roff);
  std::vector<std::byte> out(static_cast<std::size_t>(soff.back()) * row_bytes),
      in(static_cast<std::size_t>(roff.back()) * row_bytes);
  std::size_t at = 0;
  for (const auto& b : send_blocks) {
    const std::size_t n = static_cast<std::size_t>(b.rows) * row_bytes;
    if (n)
      std::memcpy(out.data() + at, static_cast<const std::byte*>(send) + b.offset * row_bytes, n);
    at += n;
  }
  alltoallv(out.data(), srows, soff, in.data(), rrows, roff, row_bytes);
  at = 0;
  for (const auto& b : recv_blocks) {
    const std::size_t n = static_cast<std::size_t>(b.rows) * row_bytes;
    if (n) std::memcpy(static_cast<std::byte*>(recv) + b.offset * row_bytes, in.data() + at, n);
    at += n;
  }
}

namespace detail {
/// @brief Copies the rows `send` holds for rank `to` (its blocks naming `to`, in list order) into
///        the rows `recv` expects from rank `from` (its blocks naming `from`, in list order) —
///        the order in which MPI matches a send datatype's data to a receive datatype's. Both
///        sides must list the same number of rows (the caller checks).
inline void copy_matching_blocks(const void* send, std::span<const row_block> send_blocks,
                                 std::int32_t to, void* recv,
                                 std::span<const row_block> recv_blocks, std::int32_t from,
                                 std::size_t row_bytes) {
  const auto next = [](std::span<const row_block> b, std::size_t k, std::int32_t peer) {
    while (k < b.size() && (b[k].peer != peer || b[k].rows == 0)) ++k;
    return k;
  };
  std::size_t i = next(send_blocks, 0, to), j = next(recv_blocks, 0, from);
  std::int64_t used_i = 0, used_j = 0;
  while (i < send_blocks.size() && j < recv_blocks.size()) {
    const auto& a = send_blocks[i];
    const auto& b = recv_blocks[j];
    const std::int64_t n = std::min(a.rows - used_i, b.rows - used_j);
    std::memcpy(static_cast<char*>(recv) + (b.offset + used_j) * row_bytes,
                static_cast<const char*>(send) + (a.offset + used_i) * row_bytes,
                static_cast<std::size_t>(n) * row_bytes);
    used_i += n;
    used_j += n;
    if (used_i == a.rows) i = next(send_blocks, i + 1, to), used_i = 0;
    if (used_j == b.rows) j = next(recv_blocks, j + 1, from), used_j = 0;
  }
}
}  // namespace detail

}  // namespace moeroute::ep
