// SPDX-License-Identifier: Apache-2.0
// GPU loss values (cuda::losses) against reference::losses (aux, sequence aux, z-loss):
// from the reference's own sums the batch-level values must be bit-identical (same formula,
// same order, no fma); through the GPU gating sums within 1e-5 relative.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <moeroute/cuda/gating.cuh>
#include <moeroute/cuda/losses.cuh>
#include <moeroute/presets.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/reference/losses.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "gating_harness.cuh"

using namespace moeroute;

namespace {

struct gpu_losses {
  status st;
  double aux = 0.0, seq = 0.0, z = 0.0;
};

/// Runs cuda::losses on sums uploaded from the host.
gpu_losses losses_from_sums(const routing_config& cfg, std::int64_t T,
                            const std::vector<double>& score_sum,
                            const std::vector<std::int64_t>& counts, std::int64_t valid,
                            double z_sum, const std::vector<double>& seq_sum,
                            const std::vector<std::int64_t>& seq_count,
                            const std::vector<std::int64_t>& seq_tokens) {
  cuda::device_buffer<double> d_sum(score_sum), d_z(std::vector<double>{z_sum}), d_seq_sum(seq_sum);
  cuda::device_buffer<std::int64_t> d_counts(counts), d_valid(std::vector<std::int64_t>{valid}),
      d_seq_count(seq_count), d_seq_tokens(seq_tokens);
  cuda::device_buffer<double> out(3);
  out.fill_bytes(0xFF);
  cuda::loss_params p;
  p.tokens = T;
  p.sums.d_aux_score_sum = d_sum.get();
  p.sums.d_aux_count = d_counts.get();
  p.sums.d_valid_tokens = d_valid.get();
  p.sums.d_z_sum_squares = d_z.get();
  p.sums.d_seq_score_sum = d_seq_sum.get();
  p.sums.d_seq_count = d_seq_count.get();
  p.sums.d_seq_tokens = d_seq_tokens.get();
  p.d_aux_loss = out.get();
  p.d_sequence_aux_loss = out.get() + 1;
  p.d_z_loss = out.get() + 2;
  gpu_losses r;
  r.st = cuda::losses(cfg, p);
  cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
  const auto h = out.download();
  r.aux = h[0];
  r.seq = h[1];
  r.z = h[2];
  return r;
}

std::vector<routing_config> loss_configs(std::int32_t E, std::int32_t k) {
  std::vector<routing_config> out;
  for (aux_scale sc : {aux_scale::e_times_sum, aux_scale::e_over_k_sum, aux_scale::normalized})
    for (aux_counts cn : {aux_counts::top1, aux_counts::all_k})
      for (aux_count_source src : {aux_count_source::routed, aux_count_source::fresh_topk})
        for (score_function sf : {score_function::softmax, score_function::sigmoid}) {
          routing_config c;
          c.num_experts = E;
          c.top_k = k;
          c.gating.score = sf;
          c.gating.select = select_from::scores;
          c.loss.scale = sc;
          c.loss.counts = cn;
          c.loss.count_source = src;
          c.loss.aux_coefficient = 0.01f;
          c.loss.z_coefficient = 0.001f;
          out.push_back(c);
        }
  return out;
}

}  // namespace

// The GPU loss launcher on the reference's own sums must give the reference's values bit for
// bit: T tokens in sequences of L, sequence 0 all padding, every third token after 2L padding.
static void check_losses_from_reference_sums(std::int32_t E, std::int64_t T, std::int64_t L) {
  const auto configs = loss_configs(E, 2);
  for (std::size_t i = 0; i < 2 * configs.size(); ++i) {
    routing_config cfg = configs[i / 2];
    cfg.loss.sequence_length = L;
    cfg.loss.sequence_reduce = i % 2 ? sequence_reduction::sum : sequence_reduction::mean;
    std::vector<std::uint8_t> valid(T, 1);
    for (std::int64_t t = 0; t < L; ++t) valid[t] = 0;  // sequence 0 is all padding
    for (std::int64_t t = 2 * L; t < T; t += 3) valid[t] = 0;
    const auto logits = test::grid_logits(T, E, 41);
    const auto g = reference::gating<float>(cfg, std::span<const float>(logits), T, {},
                                            std::span<const std::uint8_t>(valid));
    const auto aux = reference::aux_loss(cfg, g);
    const auto z = reference::z_loss(cfg, g);
    const double seq = reference::sequence_aux_loss(cfg, g);
    const auto r = losses_from_sums(cfg, T, g.aux_score_sum, g.aux_count, g.valid_tokens,
                                    z.sum_squares, g.seq_score_sum, g.seq_count, g.seq_tokens);
    INFO(test::describe(cfg, T));
    REQUIRE(r.st.ok());
    REQUIRE(std::memcmp(&r.aux, &aux.value, sizeof(double)) == 0);
    REQUIRE(std::memcmp(&r.z, &z.value, sizeof(double)) == 0);
    REQUIRE(r.seq == Approx(seq).epsilon(1e-12));
    REQUIRE(seq > 0.0);
  }
}

// The sanitizer set (tests/gpu_check.sh runs "[quick]" under compute-sanitizer): the same
// bit-for-bit check as the next case on tiny shapes.
TEST_CASE("losses from the reference's sums, tiny shapes", "[cuda][losses][quick]") {
  for (std::int32_t E : {6, 64}) check_losses_from_reference_sums(E, 100, 10);
}

