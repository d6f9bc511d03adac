// SPDX-License-Identifier: Apache-2.0
// cuda::combine against reference::combine, bit for bit in fp32, fp16 and bf16 (the same fp32
// products and sums in rank order, one round-to-nearest-even at the end), every drop policy
// including residual pass-through and fallback outputs; the whole GPU pipeline dispatch -> layout
// -> permute -> combine against the CPU pipeline, bitwise reruns, and the pipeline captured in a
// CUDA graph and replayed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <moeroute/cuda/combine.cuh>
#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/cuda/permute.cuh>
#include <moeroute/reference.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "dispatch_test_util.cuh"
#include "graph_replay.cuh"

namespace moeroute::test {

namespace {
template <class Dev>
void check_combine(std::int64_t T, std::int32_t E, std::int32_t k, std::int64_t d,
                   const case_spec& s, std::uint64_t seed) {
  using H = host_t<Dev>;
  const auto cfg = make_config(E, k, s);
  INFO(describe(s, T, E, k) << " d=" << d << " sizeof=" << sizeof(Dev));
  const auto g = make_gating(cfg, T, seed, s.masked);
  const auto ref = reference::dispatch(cfg, g);
  const auto L = reference::layout(cfg, ref, layout_kind::compact, 8);
  const auto x = random_host<H>(static_cast<std::size_t>(T * d), seed + 1);
  const auto eo = random_host<H>(static_cast<std::size_t>(L.num_rows * d), seed + 2);
  std::vector<H> want(static_cast<std::size_t>(T * d));
  reference::combine<H>(cfg, L, ref, eo, d, x, want);

  // inputs straight from the reference, so this checks combine alone
  auto dx = upload_bits<Dev>(x);
  auto deo = upload_bits<Dev>(eo);
  device_buffer<std::int64_t> drow(L.assignment_row);
  device_buffer<float> dw(ref.weight);
  device_buffer<fate> dfate(ref.fates);
  device_buffer<Dev> dy(static_cast<std::size_t>(T * d));
  dy.fill_bytes(0x55);

  cuda::combine_params<Dev> p;
  p.d_expert_out = deo.get();
  p.rows = L.num_rows;
  p.layout.d_assignment_row = drow.get();
  p.dispatched.d_weight = dw.get();
  p.dispatched.d_fate = dfate.get();
  p.d_x = dx.get();
  p.tokens = T;
  p.hidden = d;
  p.d_y = dy.get();
  REQUIRE(cuda::combine(cfg, p).ok());
  const auto got = download_bits<H>(dy.get(), static_cast<std::size_t>(T * d));
  for (std::int64_t i = 0; i < T * d; ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(H)) != 0)
      FAIL("y[" << i << "] (token " << i / d << "): got " << to_float(got[i]) << ", expected "
                << to_float(want[i]));
  // rerun: bitwise identical
  dy.fill_bytes(0x00);
  REQUIRE(cuda::combine(cfg, p).ok());
  const auto again = download_bits<H>(dy.get(), static_cast<std::size_t>(T * d));
  REQUIRE(std::memcmp(again.data(), got.data(), got.size() * sizeof(H)) == 0);
}
}  // namespace

TEST_CASE("combine: every drop policy, fp32 / fp16 / bf16", "[cuda][combine][quick]") {
  std::uint64_t seed = 3000;
  for (int drop = 0; drop < static_cast<int>(drop_case::count); ++drop) {
    case_spec s;
    s.drop = static_cast<drop_case>(drop);
    s.prio = static_cast<priority>(drop % 4);
    s.masked = drop % 2 == 1;
    s.cap = drop == 5 ? cap_case::fixed : cap_case::factor;
    for (std::int64_t d : {3, 8, 64}) {
      check_combine<float>(50, 8, 2, d, s, seed++);
      check_combine<__half>(50, 8, 2, d, s, seed++);
      check_combine<__nv_bfloat16>(50, 8, 2, d, s, seed++);
    }
  }
}

TEST_CASE("combine: shape grid", "[cuda][combine]") {
  int i = 0;
  for (std::int64_t T : {1, 7, 1000, 16384})
    for (std::int32_t E : {6, 64, 256})
      for (std::int32_t k : {1, 2, 8}) {
        if (k > E) continue;
        const std::int64_t d = T >= 16384 ? 256 : 128;
        check_combine<float>(T, E, k, d, spec_for(i), 4000 + static_cast<std::uint64_t>(i));
        check_combine<__nv_bfloat16>(T, E, k, d, spec_for(i + 1),
                                     5000 + static_cast<std::uint64_t>(i));
        ++i;
      }
}

