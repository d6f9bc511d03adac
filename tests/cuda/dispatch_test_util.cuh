// SPDX-License-Identifier: Apache-2.0
// Test helpers for the dispatch / layout / permute / combine GPU tests: deterministic inputs,
// a config grid over every priority, drop policy, slot order and capacity mode, a GPU
// dispatch runner (owning buffers; tests may allocate) and exact comparisons against the CPU
// reference that print the first mismatch.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/kernels/element.cuh>
#include <moeroute/reference.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "../common/dispatch_cases.hpp"
#include "../common/dispatch_compare.hpp"

namespace moeroute::test {

using cuda::device_buffer;

/// Device inputs and outputs of one dispatch call, and its workspace.
struct gpu_dispatch {
  routing_config cfg;
  std::int64_t T;
  std::int32_t k, E, ET;
  device_buffer<std::int32_t> ids, reroute;
  device_buffer<float> gates, priority;
  device_buffer<std::uint8_t> valid, skipped;
  device_buffer<std::int32_t> expert, slot;
  device_buffer<float> weight;
  device_buffer<fate> fates;
  device_buffer<std::int64_t> requested, kept, rerouted, dropped, received, load;
  device_buffer<dispatch_totals> totals;
  device_buffer<unsigned char> ws;
  cuda::dispatch_params params;

  gpu_dispatch(const routing_config& c, const reference::gating_output& g, bool pass_valid)
      : cfg(c),
        T(g.tokens),
        k(c.top_k),
        E(c.num_experts),
        ET(c.total_experts()),
        ids(g.ids),
        reroute(g.reroute_ids),
        gates(g.gates),
        priority(g.token_priority),
        valid(g.valid),
        skipped(g.second_skipped),
        expert(g.ids.size()),
        slot(g.ids.size()),
        weight(g.ids.size()),
        fates(g.ids.size()),
        requested(E),
        kept(E),
        rerouted(E),
        dropped(E),
        received(ET),
        load(ET),
        totals(1),
        ws(cuda::dispatch_workspace_bytes(c, g.tokens)) {
    params.tokens = T;
    params.gated.d_ids = ids.get();
    params.gated.d_gates = gates.get();
    params.gated.d_reroute_ids = reroute.get();
    params.gated.d_token_priority = priority.get();
    params.gated.d_second_skipped = skipped.get();
    params.d_valid = pass_valid ? valid.get() : nullptr;
    params.out = {expert.get(),    slot.get(), weight.get(),   fates.get(),
                  requested.get(), kept.get(), rerouted.get(), dropped.get(),
                  received.get(),  load.get(), totals.get()};
  }

  /// The outputs as the view the next stages read.
  [[nodiscard]] const_dispatch_result result() const { return params.out; }

  [[nodiscard]] status run(cudaStream_t stream = nullptr) {
    return cuda::dispatch(cfg, params, ws.get(), ws.size(), stream);
  }

  [[nodiscard]] host_dispatch download() const {
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    host_dispatch h;
    h.expert = expert.download();
    h.slot = slot.download();
    h.weight = weight.download();
    h.fates = fates.download();
    h.requested = requested.download();
    h.kept = kept.download();
    h.rerouted = rerouted.download();
    h.dropped = dropped.download();
    h.received = received.download();
    h.load = load.download();
    h.totals = totals.download()[0];
    return h;
  }
};

/// One routing case: the config of a spec, the reference gating of T random tokens (seeded) and
/// its reference dispatch, and the GPU dispatch set up on the same gating (not yet run).
struct routed_case {
  routing_config cfg;
  reference::gating_output gating;
  reference::dispatch_output want;
  gpu_dispatch gpu;

