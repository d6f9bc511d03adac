// SPDX-License-Identifier: Apache-2.0
// Test harness for the GPU gating: runs cuda::gating on host data (tests may allocate) and
// compares every output with reference::gating on the same inputs, naming the first mismatch.
// Inputs are host storage types (float, half_bits, bf16_bits); the device reads the same bits
// as float, __half, __nv_bfloat16 (kernels::device_element_t).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/gating.cuh>
#include <moeroute/cuda/gating_workspace.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/names.hpp>
#include <moeroute/reference/gating.hpp>

#include "../common/gating_cases.hpp"
#include "../common/gating_compare.hpp"

namespace moeroute::test {

using gpu_gating = gating_outputs;  // what cuda::gating wrote, downloaded

using cuda::device_buffer;
using cuda::throw_if_cuda_error;

/// Device buffers of one gating call, kept alive so a test can rerun or capture the launch.
template <class In>
struct gating_buffers {
  using element = kernels::device_element_t<In>;
  device_buffer<unsigned char> logits;  // raw bytes (+16 so a test can misalign the start)
  device_buffer<float> bias;
  device_buffer<std::uint8_t> valid, skipped;
  device_buffer<std::int32_t> ids, reroute, count_ids;
  device_buffer<float> gates, lse, priority, aux_scores;
  device_buffer<double> aux_sum, z, seq_sum;
  device_buffer<std::int64_t> aux_count, valid_tokens, nonfinite, seq_count, seq_tokens;
  device_buffer<unsigned char> workspace;
  cuda::gating_params<element> p;
  std::size_t workspace_bytes = 0;

  gating_buffers(const routing_config& cfg, const std::vector<In>& h_logits, std::int64_t T,
                 const std::vector<float>& h_bias, const std::vector<std::uint8_t>& h_valid,
                 std::size_t misalign_elements = 0)
      : logits(h_logits.size() * sizeof(In) + 16),
        bias(h_bias),
        valid(h_valid),
        skipped(static_cast<std::size_t>(
            cfg.gating.second_expert.policy == second_expert_policy::random ? T : 0)),
        ids(static_cast<std::size_t>(T * cfg.top_k)),
        reroute(static_cast<std::size_t>(T * (cfg.reroute_candidates()))),
        count_ids(static_cast<std::size_t>(T * cfg.aux_counts_per_token())),
        gates(static_cast<std::size_t>(T * cfg.top_k)),
        lse(static_cast<std::size_t>(T)),
        priority(
            static_cast<std::size_t>(cfg.dispatch.prio == priority::batch_prioritized ? T : 0)),
        aux_scores(static_cast<std::size_t>(T * cfg.num_experts)),
        aux_sum(static_cast<std::size_t>(cfg.num_experts)),
        z(1),
        seq_sum(static_cast<std::size_t>(seqs(cfg, T) * cfg.num_experts)),
        aux_count(static_cast<std::size_t>(cfg.num_experts)),
        valid_tokens(1),
        nonfinite(1),
        seq_count(static_cast<std::size_t>(seqs(cfg, T) * cfg.num_experts)),
        seq_tokens(static_cast<std::size_t>(seqs(cfg, T))),
        workspace(cuda::gating_workspace_bytes(cfg, T)),
        workspace_bytes(cuda::gating_workspace_bytes(cfg, T)) {
    const std::size_t off = misalign_elements * sizeof(In);
    if (!h_logits.empty())
      throw_if_cuda_error(cudaMemcpy(logits.get() + off, h_logits.data(),
                                     h_logits.size() * sizeof(In), cudaMemcpyHostToDevice),
                          "upload logits");
    p.d_logits = reinterpret_cast<const element*>(logits.get() + off);
    p.tokens = T;
    p.d_bias = h_bias.empty() ? nullptr : bias.get();
    p.d_valid = h_valid.empty() ? nullptr : valid.get();
    p.out.d_ids = ids.get();
    p.out.d_gates = gates.get();
    p.out.d_reroute_ids = reroute.get();
    p.out.d_logsumexp = lse.get();
    p.out.d_token_priority = priority.get();
    p.out.d_second_skipped = skipped.get();
    p.out.d_aux_scores = aux_scores.get();
    p.out.d_aux_count_ids = count_ids.get();
    p.out.sums = {aux_sum.get(),   aux_count.get(), valid_tokens.get(), z.get(),
                  nonfinite.get(), seq_sum.get(),   seq_count.get(),    seq_tokens.get()};
  }

  static std::int64_t seqs(const routing_config& cfg, std::int64_t T) {
    return cfg.loss.sequence_length > 0 ? T / cfg.loss.sequence_length : 0;
  }

  status run(const routing_config& cfg, cudaStream_t stream = nullptr) {
    return cuda::gating(cfg, p, workspace.get(), workspace_bytes, stream);
  }

  gpu_gating download(status st) const {
    gpu_gating g;
    g.st = std::move(st);
    throw_if_cuda_error(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    g.ids = ids.download();
    g.reroute_ids = reroute.download();
    g.gates = gates.download();
    g.logsumexp = lse.download();
    g.token_priority = priority.download();
    g.second_skipped = skipped.download();
    g.aux_scores = aux_scores.download();
    g.aux_count_ids = count_ids.download();
    g.aux_score_sum = aux_sum.download();
    g.aux_count = aux_count.download();
    g.seq_score_sum = seq_sum.download();
    g.seq_count = seq_count.download();
    g.seq_tokens = seq_tokens.download();
    g.valid_tokens = valid_tokens.download()[0];
    g.nonfinite = nonfinite.download()[0];
    g.z_sum_squares = z.download()[0];
    return g;
  }
};

template <class In>
gpu_gating run_gpu(const routing_config& cfg, const std::vector<In>& logits, std::int64_t T,
                   const std::vector<float>& bias = {}, const std::vector<std::uint8_t>& valid = {},
                   std::size_t misalign_elements = 0) {
  gating_buffers<In> b(cfg, logits, T, bias, valid, misalign_elements);
  auto st = b.run(cfg);
  return b.download(std::move(st));
}

/// Runs reference and GPU on the same inputs and compares; "" when they agree.
template <class In>
std::string check_gating(const routing_config& cfg, const std::vector<In>& logits, std::int64_t T,
                         const std::vector<float>& bias = {},
                         const std::vector<std::uint8_t>& valid = {},
                         std::size_t misalign_elements = 0) {
  const auto ref = reference_gating(cfg, logits, T, bias, valid);
  return compare(ref, run_gpu<In>(cfg, logits, T, bias, valid, misalign_elements));
}

}  // namespace moeroute::test
