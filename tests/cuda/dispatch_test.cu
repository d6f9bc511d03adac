// SPDX-License-Identifier: Apache-2.0
// cuda::dispatch against reference::dispatch on the same gating output: ids, slots, fates,
// counts and weights bit for bit; over the T x E x k grid, every priority, drop
// policy, slot order and capacity mode, the golden peer cases, errors, T = 0, reruns and
// CUDA-graph replay.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/token_mask.cuh>
#include <moeroute/reference.hpp>

#include <moeroute/cuda/device_buffer.cuh>
#include "../common/golden.hpp"
#include "dispatch_test_util.cuh"
#include "graph_replay.cuh"

// No using-directive at global scope: nvcc's generated stubs name ::cuda::std types
// unqualified, and `using namespace moeroute` would make `cuda` ambiguous there.
namespace moeroute::test {

TEST_CASE("dispatch: every priority x drop policy x slot order x capacity mode",
          "[cuda][dispatch]") {
  struct shape {
    std::int64_t T;
    std::int32_t E, k;
  };
  const shape shapes[] = {{7, 6, 2}, {300, 60, 4}, {300, 8, 8}, {1000, 64, 1}};
  std::uint64_t seed = 1;
  for (const auto& sh : shapes)
    for (int prio = 0; prio < 5; ++prio)
      for (int drop = 0; drop < static_cast<int>(drop_case::count); ++drop)
        for (int slots = 0; slots < 2; ++slots)
          for (int cap = 0; cap < static_cast<int>(cap_case::count); ++cap) {
            case_spec s;
            s.prio = static_cast<priority>(prio);
            s.drop = static_cast<drop_case>(drop);
            s.slots = static_cast<slot_order>(slots);
            s.cap = static_cast<cap_case>(cap);
            s.masked = (prio + cap) % 3 == 0;
            s.after_drop = (drop + slots) % 2 == 0;
            s.groups = (drop + cap) % 2 == 0 ? 3 : 1;  // capacity groups where 3 divides T
            s.second_random = (prio + drop) % 3 == 0;  // where k = 2
            check_dispatch_case(sh.T, sh.E, sh.k, s, seed++);
          }
}

TEST_CASE("dispatch: policies on small shapes", "[cuda][dispatch][quick]") {
  // The reduced set compute-sanitizer runs: every priority and drop policy, both slot orders.
  std::uint64_t seed = 100;
  for (int prio = 0; prio < 5; ++prio)
    for (int drop = 0; drop < static_cast<int>(drop_case::count); ++drop)
      for (int slots = 0; slots < 2; ++slots) {
        case_spec s;
        s.prio = static_cast<priority>(prio);
        s.drop = static_cast<drop_case>(drop);
        s.slots = static_cast<slot_order>(slots);
        s.cap = static_cast<cap_case>((prio + drop + slots) % static_cast<int>(cap_case::count));
        s.masked = drop % 2 == 1;
        check_dispatch_case(7, 6, 2, s, seed++);
        if (slots == 0) check_dispatch_case(96, 60, 4, s, seed++);
        s.groups = 4;  // four capacity groups of 24 tokens, every policy rerouting per group
        check_dispatch_case(96, 60, 4, s, seed++);
      }
}

TEST_CASE("dispatch: a device token count is the dispatch of the first n tokens",
          "[cuda][dispatch]") {
  // rows [n, T) padding and C of n tokens, n read on the device (clamped to [0, T]): what a
  // CUDA graph captured once for the largest batch runs; every priority, policy and capacity
  // mode, the one-block and the multi-kernel paths (T * k above and below 4096)
  struct shape {
    std::int64_t T;
    std::int32_t E, k;
  };
  const shape shapes[] = {{300, 60, 4}, {300, 8, 8}, {700, 64, 8}};
  std::uint64_t seed = 500;
  for (const auto& sh : shapes)
    for (int prio = 0; prio < 5; ++prio)
      for (int drop = 0; drop < static_cast<int>(drop_case::count); ++drop) {
        case_spec s = rotating_spec(prio, drop);
        s.masked = (prio + drop) % 3 == 0;
        s.after_drop = drop % 2 == 0;
        for (const std::int64_t n :
             {std::int64_t{0}, std::int64_t{1}, sh.T / 2 + 1, sh.T, sh.T + 5, std::int64_t{-3}}) {
          INFO(describe(s, sh.T, sh.E, sh.k) << ", d_token_count = " << n);
          routed_case c(sh.T, sh.E, sh.k, s, seed++);
          device_buffer<std::int64_t> count(std::vector<std::int64_t>{n});
          c.gpu.params.d_token_count = count.get();
          const auto st = c.gpu.run();
          INFO(st.message);
          REQUIRE(st.ok());
          const std::int64_t real = std::clamp<std::int64_t>(n, 0, sh.T);
          require_matches(
              c.gpu.download(),
              padded_to_rows(reference::dispatch(c.cfg, first_tokens(c.gating, real)), sh.T));
        }
      }
  // capacity groups need the count on the host
  case_spec s;
  s.groups = 3;
  routed_case c(300, 60, 4, s, seed);
  device_buffer<std::int64_t> count(std::vector<std::int64_t>{5});
  c.gpu.params.d_token_count = count.get();
  const auto st = c.gpu.run();
  REQUIRE(st.code == status_code::invalid_argument);
  REQUIRE(st.message.find("d_token_count") != std::string::npos);
}

TEST_CASE("token_mask: the first n rows valid marks, n read and clamped on the device",
          "[cuda][dispatch][quick]") {
  const std::int64_t T = 1000;  // (several blocks)
  std::vector<std::uint8_t> valid(T);
  for (std::int64_t t = 0; t < T; ++t) valid[t] = t % 7 == 3 ? 0 : 1;
  device_buffer<std::uint8_t> d_valid(valid), d_mask(std::vector<std::uint8_t>(T, 9));
  for (const bool with_valid : {false, true})
    for (const std::int64_t n :
         {std::int64_t{0}, std::int64_t{1}, std::int64_t{513}, T, T + 5, std::int64_t{-3}}) {
      INFO("n = " << n << (with_valid ? ", with valid" : ""));
      device_buffer<std::int64_t> d_n(std::vector<std::int64_t>{n});
      const cuda::token_mask_params p{T, d_n.get(), with_valid ? d_valid.get() : nullptr,
                                      d_mask.get()};
      REQUIRE(cuda::token_mask(p).ok());
      const auto mask = d_mask.download();
      const std::int64_t real = std::clamp<std::int64_t>(n, 0, T);
      for (std::int64_t t = 0; t < T; ++t)
        REQUIRE(mask[t] == (t < real && (!with_valid || valid[t] != 0) ? 1 : 0));
    }
  REQUIRE(cuda::token_mask({T, nullptr, nullptr, d_mask.get()}).message.find("d_count") !=
          std::string::npos);
  REQUIRE(cuda::token_mask({0, nullptr, nullptr, nullptr}).ok());
}

TEST_CASE("dispatch: shape grid T x E x k", "[cuda][dispatch]") {
  CHECK(for_each_dispatch_shape(check_dispatch_case) > 100);
}

TEST_CASE("dispatch: golden peer cases through the GPU path", "[cuda][dispatch][golden]") {
  // The peers' own logits, each with its case's preset: GPU == reference bit for bit
  // (reference == peer is golden_tests' job, on the same cases through the same mapping).
  const auto cases = load_golden_cases(golden_directory("MOEROUTE_GOLDEN_DIR", "golden"));
  REQUIRE(cases.size() > 100);
  for (const auto& g : cases) {
    INFO(g.file << " " << g.name);
    const auto gat = reference::gating<float>(g.cfg, std::span<const float>(g.logits), g.tokens,
                                              std::span<const float>(g.bias));
    const auto ref = reference::dispatch(g.cfg, gat);
    gpu_dispatch gpu(g.cfg, gat, false);
    const auto st = gpu.run();
    INFO(st.message);
    REQUIRE(st.ok());
    require_matches(gpu.download(), ref);
  }
}

TEST_CASE("dispatch: errors, T = 0, workspace", "[cuda][dispatch][quick]") {
  case_spec s;
  s.drop = drop_case::next_choice;
  routed_case c(50, 8, 2, s, 7);
  const routing_config& cfg = c.cfg;
  gpu_dispatch& gpu = c.gpu;

  SECTION("workspace too small is an error, not a crash") {
    const auto st = cuda::dispatch(cfg, gpu.params, gpu.ws.get(), gpu.ws.size() - 1);
    REQUIRE(st.code == status_code::workspace_too_small);
    REQUIRE(cuda::dispatch(cfg, gpu.params, nullptr, 0).code == status_code::workspace_too_small);
    REQUIRE(st.message.find("dispatch_workspace_bytes") != std::string::npos);
    // the carved arrays hold 8-byte keys: a misaligned workspace is an error, not a fault
    device_buffer<unsigned char> larger(gpu.ws.size() + 8);
    const auto mis = cuda::dispatch(cfg, gpu.params, larger.get() + 4, gpu.ws.size());
    REQUIRE(mis.code == status_code::invalid_argument);
  }
  SECTION("bad params name the field") {
    auto p = gpu.params;
    p.gated.d_gates = nullptr;
    auto st = cuda::dispatch(cfg, p, gpu.ws.get(), gpu.ws.size());
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find("gated.d_gates") != std::string::npos);
    p = gpu.params;
    p.gated.d_reroute_ids = nullptr;  // next_choice needs the reroute candidates
    st = cuda::dispatch(cfg, p, gpu.ws.get(), gpu.ws.size());
    REQUIRE(st.code == status_code::invalid_argument);
    REQUIRE(st.message.find("d_reroute_ids") != std::string::npos);
    p = gpu.params;
    p.out.d_totals = nullptr;
    st = cuda::dispatch(cfg, p, gpu.ws.get(), gpu.ws.size());
    REQUIRE(st.message.find("out.d_totals") != std::string::npos);
    auto bad = cfg;
    bad.top_k = 0;
    REQUIRE(cuda::dispatch(bad, gpu.params, gpu.ws.get(), gpu.ws.size()).code ==
            status_code::invalid_config);
  }
  SECTION("T = 0 succeeds and writes nothing") {
    gpu.expert.fill_bytes(0x5A);
    gpu.requested.fill_bytes(0x5A);
    gpu.totals.fill_bytes(0x5A);
    auto p = gpu.params;
    p.tokens = 0;
    REQUIRE(cuda::dispatch(cfg, p, nullptr, 0).ok());
    REQUIRE(cuda::dispatch_workspace_bytes(cfg, 0) == 0);
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(), "sync");
    for (auto v : gpu.expert.download()) REQUIRE(v == 0x5A5A5A5A);
    for (auto v : gpu.requested.download()) REQUIRE(v == 0x5A5A5A5A5A5A5A5ALL);
    REQUIRE(gpu.totals.download()[0].capacity == 0x5A5A5A5A5A5A5A5ALL);
  }
}

