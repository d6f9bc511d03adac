// SPDX-License-Identifier: Apache-2.0
// The gating plan (gating_plan.hpp) and the CUDA workspace size (gating_workspace.hpp) are pure
// C++: checked here without a GPU. The chunks must cover every token exactly once, in order, never
// straddle a sequence, and the register kernels must hold a whole row (lanes * slots >= E).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/cuda/gating_workspace.hpp>
#include <moeroute/gating_plan.hpp>
#include <moeroute/workspace.hpp>

using namespace moeroute;

TEST_CASE("gating plan: chunks tile the batch and respect sequences", "[gating][plan]") {
  for (std::int32_t E : {1, 6, 8, 9, 16, 17, 60, 64, 128, 256, 384, 512, 513, 600, 8192}) {
    for (std::int64_t T : {0, 1, 7, 64, 1000, 1024, 1025, 16384, 100000}) {
      for (std::int64_t L : {0, 1, 7, 8, 100, 1000}) {
        if (L > 0 && (T % L != 0)) continue;
        routing_config cfg;
        cfg.num_experts = E;
        cfg.top_k = 1;
        cfg.loss.sequence_length = L;
        REQUIRE(validate(cfg).ok());
        const auto p = make_gating_plan(cfg, T);
        INFO("E=" << E << " T=" << T << " L=" << L);
        if (E <= gating_warp_max_experts) {
          REQUIRE_FALSE(p.generic);
          REQUIRE(std::int64_t{p.lanes} * p.values_per_lane >= E);
          REQUIRE(p.values_per_lane <= 16);
          REQUIRE((p.lanes == 8 || p.lanes == 16 || p.lanes == 32));
        } else {
          REQUIRE(p.generic);
          REQUIRE(std::int64_t{32} * p.values_per_lane >= E);
        }
        if (T == 0) {
          REQUIRE(p.chunks == 0);
          REQUIRE(cuda::gating_workspace_bytes(cfg, T) == 0);
          continue;
        }
        REQUIRE(p.chunks == p.segments * p.pieces);
        REQUIRE(p.segments * p.segment_tokens == T);
        REQUIRE(p.chunks <= gating_target_chunks + p.segments);
        std::int64_t next = 0;
        for (std::int64_t c = 0; c < p.chunks; ++c) {
          std::int64_t b = 0, e = 0;
          gating_chunk_range(p.segment_tokens, p.pieces, p.piece_tokens, c, b, e);
          REQUIRE(b == next);  // in order, no gap, no overlap
          REQUIRE(e >= b);
          REQUIRE(e - b <= p.piece_tokens);
          if (L > 0) REQUIRE((e == b || b / L == (e - 1) / L));  // inside one sequence
          next = e;
        }
        REQUIRE(next == T);

        // workspace = the carved layout, 256-byte aligned sub-buffers
        const auto n = static_cast<std::size_t>(p.chunks), ne = n * static_cast<std::size_t>(E);
        const std::size_t expect = align_up(ne * 8) + align_up(ne * 4) + 3 * align_up(n * 8);
        REQUIRE(cuda::gating_workspace_bytes(cfg, T) == expect);
      }
    }
  }
}

TEST_CASE("gating plan: the workspace size is a function of E, T and sequence_length only",
          "[gating][plan]") {
  routing_config a;
  a.num_experts = 64;
  a.top_k = 2;
  routing_config b = a;
  b.top_k = 8;
  b.gating.score = score_function::sigmoid;
  b.gating.select = select_from::scores;
  b.dispatch.dropped = drop_policy::next_choice;
  REQUIRE(cuda::gating_workspace_bytes(a, 4096) == cuda::gating_workspace_bytes(b, 4096));
  REQUIRE(cuda::gating_workspace_bytes(a, 4096) > 0);
  routing_config s = a;
  s.loss.sequence_length = 4;  // 1024 sequences of 4 tokens: one chunk each
  const auto p = make_gating_plan(s, 4096);
  REQUIRE(p.segments == 1024);
  REQUIRE(p.pieces == 1);
  REQUIRE(p.piece_tokens == 4);
}
