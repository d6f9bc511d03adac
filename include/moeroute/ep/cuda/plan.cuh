// SPDX-License-Identifier: Apache-2.0
// The plan's index arrays in device memory, for the device dispatch, combine and backward
// launchers. Caller-owned: size them with device_plan_bytes, fill them once per plan with
// upload (asynchronous copies from the host plan, which must stay alive until they complete).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <moeroute/ep/plan.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::ep::cuda {

/// @brief Device views of one plan. Shapes from the plan: T tokens, k choices.
struct device_plan {
  const std::int32_t* d_send_token = nullptr;      ///< [send_total] int32 token of each send row
  const std::int64_t* d_assignment_row = nullptr;  ///< [T, k] int64 send row, -1 none
  const std::int32_t* d_staging_row = nullptr;     ///< [recv_total] int32 receive row
  const std::int32_t* d_receive_source = nullptr;  ///< [receive_rows] int32 staging row, -1 pad
  const float* d_weight = nullptr;                 ///< [T, k] f32 combine weights
  const fate* d_fate = nullptr;                    ///< [T, k] fates
};

namespace detail {
inline std::size_t up256(std::size_t n) { return (n + 255) / 256 * 256; }
struct plan_sizes {
  std::size_t send_token, assignment_row, staging_row, receive_source, weight, fate;
  [[nodiscard]] std::size_t total() const {
    return send_token + assignment_row + staging_row + receive_source + weight + fate;
  }
};
inline plan_sizes sizes_of(const plan& p) {
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  const std::size_t tk = n(p.tokens) * n(p.decision.k);
  return {up256(n(p.send_total()) * 4), up256(tk * 8), up256(n(p.recv_total()) * 4),
          up256(n(p.receive_rows) * 4), up256(tk * 4), up256(tk)};
}
}  // namespace detail

/// @brief Device bytes upload needs for plan p (a pure host query).
[[nodiscard]] inline std::size_t device_plan_bytes(const plan& p) {
  return detail::sizes_of(p).total();
}

/// @brief Copies p's index arrays into d_buffer (device_plan_bytes(p) bytes, 256-aligned) on
///        `stream` and returns the views. The receive rows must fit int32 (checked).
/// @note Part of the plan step, the layer's one sync point: copies from pageable host memory
///       synchronise `stream` first and return once the source is staged, so p may go away
///       afterwards. Host vectors for two derived int32 arrays; no device allocation.
[[nodiscard]] inline status upload(const plan& p, void* d_buffer, std::size_t bytes,
                                   device_plan& out, cudaStream_t stream = nullptr) {
  const auto sz = detail::sizes_of(p);
  if (bytes < sz.total())
    return status::make(status_code::workspace_too_small,
                        "device plan buffer has " + std::to_string(bytes) +
                            " bytes; device_plan_bytes(plan) = " + std::to_string(sz.total()));
  if (p.receive_rows > max_tokens || p.send_total() > max_tokens)
    return status::make(status_code::invalid_shape,
                        "plan: receive_rows = " + std::to_string(p.receive_rows) +
                            " exceeds the int32 row indices of the device path");
  if (d_buffer == nullptr && sz.total() > 0)
    return status::make(status_code::invalid_argument, "d_buffer is null");
  // staging_row: the receive row of each exchanged row (the receive blocks, row by row), and
  // receive_source its inverse (-1 for padding rows)
  std::vector<std::int32_t> staging32, source(static_cast<std::size_t>(p.receive_rows), -1);
  staging32.reserve(static_cast<std::size_t>(p.recv_total()));
  for (const auto& b : p.receive_blocks)
    for (std::int64_t r = b.offset; r < b.offset + b.rows; ++r) {
      source[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(staging32.size());
      staging32.push_back(static_cast<std::int32_t>(r));
    }
  char* b = static_cast<char*>(d_buffer);
  const auto put = [&](const void* src, std::size_t n, std::size_t slot) -> const void* {
    void* dst = b;
    b += slot;
    if (n == 0) return dst;
    const cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream);
    return e == cudaSuccess ? dst : nullptr;
  };
  const std::size_t tk = p.decision.weight.size();
  out.d_send_token = static_cast<const std::int32_t*>(
      put(p.send_token.data(), p.send_token.size() * 4, sz.send_token));
  out.d_assignment_row = static_cast<const std::int64_t*>(
      put(p.assignment_row.data(), p.assignment_row.size() * 8, sz.assignment_row));
  out.d_staging_row =
      static_cast<const std::int32_t*>(put(staging32.data(), staging32.size() * 4, sz.staging_row));
  out.d_receive_source =
      static_cast<const std::int32_t*>(put(source.data(), source.size() * 4, sz.receive_source));
  out.d_weight = static_cast<const float*>(put(p.decision.weight.data(), tk * 4, sz.weight));
  out.d_fate = static_cast<const fate*>(put(p.decision.fates.data(), tk, sz.fate));
  if (!out.d_send_token || !out.d_assignment_row || !out.d_staging_row || !out.d_receive_source ||
      !out.d_weight || !out.d_fate)
    return status::make(status_code::cuda_error, "upload: cudaMemcpyAsync failed");
  return status::success();
}

/// @brief Device workspace of the dispatch / combine / backward launchers: row staging for the
///        rows sent and received (a pure host query).
[[nodiscard]] inline std::size_t workspace_bytes(const plan& p) {
  const std::size_t row = static_cast<std::size_t>(p.hidden) * p.element_bytes;
  return detail::up256(static_cast<std::size_t>(p.send_total()) * row) +
         detail::up256(static_cast<std::size_t>(p.recv_total()) * row);
}

}  // namespace moeroute::ep::cuda
