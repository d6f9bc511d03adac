// SPDX-License-Identifier: Apache-2.0
// Device expert-parallel dispatch: pack this rank's rows in send order (cuda::permute), one
// all-to-all-v, and a gather into the expert-major receive layout. The device twin of
// ep::dispatch, with the same receive layout and order.
#pragma once

#include <cuda_runtime.h>

#include <moeroute/ep/cuda/exchange.cuh>

namespace moeroute::ep::cuda {

/// @brief Device dispatch buffers. Shapes from the plan: T tokens, d hidden.
template <class Element>
struct dispatch_params {
  const Element* d_x = nullptr;   ///< [T, d] this rank's hidden states
  Element* d_received = nullptr;  ///< [receive_rows, d] out: the receive layout (padding zero)
};

/// @brief Sends hidden states to the experts' ranks. Collective over `t`.
/// @param p, dp the host plan and its device arrays (ep::cuda::upload)
/// @param d_workspace workspace_bytes(p) bytes of device memory
/// @return success, invalid_*, workspace_too_small, cuda_error or communication_error.
/// @note Asynchronous on `stream`: no allocation and no host synchronisation.
template <class Element>
[[nodiscard]] status dispatch(device_transport& t, const plan& p, const device_plan& dp,
                              const dispatch_params<Element>& q, void* d_workspace,
                              std::size_t workspace_bytes, cudaStream_t stream = nullptr) {
  if (auto s = detail::check_call<Element>(p, dp, workspace_bytes, d_workspace); !s) return s;
  if (auto s = detail::need(q.d_x, p.tokens * p.hidden, "d_x"); !s) return s;
  if (auto s = detail::need(q.d_received, p.receive_rows * p.hidden, "d_received"); !s) return s;
  const auto ws = detail::carve(p, d_workspace);
  auto* send = static_cast<Element*>(ws.send);
  if (auto s = detail::gather<Element>(p, q.d_x, p.tokens, dp.d_send_token, p.send_total(), send,
                                       stream);
      !s)
    return s;
  return detail::to_receive_layout<Element>(t, p, dp, send, static_cast<Element*>(ws.recv),
                                            q.d_received, stream);
}

}  // namespace moeroute::ep::cuda
