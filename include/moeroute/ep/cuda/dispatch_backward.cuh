// SPDX-License-Identifier: Apache-2.0
// Device dispatch backward: the receive layout's gradient back to the sources, then
// cuda::permute_backward over the send order (each distinct row of a token once).
#pragma once

#include <cuda_runtime.h>

#include <moeroute/cuda/permute_backward.cuh>
#include <moeroute/ep/cuda/exchange.cuh>

namespace moeroute::ep::cuda {

template <class Element>
struct dispatch_backward_params {
  const Element* d_grad_received = nullptr;  ///< [receive_rows, d] dL/d received
  Element* d_grad_x = nullptr;               ///< [T, d] out (or added to when accumulate)
  bool accumulate = false;                   ///< add onto d_grad_x (the residual part)
};

/// @brief d x[t] = sum of the gradients of the rows token t sent. Collective over `t`.
template <class Element>
[[nodiscard]] status dispatch_backward(device_transport& t, const plan& p, const device_plan& dp,
                                       const dispatch_backward_params<Element>& q,
                                       void* d_workspace, std::size_t workspace_bytes,
                                       cudaStream_t stream = nullptr) {
  if (auto s = detail::check_call<Element>(p, dp, workspace_bytes, d_workspace); !s) return s;
  if (auto s = detail::need(q.d_grad_received, p.receive_rows * p.hidden, "d_grad_received"); !s)
    return s;
  if (auto s = detail::need(q.d_grad_x, p.tokens * p.hidden, "d_grad_x"); !s) return s;
  const auto ws = detail::carve(p, d_workspace);
  auto* back = static_cast<Element*>(ws.send);
  if (auto s = detail::to_send_order<Element>(t, p, dp, q.d_grad_received,
                                              static_cast<Element*>(ws.recv), back, stream);
      !s)
    return s;
  moeroute::cuda::permute_backward_params<Element> b;
  b.d_grad_buf = back;
  b.rows = p.send_total();
  b.tokens = p.tokens;
  b.hidden = p.hidden;
  b.layout = detail::send_layout(dp);
  b.accumulate = q.accumulate;
  b.d_grad_x = q.d_grad_x;
  return moeroute::cuda::permute_backward(p.cfg, b, stream);
}

}  // namespace moeroute::ep::cuda