TEST_CASE("dispatch: malformed given ids are masked and counted, never read",
          "[cuda][dispatch][quick]") {
  // An engine's ids reach cuda::dispatch unchecked by the host (device data): a token with an
  // id outside [0, E), a repeated expert, a non-finite gate, or a reroute candidate that repeats
  // an id is masked and counted in totals.invalid_tokens; every other token is dispatched as
  // the reference dispatches the batch with those tokens marked padding.
  for (int i = 0; i < 12; ++i) {
    case_spec s = spec_for(i);
    if (i % 4 == 0) s.drop = drop_case::next_choice;
    INFO(describe(s, 70, 8, 2));
    const routing_config cfg = make_config(8, 2, s, 70);
    const auto clean = make_gating(cfg, 70, 500 + i, s.masked);
    auto spoiled = clean;
    auto as_padding = clean;
    const std::int32_t k = 2, R = clean.reroute_candidates;
    std::int64_t invalid = 0;
    for (std::int64_t t = 0; t < clean.tokens; ++t) {
      const int kind = static_cast<int>(t % 7);
      if (kind == 1) spoiled.ids[t * k + 1] = 8 + static_cast<std::int32_t>(t % 3);  // >= E
      if (kind == 2) spoiled.ids[t * k] = -1;
      if (kind == 3) spoiled.ids[t * k + 1] = spoiled.ids[t * k];  // a repeat
      if (kind == 4) spoiled.gates[t * k] = std::numeric_limits<float>::quiet_NaN();
      if (kind == 5 && R > 0) spoiled.reroute_ids[t * R] = spoiled.ids[t * k + 1];
      const bool spoil = kind >= 1 && kind <= 4 ? true : (kind == 5 && R > 0);
      if (spoil && clean.valid[t] != 0) {
        as_padding.valid[t] = 0;
        ++invalid;
      }
    }
    const auto want = reference::dispatch(cfg, as_padding);
    gpu_dispatch gpu(cfg, spoiled, true);
    const auto st = gpu.run();
    INFO(st.message);
    REQUIRE(st.ok());
    const host_dispatch got = gpu.download();
    require_matches(got, want);
    CHECK(got.totals.invalid_tokens == invalid);
    CHECK(invalid > 0);
  }
}

