// SPDX-License-Identifier: Apache-2.0
// Scale and soak tests for the GPU routing pipeline.
// [scale]: dispatch + compact layout + permute of an fp16 batch whose permuted buffer passes
//          2^31 elements (T = 2100, d = 2^20 = max_hidden, E = 8, k = 1, dropless; ~4.4 GiB in
//          and ~5.4 GiB out), checked on spot rows (first, last, rows past element 2^31,
//          padding rows) against reference::dispatch + reference::layout (compact). Without
//          the device memory it is skipped (exit 77: ctest's cuda_tests_scale reports it so).
// [soak]:  a randomized GPU-vs-CPU loop (fixed-seed std::mt19937) over E, k, score function,
//          priority, drop policy, capacity factor and T <= 4096: cuda::gating vs reference::gating,
//          cuda::dispatch vs reference::dispatch and cuda::layout vs reference::layout,
//          integers exactly. Bounded by MOEROUTE_SOAK_SECONDS (default 20).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_fp16.h>

#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/cuda/permute.cuh>
#include <moeroute/kernels/grid_dependency.cuh>
#include <moeroute/reference.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "../common/skip.hpp"
#include "dispatch_test_util.cuh"
#include "gating_harness.cuh"

namespace moeroute::test {

namespace {
// Bits of x[t, j]: a hash of (t, j), never the all-zero pattern, so padding rows (zeros) and a
// wrong token or column are told apart.
__host__ __device__ inline std::uint16_t scale_bits(std::int64_t t, std::int64_t j) {
  std::uint32_t h =
      static_cast<std::uint32_t>(t) * 2654435761u ^ static_cast<std::uint32_t>(j) * 2246822519u;
  h ^= h >> 15;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  return static_cast<std::uint16_t>((h & 0x3BFFu) | 0x0400u);  // finite, normal, nonzero
}

// (launched through cuda::launch, so it enters as every moeroute kernel does:
// kernels/moeroute/kernels/grid_dependency.cuh)
__global__ void fill_scale_kernel(__half* x, std::int64_t n, std::int64_t d) {
  moeroute::kernels::enter_after_prior_grid();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint16_t b = scale_bits(i / d, i % d);
    std::memcpy(static_cast<void*>(&x[i]), &b, sizeof b);
  }
}
}  // namespace

TEST_CASE("scale: permute of an fp16 buffer past 2^31 elements", "[cuda][scale]") {
  constexpr std::int64_t T = 2100, d = std::int64_t{1} << 20, block = 64;
  case_spec s;
  s.cap = cap_case::unbounded;  // dropless
  auto cfg = make_config(8, 1, s);
  const auto g = make_gating(cfg, T, 4242, false);
  const auto ref = reference::dispatch(cfg, g);
  const auto L = reference::layout(cfg, ref, layout_kind::compact, block);
  REQUIRE(ref.total_dropped == 0);
  REQUIRE(L.num_rows * d > (std::int64_t{1} << 31));

  std::size_t free_bytes = 0, total_bytes = 0;
  cuda::throw_if_cuda_error(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const std::int64_t need = (T + cuda::compact_max_rows(cfg, T, block)) * d * 2;
  if (static_cast<std::int64_t>(free_bytes) < need + (std::int64_t{1} << 30))
    skip_test("scale test needs " + std::to_string(need >> 20) + " MiB of device memory, " +
              std::to_string(free_bytes >> 20) + " MiB free");
  try {
    gpu_dispatch gd(cfg, g, false);
    REQUIRE(gd.run().ok());
    require_matches(gd.download(), ref);
    gpu_layout gl(cfg, gd, layout_kind::compact, block);
    REQUIRE(gl.run().ok());
    require_layout_matches(gl, L);

    const std::int64_t rows = gl.params.max_rows;
    device_buffer<__half> x(static_cast<std::size_t>(T * d));
    device_buffer<__half> out(static_cast<std::size_t>(rows * d));
    out.fill_bytes(0x7F);
    REQUIRE(cuda::launch("fill_scale_kernel", fill_scale_kernel, {4096, 256, 0}, nullptr, x.get(),
                         T * d, d)
                .ok());

    cuda::permute_params<__half> p;
    p.d_x = x.get();
    p.tokens = T;
    p.hidden = d;
    p.layout = gl.result();
    p.rows = rows;
    p.d_out = out.get();
    const auto st = cuda::permute(cfg, p);
    INFO(st.message);
    REQUIRE(st.ok());
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "permute sync");

    // Spot rows: first, last, every row whose start lies past element 2^31 up to a few,
    // the row straddling 2^31, and every padding row (checked on a prefix and the tail).
    std::vector<std::int64_t> spot{0, 1, L.num_rows - 1};
    const std::int64_t r31 = (std::int64_t{1} << 31) / d;  // row holding element 2^31
    for (std::int64_t r = r31 - 1; r < r31 + 4 && r < L.num_rows; ++r) spot.push_back(r);
    std::int64_t padding = 0;
    for (std::int64_t r = 0; r < L.num_rows; ++r)
      if (L.row_token[r] < 0 && padding++ < 16) spot.push_back(r);
    REQUIRE(padding > 0);
    bool past31 = false;
    std::vector<std::uint16_t> row(static_cast<std::size_t>(d));
    for (const std::int64_t r : spot) {
      INFO("row " << r << " token " << L.row_token[r]);
      past31 = past31 || r * d >= (std::int64_t{1} << 31);
      cuda::throw_if_cuda_error(
          cudaMemcpy(row.data(), out.get() + r * d, d * sizeof(__half), cudaMemcpyDeviceToHost),
          "row");
      const std::int32_t t = L.row_token[r];
      for (std::int64_t j = 0; j < d; ++j) {
        const std::uint16_t want = t < 0 ? std::uint16_t{0} : scale_bits(t, j);
        if (row[j] != want)
          FAIL("out[" << r << ", " << j << "] = " << row[j] << ", expected " << want);
      }
    }
    REQUIRE(past31);
    // Rows past num_rows are not touched.
    if (rows > L.num_rows) {
      cuda::throw_if_cuda_error(cudaMemcpy(row.data(), out.get() + (rows - 1) * d,
                                           d * sizeof(__half), cudaMemcpyDeviceToHost),
                                "tail row");
      for (std::int64_t j = 0; j < d; ++j) REQUIRE(row[j] == 0x7F7F);
    }
  } catch (const moeroute::error& e) {
    if (std::string(e.what()).find("cudaMalloc") == std::string::npos) throw;
    skip_test(std::string("scale test: device memory: ") + e.what());
  }
}