  routed_case(std::int64_t T, std::int32_t E, std::int32_t k, const case_spec& s,
              std::uint64_t seed)
      : cfg(make_config(E, k, s, T)),
        gating(make_gating(cfg, T, seed, s.masked)),
        want(reference::dispatch(cfg, gating)),
        gpu(cfg, gating, s.masked) {}
};

/// One case end to end: reference gating -> both dispatches -> compare.
inline void check_dispatch_case(std::int64_t T, std::int32_t E, std::int32_t k, const case_spec& s,
                                std::uint64_t seed) {
  INFO(describe(s, T, E, k));
  routed_case c(T, E, k, s, seed);
  const auto st = c.gpu.run();
  INFO(st.message);
  REQUIRE(st.ok());
  if (T == 0) return;
  require_matches(c.gpu.download(), c.want);
}

/// The host storage type the reference uses for a device element type.
template <class Dev>
using host_t = kernels::host_element_t<Dev>;

/// Random host values of the reference's element type.
template <class H>
std::vector<H> random_host(std::size_t n, std::uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  lcg r(seed);
  std::vector<H> v(n);
  for (auto& x : v) x = from_float<H>(r.uniform(lo, hi));
  return v;
}

/// Device buffer of Dev holding the bits of a host vector of the same size (float/half/bf16).
template <class Dev, class H>
device_buffer<Dev> upload_bits(const std::vector<H>& h, std::size_t extra = 0) {
  static_assert(sizeof(Dev) == sizeof(H));
  device_buffer<Dev> d(h.size() + extra);
  if (!h.empty())
    cuda::throw_if_cuda_error(
        cudaMemcpy(d.get(), h.data(), h.size() * sizeof(H), cudaMemcpyHostToDevice), "upload_bits");
  return d;
}

template <class H, class Dev>
std::vector<H> download_bits(const Dev* d, std::size_t n) {
  static_assert(sizeof(Dev) == sizeof(H));
  std::vector<H> h(n);
  if (n)
    cuda::throw_if_cuda_error(cudaMemcpy(h.data(), d, n * sizeof(H), cudaMemcpyDeviceToHost),
                              "download_bits");
  return h;
}

/// Device outputs of one layout call, fed from a gpu_dispatch.
struct gpu_layout {
  routing_config cfg;
  cuda::layout_params params;
  device_buffer<std::int64_t> offsets, rows_used, assignment_row, num_rows;
  device_buffer<std::int32_t> row_token, block_expert;

  gpu_layout(const routing_config& c, const gpu_dispatch& d, layout_kind kind, std::int64_t block,
             std::int64_t extra_rows = 0)
      : cfg(c),
        offsets(static_cast<std::size_t>(c.total_experts()) + 1),
        rows_used(c.total_experts()),
        assignment_row(static_cast<std::size_t>(d.T * d.k)),
        num_rows(1),
        row_token(
            static_cast<std::size_t>(cuda::layout_max_rows(c, d.T, kind, block) + extra_rows)),
        block_expert(static_cast<std::size_t>(
            (cuda::layout_max_rows(c, d.T, kind, block) + extra_rows) / block)) {
    params.kind = kind;
    params.block_size = block;
    params.tokens = d.T;
    params.max_rows = static_cast<std::int64_t>(row_token.size());
    params.dispatched = d.result();
    params.out = {offsets.get(),
                  rows_used.get(),
                  row_token.get(),
                  assignment_row.get(),
                  kind == layout_kind::compact ? block_expert.get() : nullptr,
                  num_rows.get()};
  }

  [[nodiscard]] status run(cudaStream_t stream = nullptr) const {
    return cuda::layout(cfg, params, stream);
  }
  /// The outputs as the view the next stages read.
  [[nodiscard]] const_layout_result result() const { return params.out; }
};

/// GPU layout == reference layout; rows past num_rows are padding (-1).
inline void require_layout_matches(const gpu_layout& g, const reference::layout_output& L) {
  cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
  REQUIRE(g.num_rows.download()[0] == L.num_rows);
  require_same("offsets", g.offsets.download(), L.offsets);
  require_same("rows_used", g.rows_used.download(), L.rows_used);
  require_same("assignment_row", g.assignment_row.download(), L.assignment_row);
  const auto rt = g.row_token.download();
  REQUIRE(static_cast<std::int64_t>(rt.size()) >= L.num_rows);
  require_same("row_token", std::vector<std::int32_t>(rt.begin(), rt.begin() + L.num_rows),
               L.row_token);
  for (std::size_t i = static_cast<std::size_t>(L.num_rows); i < rt.size(); ++i)
    if (rt[i] != -1) FAIL("row_token[" << i << "] past num_rows = " << rt[i]);
  if (g.params.out.d_block_expert) {
    const auto be = g.block_expert.download();
    REQUIRE(be.size() >= L.block_expert.size());
    require_same("block_expert",
                 std::vector<std::int32_t>(be.begin(), be.begin() + L.block_expert.size()),
                 L.block_expert);
    for (std::size_t i = L.block_expert.size(); i < be.size(); ++i)
      if (be[i] != -1) FAIL("block_expert[" << i << "] past num_rows = " << be[i]);
  }
}

}  // namespace moeroute::test