TEST_CASE("dispatch: reruns are bitwise identical, graph replay matches",
          "[cuda][dispatch][quick]") {
  for (int variant = 0; variant < 6; ++variant) {
    case_spec s;
    s.prio = static_cast<priority>(variant % 4);
    s.drop = static_cast<drop_case>(variant);
    s.slots = static_cast<slot_order>(variant % 2);
    s.masked = variant == 3;
    const auto cfg = make_config(60, 4, s);
    INFO(describe(s, 512, 60, 4));
    const auto g = make_gating(cfg, 512, 40 + variant, s.masked);
    const auto ref = reference::dispatch(cfg, g);
    gpu_dispatch gpu(cfg, g, s.masked);
    REQUIRE(gpu.run().ok());
    const auto first = gpu.download();
    require_matches(first, ref);
    // dirty the outputs, run again
    gpu.expert.fill_bytes(0xFF);
    gpu.weight.fill_bytes(0xFF);
    gpu.load.fill_bytes(0xFF);
    REQUIRE(gpu.run().ok());
    require_bitwise(gpu.download(), first);

    // capture into a graph, replay twice
    cudaStream_t stream;
    cuda::throw_if_cuda_error(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    capture_and_replay(
        stream, [&](cudaStream_t s) { return gpu.run(s); },
        [&] {
          gpu.slot.fill_bytes(0xFF);
          gpu.totals.fill_bytes(0xFF);
        },
        [&] { require_bitwise(gpu.download(), first); });
    cudaStreamDestroy(stream);
  }
}

}  // namespace moeroute::test