TEST_CASE("combine: errors and T = 0", "[cuda][combine][quick]") {
  case_spec s;
  s.drop = drop_case::residual;
  const routing_config cfg = make_config(8, 2, s);
  device_buffer<float> y(8);
  y.fill_bytes(0x22);
  cuda::combine_params<float> p;
  p.tokens = 0;
  p.hidden = 4;
  p.d_y = y.get();
  REQUIRE(cuda::combine(cfg, p).ok());
  cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
  for (float v : y.download()) {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    REQUIRE(u == 0x22222222u);
  }
  p.tokens = 2;
  auto st = cuda::combine(cfg, p);
  REQUIRE(st.code == status_code::invalid_argument);
  REQUIRE(st.message.find("layout.d_assignment_row") != std::string::npos);
  device_buffer<std::int64_t> rows(4);
  device_buffer<float> w(4);
  p.layout.d_assignment_row = rows.get();
  p.dispatched.d_weight = w.get();
  st = cuda::combine(cfg, p);  // the residual policy needs the fates and x
  REQUIRE(st.code == status_code::invalid_argument);
  REQUIRE(st.message.find("dispatched.d_fate") != std::string::npos);
  p.hidden = -1;
  REQUIRE(cuda::combine(cfg, p).code == status_code::invalid_shape);
}

namespace {
/// The whole GPU forward routing after gating, on one stream; every buffer preallocated.
struct pipeline {
  routing_config cfg;
  gpu_dispatch d;
  gpu_layout L;
  std::int64_t hidden;
  device_buffer<float> x, buf, y;
  pipeline(const routing_config& c, const reference::gating_output& g, std::int64_t dd,
           const std::vector<float>& hx)
      : cfg(c),
        d(c, g, true),
        L(c, d, layout_kind::compact, 16),
        hidden(dd),
        x(hx),
        buf(static_cast<std::size_t>(L.params.max_rows * dd)),
        y(static_cast<std::size_t>(g.tokens * dd)) {}
  status run(cudaStream_t s) {
    if (auto st = d.run(s); !st) return st;
    if (auto st = L.run(s); !st) return st;
    cuda::permute_params<float> pp;
    pp.d_x = x.get();
    pp.tokens = d.T;
    pp.hidden = hidden;
    pp.layout = L.result();
    pp.rows = L.params.max_rows;
    pp.d_out = buf.get();
    if (auto st = cuda::permute(cfg, pp, s); !st) return st;
    // identity experts: expert_out = the permuted input
    cuda::combine_params<float> cp;
    cp.d_expert_out = buf.get();
    cp.rows = L.params.max_rows;
    cp.tokens = d.T;
    cp.hidden = hidden;
    cp.layout = L.result();
    cp.dispatched = d.result();
    cp.d_x = x.get();
    cp.d_y = y.get();
    return cuda::combine(cfg, cp, s);
  }
};
}  // namespace

TEST_CASE("pipeline: dispatch -> layout -> permute -> combine, reruns and graph replay",
          "[cuda][combine][quick]") {
  for (int variant = 0; variant < static_cast<int>(drop_case::count); ++variant) {
    case_spec s;
    s.drop = static_cast<drop_case>(variant);
    s.prio = static_cast<priority>(variant % 4);
    s.slots = static_cast<slot_order>(variant % 2);
    s.cap = variant == 3 ? cap_case::max_load : cap_case::factor;
    s.masked = variant % 2 == 0;
    const std::int64_t T = 300, d = 64;
    const auto cfg = make_config(60, 4, s);
    INFO(describe(s, T, 60, 4));
    const auto g = make_gating(cfg, T, 77 + variant, s.masked);
    const auto ref = reference::dispatch(cfg, g);
    const auto RL = reference::layout(cfg, ref, layout_kind::compact, 16);
    const auto hx = random_host<float>(static_cast<std::size_t>(T * d), 99);
    std::vector<float> rbuf(static_cast<std::size_t>(RL.num_rows * d)),
        want(static_cast<std::size_t>(T * d));
    reference::permute<float>(cfg, RL, hx, T, d, rbuf);
    reference::combine<float>(cfg, RL, ref, rbuf, d, hx, want);

    pipeline pl(cfg, g, d, hx);
    cudaStream_t stream;
    cuda::throw_if_cuda_error(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    REQUIRE(pl.run(stream).ok());
    cuda::throw_if_cuda_error(cudaStreamSynchronize(stream), "sync");
    const auto first = pl.y.download();
    require_bits("y", first, want);

    capture_and_replay(
        stream, [&](cudaStream_t s) { return pl.run(s); },
        [&] {
          pl.y.fill_bytes(0xFF);
          pl.buf.fill_bytes(0xFF);
        },
        [&] {
          const auto again = pl.y.download();
          REQUIRE(std::memcmp(again.data(), first.data(), first.size() * sizeof(float)) == 0);
        });
    cudaStreamDestroy(stream);
  }
}

}  // namespace moeroute::test
