// SPDX-License-Identifier: Apache-2.0
// cuda::permute against reference::permute: an exact copy for fp32, fp16 and bf16, on the
// 16-byte path and the scalar path (odd widths, misaligned pointers); padding rows zero,
// rows past num_rows untouched.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <moeroute/cuda/permute.cuh>
#include <moeroute/reference.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "dispatch_test_util.cuh"

namespace moeroute::test {

namespace {
template <class Dev>
void check_permute(std::int64_t T, std::int64_t d, bool misalign, std::uint64_t seed) {
  using H = host_t<Dev>;
  INFO("T=" << T << " d=" << d << " sizeof=" << sizeof(Dev) << " misalign=" << misalign);
  case_spec s;
  s.drop = drop_case::fallback_dedicated_unbounded;
  const auto cfg = make_config(60, 4, s);
  const auto g = make_gating(cfg, T, seed, false);
  const auto ref = reference::dispatch(cfg, g);
  const auto L =
      reference::layout(cfg, ref, layout_kind::compact, 16);  // padding rows inside segments
  const std::int64_t extra = 24;                              // rows past num_rows stay untouched
  const std::int64_t rows = L.num_rows + extra;

  const auto x = random_host<H>(static_cast<std::size_t>(T * d), seed);
  std::vector<H> want(static_cast<std::size_t>(L.num_rows * d));
  reference::permute<H>(cfg, L, x, T, d, want);

  const std::size_t off = misalign ? 1 : 0;  // shifts both buffers off 16-byte alignment
  std::vector<H> xpad(off);
  xpad.insert(xpad.end(), x.begin(), x.end());
  auto dx = upload_bits<Dev>(xpad);
  std::vector<std::int32_t> rt = L.row_token;
  rt.resize(static_cast<std::size_t>(rows), 0);  // rows past num_rows: must be ignored
  device_buffer<std::int32_t> drt(rt);
  device_buffer<std::int64_t> dn(std::vector<std::int64_t>{L.num_rows});
  device_buffer<Dev> dout(static_cast<std::size_t>(rows * d) + off);
  dout.fill_bytes(0x7F);

  cuda::permute_params<Dev> p;
  p.d_x = dx.get() + off;
  p.tokens = T;
  p.hidden = d;
  p.layout.d_row_token = drt.get();
  p.layout.d_num_rows = dn.get();
  p.rows = rows;
  p.d_out = dout.get() + off;
  REQUIRE(cuda::permute(cfg, p).ok());
  const auto got = download_bits<H>(dout.get() + off, static_cast<std::size_t>(rows * d));
  for (std::int64_t i = 0; i < L.num_rows * d; ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(H)) != 0)
      FAIL("out[" << i << "] differs (row " << i / d << ")");
  std::vector<unsigned char> sentinel(sizeof(H), 0x7F);
  for (std::int64_t i = L.num_rows * d; i < rows * d; ++i)
    if (std::memcmp(&got[i], sentinel.data(), sizeof(H)) != 0)
      FAIL("out[" << i << "] past num_rows was written");
}
}  // namespace

TEST_CASE("permute: fp32 / fp16 / bf16, vector and scalar paths", "[cuda][permute][quick]") {
  std::uint64_t seed = 900;
  for (std::int64_t T : {1, 7, 300})
    for (std::int64_t d : {1, 3, 8, 64, 100}) {
      check_permute<float>(T, d, false, seed++);
      check_permute<__half>(T, d, false, seed++);
      check_permute<__nv_bfloat16>(T, d, false, seed++);
    }
  check_permute<float>(300, 64, true, seed++);  // misaligned: scalar path
  check_permute<__half>(300, 64, true, seed++);
}

TEST_CASE("permute: large shapes", "[cuda][permute]") {
  check_permute<__nv_bfloat16>(16384, 1024, false, 1);
  check_permute<float>(4096, 4096, false, 2);
  check_permute<__half>(1000, 2050, false, 3);  // 4100 bytes: scalar path
}

TEST_CASE("permute: errors and T = 0", "[cuda][permute][quick]") {
  const routing_config cfg = make_config(8, 2, case_spec{});
  device_buffer<float> out(16);
  out.fill_bytes(0x11);
  cuda::permute_params<float> p;
  p.tokens = 0;
  p.hidden = 4;
  p.rows = 4;
  p.d_out = out.get();
  REQUIRE(cuda::permute(cfg, p).ok());
  cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
  for (float v : out.download()) {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    REQUIRE(u == 0x11111111u);
  }
  p.tokens = 2;
  const auto st = cuda::permute(cfg, p);
  REQUIRE(st.code == status_code::invalid_argument);
  REQUIRE(st.message.find("d_x") != std::string::npos);
  p.hidden = -1;
  REQUIRE(cuda::permute(cfg, p).code == status_code::invalid_shape);
  p.hidden = 0;  // d = 0: nothing to copy, success
  REQUIRE(cuda::permute(cfg, p).ok());
}

}  // namespace moeroute::test
