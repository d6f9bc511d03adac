// SPDX-License-Identifier: Apache-2.0
// Device expert-parallel combine: the receive layout back to the sources (a gather and one
// all-to-all-v), then cuda::combine over the send order — the single-device kernel, so the
// sum runs in choice order in fp32 with the config's drop policy, bitwise one device's.
#pragma once

#include <cuda_runtime.h>

#include <moeroute/cuda/combine.cuh>
#include <moeroute/ep/cuda/exchange.cuh>

namespace moeroute::ep::cuda {

/// @brief Device combine buffers. Shapes from the plan.
template <class Element>
struct combine_params {
  const Element* d_expert_out = nullptr;  ///< [receive_rows, d] the experts' outputs
  const Element* d_x = nullptr;           ///< [T, d] (drop_policy::residual only)
  Element* d_returned = nullptr;  ///< [send_total, d] out: outputs of this rank's rows, send
                                  ///< order; keep for combine_backward
  Element* d_y = nullptr;         ///< [T, d] out
};

/// @brief y[t] = sum_j w[t, j] * output of row(t, j). Collective over `t`.
/// @note Asynchronous on `stream`: no allocation and no host synchronisation.
template <class Element>
[[nodiscard]] status combine(device_transport& t, const plan& p, const device_plan& dp,
                             const combine_params<Element>& q, void* d_workspace,
                             std::size_t workspace_bytes, cudaStream_t stream = nullptr) {
  if (auto s = detail::check_call<Element>(p, dp, workspace_bytes, d_workspace); !s) return s;
  if (auto s = detail::need(q.d_expert_out, p.receive_rows * p.hidden, "d_expert_out"); !s)
    return s;
  if (auto s = detail::need(q.d_returned, p.send_total() * p.hidden, "d_returned"); !s) return s;
  if (auto s = detail::need(q.d_y, p.tokens * p.hidden, "d_y"); !s) return s;
  const auto ws = detail::carve(p, d_workspace);
  if (auto s = detail::to_send_order<Element>(t, p, dp, q.d_expert_out,
                                              static_cast<Element*>(ws.recv), q.d_returned, stream);
      !s)
    return s;
  moeroute::cuda::combine_params<Element> c;
  c.d_expert_out = q.d_returned;
  c.rows = p.send_total();
  c.tokens = p.tokens;
  c.hidden = p.hidden;
  c.layout = detail::send_layout(dp);
  c.dispatched = detail::decision(dp);
  c.d_x = q.d_x;
  c.d_y = q.d_y;
  return moeroute::cuda::combine(p.cfg, c, stream);
}

}  // namespace moeroute::ep::cuda
