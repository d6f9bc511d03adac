// SPDX-License-Identifier: Apache-2.0
// Device combine backward: cuda::combine_backward over the send order (row gradients, weight
// gradients, the residual pass-through), then the row gradients to the experts' ranks, into
// the receive layout.
#pragma once

#include <cuda_runtime.h>

#include <moeroute/cuda/combine_backward.cuh>
#include <moeroute/ep/cuda/exchange.cuh>

namespace moeroute::ep::cuda {

template <class Element>
struct combine_backward_params {
  const Element* d_returned = nullptr;   ///< [send_total, d] from combine
  const Element* d_dy = nullptr;         ///< [T, d] dL/dy
  Element* d_grad_expert_out = nullptr;  ///< [receive_rows, d] out (padding rows zero)
  float* d_grad_weight = nullptr;        ///< [T, k] f32 out
  Element* d_grad_x = nullptr;           ///< [T, d] out or null: residual pass-through
};

/// @brief Combine backward. Collective over `t`.
template <class Element>
[[nodiscard]] status combine_backward(device_transport& t, const plan& p, const device_plan& dp,
                                      const combine_backward_params<Element>& q, void* d_workspace,
                                      std::size_t workspace_bytes, cudaStream_t stream = nullptr) {
  if (auto s = detail::check_call<Element>(p, dp, workspace_bytes, d_workspace); !s) return s;
  if (auto s = detail::need(q.d_returned, p.send_total() * p.hidden, "d_returned"); !s) return s;
  if (auto s = detail::need(q.d_dy, p.tokens * p.hidden, "d_dy"); !s) return s;
  if (auto s = detail::need(q.d_grad_expert_out, p.receive_rows * p.hidden, "d_grad_expert_out");
      !s)
    return s;
  if (auto s = detail::need(q.d_grad_weight, p.tokens * p.decision.k, "d_grad_weight"); !s)
    return s;
  const auto ws = detail::carve(p, d_workspace);
  auto* d_send = static_cast<Element*>(ws.send);
  moeroute::cuda::combine_backward_params<Element> b;
  b.d_expert_out = q.d_returned;
  b.d_dy = q.d_dy;
  b.rows = p.send_total();
  b.tokens = p.tokens;
  b.hidden = p.hidden;
  b.layout = detail::send_layout(dp);
  b.dispatched = detail::decision(dp);
  b.d_grad_expert_out = d_send;
  b.d_grad_weight = q.d_grad_weight;
  b.d_grad_x = q.d_grad_x;
  if (auto s = moeroute::cuda::combine_backward(p.cfg, b, stream); !s) return s;
  return detail::to_receive_layout<Element>(t, p, dp, d_send, static_cast<Element*>(ws.recv),
                                            q.d_grad_expert_out, stream);
}

}  // namespace moeroute::ep::cuda
