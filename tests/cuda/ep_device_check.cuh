// SPDX-License-Identifier: Apache-2.0
// One rank of the device expert-parallel check: a device_transport for the device launchers and
// a host ep::transport for make_plan and the host path (one object on the one-GPU loopback,
// ep_loopback_test.cu; NCCL beside a host loopback group, tests/ep/nccl_smoke.cu). The host path on
// the same plan gives the expected values: received and returned rows, the output and the gradients
// bit for bit, the weight gradient to 1e-5 (as the single-device combine_backward).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/ep.hpp>
#include <moeroute/ep/cuda.cuh>

#include "../common/ep_cases.hpp"

namespace moeroute::test::ep_device {

namespace ep = moeroute::ep;
namespace eo = moeroute::test::ep_oracle;
using moeroute::cuda::device_buffer;

// A launcher error throws (never returns early): the group then breaks the peers' collectives
// instead of leaving them waiting, and the test reports the error.

/// Host element type with the device type's bits.
template <class D>
using host_of = std::conditional_t<std::is_same_v<D, float>, float, moeroute::bf16_bits>;

/// `t` carries the device launchers' rows; `host` (the same ranks, in the same order) the host
/// path's and the plan's counts. They are one transport on the loopback; NCCL moves device rows
/// only, so its check takes a host loopback group beside it.
template <class D, class Transport>
std::vector<std::string> device_vs_host(Transport& t, ep::transport& host, cudaStream_t stream,
                                        const eo::scenario& s) {
  using H = host_of<D>;
  eo::report rep;
  rep.where = s.name + " R=" + std::to_string(t.ranks()) + " rank " + std::to_string(t.rank());
  const std::int32_t me = t.rank(), k = s.cfg.top_k;
  const std::int64_t d = s.hidden;
  const eo::rank_routing rr = eo::route_rank(s, t.ranks(), me);
  const eo::batch& b = rr.b;
  const std::int64_t t0 = rr.t0, n = rr.n;
  const ep::plan p = ep::make_plan(host, s.cfg, rr.place, s.opt, rr.layout, d, sizeof(H));

  // The host path: the expected values.
  const auto x =
      eo::convert<H>(std::vector<float>(b.x.begin() + t0 * d, b.x.begin() + (t0 + n) * d));
  const auto dy =
      eo::convert<H>(std::vector<float>(b.dy.begin() + t0 * d, b.dy.begin() + (t0 + n) * d));
  std::vector<std::byte> hws(ep::workspace_bytes(p));
  std::vector<H> recv(p.receive_rows * d), out, ret(p.send_total() * d), y(n * d);
  ep::dispatch<H>(host, p, x, recv, hws);
  eo::run_experts(p.segment_offsets, p.segment_expert, recv, d, out);
  ep::combine<H>(host, p, out, x, ret, y, hws);
  std::vector<H> g_out(p.receive_rows * d), g_recv, g_x(n * d);
  std::vector<float> g_w(n * k);
  ep::combine_backward<H>(host, p, ret, dy, g_out, g_w, g_x, hws);
  eo::run_experts(p.segment_offsets, p.segment_expert, g_out, d, g_recv);
  ep::dispatch_backward<H>(host, p, g_recv, g_x, hws, true);

  // The device path on the same plan.
  device_buffer<std::byte> dplan(std::max<std::size_t>(ep::cuda::device_plan_bytes(p), 1));
  ep::cuda::device_plan dp;
  moeroute::throw_if_error(
      ep::cuda::upload(p, dplan.get(), ep::cuda::device_plan_bytes(p), dp, stream));
  const std::size_t wsb = ep::cuda::workspace_bytes(p);
  device_buffer<std::byte> dws(std::max<std::size_t>(wsb, 1));
  device_buffer<H> dx(x), ddy(dy), drecv(p.receive_rows * d), dout(out), dret(p.send_total() * d),
      dy_out(n * d), dg_out(p.receive_rows * d), dg_recv(g_recv.size()), dg_x(n * d);
  device_buffer<float> dg_w(n * k);
  const auto D_ = [](device_buffer<H>& buf) { return reinterpret_cast<D*>(buf.get()); };
  const auto C_ = [](device_buffer<H>& buf) { return reinterpret_cast<const D*>(buf.get()); };

  ep::cuda::dispatch_params<D> qd{C_(dx), D_(drecv)};
  moeroute::throw_if_error(ep::cuda::dispatch<D>(t, p, dp, qd, dws.get(), wsb, stream));
  ep::cuda::combine_params<D> qc{C_(dout), C_(dx), D_(dret), D_(dy_out)};
  moeroute::throw_if_error(ep::cuda::combine<D>(t, p, dp, qc, dws.get(), wsb, stream));
  ep::cuda::combine_backward_params<D> qb{C_(dret), C_(ddy), D_(dg_out), dg_w.get(), D_(dg_x)};
  moeroute::throw_if_error(ep::cuda::combine_backward<D>(t, p, dp, qb, dws.get(), wsb, stream));
  // the expert backward on the host's gradient (the experts are not under test)
  cudaMemcpyAsync(dg_recv.get(), g_recv.data(), g_recv.size() * sizeof(H), cudaMemcpyHostToDevice,
                  stream);
  ep::cuda::dispatch_backward_params<D> qdb{C_(dg_recv), D_(dg_x), true};
  moeroute::throw_if_error(ep::cuda::dispatch_backward<D>(t, p, dp, qdb, dws.get(), wsb, stream));
  moeroute::cuda::throw_if_cuda_error(cudaStreamSynchronize(stream), "sync");

  rep.equal("received", drecv.download(), recv);
  rep.equal("returned", dret.download(), ret);
  rep.equal("y", dy_out.download(), y);
  rep.equal("grad expert_out", dg_out.download(), g_out);
  rep.equal("grad x", dg_x.download(), g_x);
  const auto w = dg_w.download();
  for (std::size_t i = 0; i < w.size(); ++i)
    if (std::abs(w[i] - g_w[i]) > 1e-5f * std::abs(g_w[i]) + 1e-6f) {
      rep.fail("grad weight " + std::to_string(i));
      break;
    }
  return rep.failures;
}

}  // namespace moeroute::test::ep_device
