// SPDX-License-Identifier: Apache-2.0
// The GPU benchmark's batch: the buffers of an owning router (moeroute::router_buffers over one
// device block, as cuda::router lays them out) and each CUDA launcher alone on them, so every
// stage can be timed by itself (cuda::router runs gating, dispatch, layout and losses as one
// call). bf16 logits and hidden states.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/combine.cuh>
#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/gating.cuh>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/cuda/losses.cuh>
#include <moeroute/cuda/permute.cuh>
#include <moeroute/dtype.hpp>
#include <moeroute/router_buffers.hpp>

namespace moeroute::bench {

/// Host floats as __nv_bfloat16 bits (round to nearest even).
inline std::vector<__nv_bfloat16> device_bf16(const std::vector<float>& h) {
  std::vector<__nv_bfloat16> out(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) {
    const bf16_bits b = to_bf16(h[i]);
    std::memcpy(static_cast<void*>(&out[i]), &b.bits, 2);
  }
  return out;
}

/// One batch's device buffers and the launchers, one call each.
struct cuda_stages {
  using bf16 = __nv_bfloat16;
  router_buffers b;
  cuda::device_buffer<std::byte> block;  ///< every routing output, the rows and the workspace
  cuda::device_buffer<bf16> logits, x;   ///< [T, E], [T, d]
  cuda::device_buffer<bf16> ye;          ///< [max_rows, d] the experts' outputs
  cuda::device_buffer<float> bias;       ///< [E] (a zero expert bias where the config has one)
  std::int64_t tokens;
  routing_config inference;  ///< the config with training = false (gate_inference)

  cuda_stages(const routing_config& cfg, std::int64_t T, std::int64_t d, const router_options& opt)
      : b(cfg, T, d, sizeof(bf16), opt,
          [](const routing_config& c, std::int64_t t) {
            return std::max(cuda::gating_workspace_bytes(c, t),
                            cuda::dispatch_workspace_bytes(c, t));
          }),
        block(b.bytes()),
        logits(static_cast<std::size_t>(T * cfg.num_experts)),
        x(static_cast<std::size_t>(T * d)),
        ye(static_cast<std::size_t>(b.max_rows() * d)),
        tokens(T),
        inference(cfg) {
    inference.training = false;
    b.attach(block.get());
    if (cfg.gating.expert_bias)
      bias = cuda::device_buffer<float>(std::vector<float>(cfg.num_experts, 0.0f));
  }

  status gate(cudaStream_t s) {
    gating_params<bf16> p;
    p.d_logits = logits.get();
    p.tokens = tokens;
    p.d_bias = bias.get();
    p.out = b.gating_out();
    const auto ws = b.get<std::byte>("workspace");
    return cuda::gating(b.config(), p, ws.data(), ws.size(), s);
  }
  /// The inference path of the same gating: training = false, ids and gates (and what the
  /// config cannot do without: reroute ids, priorities, the random policy's draw), no sum, no
  /// logsumexp: one kernel, selection and gates only.
  status gate_inference(cudaStream_t s) {
    gating_params<bf16> p;
    p.d_logits = logits.get();
    p.tokens = tokens;
    p.d_bias = bias.get();
    const gating_result full = b.gating_out();
    p.out.d_ids = full.d_ids;
    p.out.d_gates = full.d_gates;
    p.out.d_reroute_ids = full.d_reroute_ids;
    p.out.d_token_priority = full.d_token_priority;
    p.out.d_second_skipped = full.d_second_skipped;
    const auto ws = b.get<std::byte>("workspace");
    return cuda::gating(inference, p, ws.data(), ws.size(), s);
  }
  status losses(cudaStream_t s) { return cuda::losses(b.config(), b.loss_params_for(tokens), s); }
  status dispatch(cudaStream_t s) {
    dispatch_params p;
    p.tokens = tokens;
    p.gated = b.gating_out();
    p.out = b.dispatch_out();
    const auto ws = b.get<std::byte>("workspace");
    return cuda::dispatch(b.config(), p, ws.data(), ws.size(), s);
  }
  status layout(cudaStream_t s) {
    return cuda::layout(b.config(), b.layout_params_for(tokens, b.dispatch_out()), s);
  }
  status route(cudaStream_t s) {
    for (auto stage :
         {&cuda_stages::gate, &cuda_stages::losses, &cuda_stages::dispatch, &cuda_stages::layout})
      if (auto st = (this->*stage)(s); !st) return st;
    return status::success();
  }
  status permute(cudaStream_t s) {
    const permute_params<bf16> p{x.get(),        tokens,       b.hidden(),
                                 b.layout_out(), b.max_rows(), b.ptr<bf16>("expert_in")};
    return cuda::permute(b.config(), p, s);
  }
  status combine(cudaStream_t s) {
    const combine_params<bf16> p{ye.get(),       b.max_rows(),     tokens,  b.hidden(),
                                 b.layout_out(), b.dispatch_out(), x.get(), b.ptr<bf16>("y")};
    return cuda::combine(b.config(), p, s);
  }

  /// The totals of the last dispatch and the layout's rows in use (synchronous copies).
  [[nodiscard]] dispatch_totals totals() const {
    dispatch_totals t{};
    cuda::throw_if_cuda_error(
        cudaMemcpy(&t, b.ptr<dispatch_totals>("totals"), sizeof t, cudaMemcpyDeviceToHost),
        "cudaMemcpy");
    return t;
  }
  [[nodiscard]] std::int64_t rows_used() const {
    std::int64_t n = 0;
    cuda::throw_if_cuda_error(
        cudaMemcpy(&n, b.ptr<std::int64_t>("num_rows"), sizeof n, cudaMemcpyDeviceToHost),
        "cudaMemcpy");
    return n;
  }
};

/// Deterministic pseudo-random floats in [-scale, scale).
inline std::vector<float> bench_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  std::uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = scale * (static_cast<float>(s >> 40) / 8388608.0f - 1.0f);
  }
  return v;
}

}  // namespace moeroute::bench
