// SPDX-License-Identifier: Apache-2.0
// What the device dispatch, combine and backward launchers share: the plan checks, the
// workspace carve, and a row gather (out[r] = in[index[r]], zero where index is -1) built on
// cuda::permute, which moves rows between the send order, the exchanged order and the receive
// layout. Every launcher is thin: gathers, one exchange, and the single-device kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include <moeroute/cuda/permute.cuh>
#include <moeroute/ep/cuda/plan.cuh>
#include <moeroute/ep/cuda/transport.cuh>
#include <moeroute/ep/plan.hpp>
#include <moeroute/status.hpp>

namespace moeroute::ep::cuda::detail {

/// The plan fits this call: element size, a device plan, workspace.
template <class Element>
status check_call(const plan& p, const device_plan& dp, std::size_t ws_bytes, const void* ws) {
  if (sizeof(Element) != p.element_bytes)
    return status::make(status_code::invalid_argument,
                        "element type of " + std::to_string(sizeof(Element)) +
                            " bytes; the plan was made for " + std::to_string(p.element_bytes));
  if (ws_bytes < ep::cuda::workspace_bytes(p))
    return status::make(status_code::workspace_too_small,
                        "workspace has " + std::to_string(ws_bytes) +
                            " bytes; ep::cuda::workspace_bytes(plan) = " +
                            std::to_string(ep::cuda::workspace_bytes(p)));
  if (ep::cuda::workspace_bytes(p) > 0 && ws == nullptr)
    return status::make(status_code::invalid_argument, "d_workspace is null");
  if (p.tokens * p.decision.k > 0 && (dp.d_assignment_row == nullptr || dp.d_weight == nullptr))
    return status::make(status_code::invalid_argument,
                        "device_plan is empty: fill it with ep::cuda::upload");
  return status::success();
}

/// A required device pointer of a launcher's params.
inline status need(const void* ptr, std::int64_t elements, const char* name) {
  if (elements > 0 && ptr == nullptr)
    return status::make(
        status_code::invalid_argument,
        std::string(name) + " is null with " + std::to_string(elements) + " elements to hold");
  return status::success();
}

struct staging {
  void* send;  // [send_total, d]
  void* recv;  // [recv_total, d]
};
inline staging carve(const plan& p, void* ws) {
  const std::size_t row = static_cast<std::size_t>(p.hidden) * p.element_bytes;
  char* b = static_cast<char*>(ws);
  return {b, b + ep::cuda::detail::up256(static_cast<std::size_t>(p.send_total()) * row)};
}

/// out[r] = in[index[r]] for r < rows, zero where index[r] = -1 (cuda::permute's gather).
template <class Element>
status gather(const plan& p, const Element* in, std::int64_t in_rows, const std::int32_t* index,
              std::int64_t rows, Element* out, cudaStream_t stream) {
  if (rows == 0 || p.hidden == 0) return status::success();
  if (in_rows == 0) {  // nothing to gather: every row is padding
    const cudaError_t e = cudaMemsetAsync(
        out, 0, static_cast<std::size_t>(rows * p.hidden) * sizeof(Element), stream);
    return e == cudaSuccess ? status::success()
                            : status::make(status_code::cuda_error, "cudaMemsetAsync failed");
  }
  moeroute::cuda::permute_params<Element> q;
  q.d_x = in;
  q.tokens = in_rows;
  q.hidden = p.hidden;
  q.layout.d_row_token = index;
  q.rows = rows;
  q.d_out = out;
  return moeroute::cuda::permute(p.cfg, q, stream);
}

/// Send order -> exchanged order -> receive layout.
template <class Element>
status to_receive_layout(device_transport& t, const plan& p, const device_plan& dp,
                         const Element* send, Element* recv_staging, Element* out,
                         cudaStream_t stream) {
  const std::size_t row = static_cast<std::size_t>(p.hidden) * sizeof(Element);
  if (auto s = t.alltoallv(send, p.send_rows, p.send_offsets, recv_staging, p.recv_rows,
                           p.recv_offsets, row, stream);
      !s)
    return s;
  return gather<Element>(p, recv_staging, p.recv_total(), dp.d_receive_source, p.receive_rows, out,
                         stream);
}

/// Receive layout -> exchanged order -> back to the sources, in send order.
template <class Element>
status to_send_order(device_transport& t, const plan& p, const device_plan& dp, const Element* in,
                     Element* recv_staging, Element* back, cudaStream_t stream) {
  if (auto s = gather<Element>(p, in, p.receive_rows, dp.d_staging_row, p.recv_total(),
                               recv_staging, stream);
      !s)
    return s;
  const std::size_t row = static_cast<std::size_t>(p.hidden) * sizeof(Element);
  return t.alltoallv(recv_staging, p.recv_rows, p.recv_offsets, back, p.send_rows, p.send_offsets,
                     row, stream);
}

/// The send-side layout view the single-device kernels read: send_token and assignment_row.
inline const_layout_result send_layout(const device_plan& dp) {
  const_layout_result L{};
  L.d_row_token = dp.d_send_token;
  L.d_assignment_row = dp.d_assignment_row;
  return L;
}
inline const_dispatch_result decision(const device_plan& dp) {
  const_dispatch_result d{};
  d.d_weight = dp.d_weight;
  d.d_fate = dp.d_fate;
  return d;
}

}  // namespace moeroute::ep::cuda::detail
