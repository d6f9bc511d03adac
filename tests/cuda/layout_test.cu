// SPDX-License-Identifier: Apache-2.0
// cuda::layout against reference::layout (padded and compact), fed by cuda::dispatch:
// offsets, rows used, row -> token, assignment -> row and block -> expert exactly.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/reference.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "dispatch_test_util.cuh"

// No using-directive at global scope (nvcc stubs name ::cuda types unqualified).
namespace moeroute::test {

namespace {
void check_layouts(std::int64_t T, std::int32_t E, std::int32_t k, const case_spec& s,
                   std::uint64_t seed) {
  INFO(describe(s, T, E, k));
  routed_case c(T, E, k, s, seed);
  const routing_config& cfg = c.cfg;
  gpu_dispatch& d = c.gpu;
  const reference::dispatch_output& ref = c.want;
  REQUIRE(d.run().ok());
  if (cfg.capacity.mode != capacity_mode::unbounded) {
    gpu_layout L(cfg, d, layout_kind::padded, 1);
    const auto st = L.run();
    INFO(st.message);
    REQUIRE(st.ok());
    require_layout_matches(L, reference::layout(cfg, ref, layout_kind::padded));
  }
  for (std::int64_t block : {1, 16, 128}) {
    INFO("compact block " << block);
    gpu_layout L(cfg, d, layout_kind::compact, block, /*extra_rows=*/block == 16 ? 40 : 0);
    const auto st = L.run();
    INFO(st.message);
    REQUIRE(st.ok());
    require_layout_matches(L, reference::layout(cfg, ref, layout_kind::compact, block));
  }
}
}  // namespace

TEST_CASE("layout: padded and compact over policies", "[cuda][layout][quick]") {
  std::uint64_t seed = 500;
  for (int drop = 0; drop < static_cast<int>(drop_case::count); ++drop)
    for (int cap = 0; cap < static_cast<int>(cap_case::count); ++cap) {
      case_spec s;
      s.prio = static_cast<priority>((drop + cap) % 5);
      s.drop = static_cast<drop_case>(drop);
      s.cap = static_cast<cap_case>(cap);
      s.slots = static_cast<slot_order>(cap % 2);
      s.masked = drop == 1;
      s.groups = cap % 2 == 0 ? 4 : 1;  // capacity groups where 4 divides T: padded C * 4 rows
      check_layouts(7, 6, 2, s, seed++);
      if (cap == 0 || cap == 2) check_layouts(200, 60, 4, s, seed++);
    }
}

TEST_CASE("layout: shape grid", "[cuda][layout]") {
  int i = 0;
  for (std::int64_t T : {1, 1000, 16384})
    for (std::int32_t E : {1, 8, 64, 256, 384})
      for (std::int32_t k : {1, 2, 8}) {
        if (k > E || T * E > (std::int64_t{1} << 23)) continue;
        check_layouts(T, E, k, spec_for(i), 700 + static_cast<std::uint64_t>(i));
        ++i;
      }
}

TEST_CASE("layout: the local-expert view (expert map) equals reference::local_layout",
          "[cuda][layout][quick]") {
  for (int i = 0; i < 10; ++i) {
    const case_spec s = spec_for(i);
    INFO(describe(s, 90, 12, 3));
    routed_case c(90, 12, 3, s, 40 + i);
    REQUIRE(c.gpu.run().ok());
    const std::int32_t ET = c.cfg.total_experts();
    std::vector<std::int32_t> map(ET, -1);  // the odd experts, backwards; then a bad map
    std::int32_t L = 0;
    for (std::int32_t e = ET - 1; e >= 0; --e)
      if (e % 2 == 1) map[e] = L++;
    const auto want = reference::local_layout(c.cfg, c.want, 4, map);
    device_buffer<std::int32_t> d_map(map);
    device_buffer<std::int64_t> nonlocal(1);
    gpu_layout g(c.cfg, c.gpu, layout_kind::compact, 4);
    g.params.d_expert_map = d_map.get();
    g.params.local_experts = L;
    g.params.out.d_nonlocal = nonlocal.get();
    REQUIRE(g.run().ok());
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
    REQUIRE(g.num_rows.download()[0] == want.num_rows);
    CHECK(nonlocal.download()[0] == want.nonlocal);
    // the buffers hold ET segments; a view of L writes the first L (+1) only
    require_same("offsets", g.offsets.download(L + 1), want.offsets);
    require_same("rows_used", g.rows_used.download(L), want.rows_used);
    require_same("assignment_row", g.assignment_row.download(), want.assignment_row);
    const auto rt = g.row_token.download();
    require_same("row_token", std::vector<std::int32_t>(rt.begin(), rt.begin() + want.num_rows),
                 want.row_token);
    const auto be = g.block_expert.download();
    require_same("block_expert",
                 std::vector<std::int32_t>(be.begin(), be.begin() + want.num_rows / 4),
                 want.block_expert);
    for (std::size_t b = static_cast<std::size_t>(want.num_rows / 4); b < be.size(); ++b)
      REQUIRE(be[b] == -1);
    // a map the launcher cannot check (a local index held twice): an empty layout, every held
    // assignment counted as elsewhere
    map[1] = map[3];
    device_buffer<std::int32_t> bad_map(map);
    g.params.d_expert_map = bad_map.get();
    REQUIRE(g.run().ok());
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
    CHECK(g.num_rows.download()[0] == 0);
    CHECK(nonlocal.download()[0] == c.want.total_kept + c.want.total_rerouted);
    for (const auto row : g.assignment_row.download()) REQUIRE(row == -1);
  }
}

TEST_CASE("layout: errors and T = 0", "[cuda][layout][quick]") {
  case_spec s;
  s.cap = cap_case::unbounded;
  routed_case c(40, 8, 2, s, 3);
  const routing_config& cfg = c.cfg;
  gpu_dispatch& d = c.gpu;
  REQUIRE(d.run().ok());

  SECTION("padded needs a bounded capacity") {
    gpu_layout L(cfg, d, layout_kind::compact, 1);
    auto p = L.params;
    p.kind = layout_kind::padded;
    REQUIRE(cuda::layout(cfg, p).code == status_code::unsupported);
  }
  SECTION("max_rows below the bound is rejected") {
    gpu_layout L(cfg, d, layout_kind::compact, 8);
    auto p = L.params;
    p.max_rows -= 1;
    const auto st = cuda::layout(cfg, p);
    REQUIRE(st.code == status_code::invalid_shape);
    REQUIRE(st.message.find("max_rows") != std::string::npos);
    p = L.params;
    p.block_size = 0;
    REQUIRE(cuda::layout(cfg, p).code == status_code::invalid_argument);
    p = L.params;
    p.out.d_assignment_row = nullptr;
    REQUIRE(cuda::layout(cfg, p).code == status_code::invalid_argument);
  }
  SECTION("T = 0 succeeds and writes nothing") {
    gpu_layout L(cfg, d, layout_kind::compact, 4);
    L.offsets.fill_bytes(0x3C);
    L.row_token.fill_bytes(0x3C);
    auto p = L.params;
    p.tokens = 0;
    p.max_rows = cuda::compact_max_rows(cfg, 0, 4);
    REQUIRE(cuda::layout(cfg, p).ok());
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
    for (auto v : L.offsets.download()) REQUIRE(v == 0x3C3C3C3C3C3C3C3CLL);
    for (auto v : L.row_token.download()) REQUIRE(v == 0x3C3C3C3C);
  }
}

}  // namespace moeroute::test