TEST_CASE("losses from the reference's sums equal the reference bit for bit", "[cuda][losses]") {
  for (std::int32_t E : {8, 60, 256}) check_losses_from_reference_sums(E, 1000, 50);
}

// One test case per E; the CPU emulation leaves out the [slow] one.
static void check_losses_through_gating(std::int32_t E) {
  const auto configs = loss_configs(E, std::min(4, E));
  for (std::size_t i = 0; i < configs.size(); ++i) {
    routing_config cfg = configs[i];
    // every other config packs [seq, batch] and sums the sequences (TransformerEngine)
    cfg.loss.sequence_order = i % 2 ? token_order::position_major : token_order::sequence_major;
    cfg.loss.sequence_reduce = i % 2 ? sequence_reduction::sum : sequence_reduction::mean;
    for (std::int64_t L : {0, 100}) {
      cfg.loss.sequence_length = L;
      const std::int64_t T = 1000;
      std::vector<std::uint8_t> valid(T, 1);
      for (std::int64_t t = 0; t < T; t += 7) valid[t] = 0;
      const auto logits = test::grid_logits(T, E, 43);
      const auto ref = reference::gating<float>(cfg, std::span<const float>(logits), T, {},
                                                std::span<const std::uint8_t>(valid));
      test::gating_buffers<float> b(cfg, logits, T, {}, valid);
      REQUIRE(b.run(cfg).ok());
      cuda::device_buffer<double> out(3);
      cuda::loss_params p;
      p.tokens = T;
      p.sums = b.p.out.sums;  // the gating's outputs are the losses' inputs
      p.d_aux_loss = out.get();
      p.d_sequence_aux_loss = out.get() + 1;
      p.d_z_loss = out.get() + 2;
      REQUIRE(cuda::losses(cfg, p).ok());
      const auto h = out.download();
      INFO(test::describe(cfg, T));
      REQUIRE(test::compare(ref, b.download(status::success())) == "");
      REQUIRE(h[0] == Approx(reference::aux_loss(cfg, ref).value).epsilon(1e-5));
      REQUIRE(h[1] == Approx(reference::sequence_aux_loss(cfg, ref)).epsilon(1e-5));
      REQUIRE(h[2] == Approx(reference::z_loss(cfg, ref).value).epsilon(1e-5));
      REQUIRE(h[0] > 0.0);
      REQUIRE(h[2] > 0.0);
    }
  }
}

TEST_CASE("losses through the GPU gating match the reference, E = 6", "[cuda][losses]") {
  check_losses_through_gating(6);
}

TEST_CASE("losses through the GPU gating match the reference, E = 64", "[cuda][losses]") {
  check_losses_through_gating(64);
}

TEST_CASE("losses through the GPU gating match the reference, E = 384", "[cuda][losses][slow]") {
  check_losses_through_gating(384);
}

TEST_CASE("losses: zero valid tokens give 0, bad params are rejected, T = 0 writes nothing",
          "[cuda][losses][quick]") {
  const auto cfg = presets::mixtral();
  const std::vector<double> sums(8, 1.0);
  const std::vector<std::int64_t> counts(8, 3);
  auto r = losses_from_sums(cfg, 16, sums, counts, 0, 5.0, {}, {}, {});
  REQUIRE(r.st.ok());
  REQUIRE(r.aux == 0.0);
  REQUIRE(r.z == 0.0);
  REQUIRE(r.seq == 0.0);  // sequence_length 0

  cuda::loss_params p;
  p.tokens = 16;
  cuda::device_buffer<double> never_written(1);
  p.d_aux_loss = never_written.get();  // validation fails before any launch
  auto s = cuda::losses(cfg, p);
  REQUIRE(s.code == status_code::invalid_argument);
  REQUIRE(s.message.find("sums.d_valid_tokens") != std::string::npos);

  // the z sum: needed with a z-loss, unread (z = 0) without one
  cuda::device_buffer<std::int64_t> valid(std::vector<std::int64_t>{16});
  cuda::device_buffer<double> z_out(1);
  cuda::loss_params z_only;
  z_only.tokens = 16;
  z_only.sums.d_valid_tokens = valid.get();
  z_only.d_z_loss = z_out.get();
  routing_config with_z = cfg;
  with_z.loss.z_coefficient = 0.001f;
  s = cuda::losses(with_z, z_only);
  REQUIRE(s.code == status_code::invalid_argument);
  REQUIRE(s.message.find("sums.d_z_sum_squares") != std::string::npos);
  REQUIRE(cfg.loss.z_coefficient == 0.0f);  // Mixtral has no z-loss
  z_out.fill_bytes(0x5A);
  REQUIRE(cuda::losses(cfg, z_only).ok());
  REQUIRE(z_out.download()[0] == 0.0);

  cuda::device_buffer<double> out(1);
  out.fill_bytes(0x5A);
  cuda::loss_params empty;
  empty.tokens = 0;
  empty.d_aux_loss = out.get();
  REQUIRE(cuda::losses(cfg, empty).ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const auto h = out.download();
  std::uint64_t bits;
  std::memcpy(&bits, &h[0], sizeof bits);
  REQUIRE(bits == 0x5A5A5A5A5A5A5A5Aull);
}