TEST_CASE("soak: randomized GPU vs CPU routing", "[cuda][soak]") {
  double seconds = 20.0;
  if (const char* env = std::getenv("MOEROUTE_SOAK_SECONDS")) seconds = std::atof(env);
  std::mt19937 rng(20260602u);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const auto start = std::chrono::steady_clock::now();
  std::int64_t iterations = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
         seconds) {
    static constexpr std::int32_t Es[] = {1, 2, 4, 8, 16, 60, 64, 128, 256};
    const std::int32_t E = Es[pick(9)];
    const std::int32_t k = 1 + pick(E < 8 ? E : 8);
    const std::int64_t T = 1 + pick(4096);
    case_spec s;
    s.prio = static_cast<priority>(pick(4));
    s.drop = static_cast<drop_case>(pick(static_cast<int>(drop_case::count)));
    s.cap = static_cast<cap_case>(pick(static_cast<int>(cap_case::count)));
    s.slots = static_cast<slot_order>(pick(2));
    s.masked = pick(4) == 0;
    s.after_drop = pick(2) == 0;
    auto cfg = make_config(E, k, s);
    cfg.gating.score = static_cast<score_function>(pick(3));
    if (s.cap == cap_case::factor) cfg.capacity.factor = 0.25 + 0.25 * pick(8);
    if (!validate(cfg)) continue;
    const std::uint32_t salt = static_cast<std::uint32_t>(rng());
    INFO("iteration " << iterations << ": " << describe(cfg, T) << " | " << describe(s, T, E, k));

    const auto logits = grid_logits(T, E, salt);
    const auto valid = s.masked ? make_valid(T) : std::vector<std::uint8_t>{};
    const auto g = reference::gating<float>(cfg, std::span<const float>(logits), T, {},
                                            std::span<const std::uint8_t>(valid));
    const std::string gm = compare(g, run_gpu<float>(cfg, logits, T, {}, valid));
    INFO(gm);
    REQUIRE(gm.empty());

    const auto ref = reference::dispatch(cfg, g);
    gpu_dispatch gd(cfg, g, s.masked);
    const auto st = gd.run();
    INFO(st.message);
    REQUIRE(st.ok());
    require_matches(gd.download(), ref);
    if (cfg.capacity.mode != capacity_mode::unbounded) {
      gpu_layout gl(cfg, gd, layout_kind::padded, 1);
      REQUIRE(gl.run().ok());
      require_layout_matches(gl, reference::layout(cfg, ref, layout_kind::padded));
    }
    const std::int64_t block = std::int64_t{1} << pick(8);
    gpu_layout gl(cfg, gd, layout_kind::compact, block);
    REQUIRE(gl.run().ok());
    require_layout_matches(gl, reference::layout(cfg, ref, layout_kind::compact, block));
    ++iterations;
  }
  WARN("soak: " << iterations << " randomized GPU-vs-CPU iterations in " << seconds << " s");
  REQUIRE((iterations > 0 || seconds <= 0.0));
}

}  // namespace moeroute::test
