// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the expert-parallel plan over the loopback transport (one std::thread per
// rank). Each input decodes a scenario — R = 1..4 ranks, a routing config from the dispatch
// grid (every priority, drop policy, slot order, capacity mode), options (every capacity scope,
// worst-case and budget bounds, overflow policy, receive layout, block size), a placement
// (contiguous, round robin, a reversed table or a random one, where ranks may own nothing),
// tokens per rank (0 allowed), padding and a hot expert — and, one input in four, a hostile
// rank: one rank passes different options, hidden size, element size or config.
// Checked (a violation is __builtin_trap, which libFuzzer saves as a crash):
//   - an error on any rank is the same error on every rank (never a hang, never a mix);
//   - otherwise every rank's plan has the same group counts (send matrix, rows per source and
//     expert, expert rows, required rows, drops per rank), rank s's send rows to d equal rank
//     d's receive rows from s, every held assignment has a send row carrying its token and no
//     other has one, and simulate_plan (no communication) gives every rank's plan;
//   - where one device defines the answer (every scope but a budget that dropped rows), the
//     whole layer — decisions, slots, global-scope drops, outputs and gradients — equals the
//     single-device reference (tests/common/ep_oracle.hpp, the bodies ep_tests runs).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <moeroute/ep.hpp>
#include <moeroute/reference.hpp>

#include "../common/dispatch_cases.hpp"
#include "../common/ep_oracle.hpp"
#include "fuzz_input.hpp"

namespace {

namespace ep = moeroute::ep;
using namespace moeroute;
using test::ep_oracle::scenario;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_ep_plan: %s\n", what.c_str());
  __builtin_trap();
}

/// How a hostile rank differs from the others.
enum class hostile : int { none, options, hidden, element_bytes, config, count };

struct decoded {
  scenario s;
  std::int32_t ranks = 1;
  hostile odd = hostile::none;
  std::int32_t odd_rank = 0;
};

decoded decode_scenario(fuzz::byte_reader& in) {
  decoded d;
  scenario& s = d.s;
  d.ranks = static_cast<std::int32_t>(in.range(1, 4));
  const auto E = static_cast<std::int32_t>(in.range(1, 12));
  const auto k = static_cast<std::int32_t>(in.range(1, E < 3 ? E : 3));
  s.cfg = test::make_config(E, k, test::spec_for(static_cast<int>(in.range(0, 209))));
  s.opt.scope = static_cast<ep::capacity_scope>(in.range(0, 4));
  s.opt.worst_case_tokens = in.range(0, 24);
  s.opt.receive_budget = in.range(-1, 48);
  s.opt.overflow = in.flag() ? ep::overflow_policy::drop_tail : ep::overflow_policy::error;
  s.opt.receive_layout = in.flag() ? layout_kind::padded : layout_kind::compact;
  s.opt.block_size = in.range(0, 7) < 6 ? 1 : in.range(1, 4);
  s.opt.check_ranks = true;
  static const char* const placements[] = {"contiguous", "round_robin", "reversed", "random"};
  s.placement = placements[in.range(0, 3)];
  s.tokens.clear();
  for (std::int32_t r = 0; r < d.ranks; ++r) s.tokens.push_back(in.range(0, 20));
  s.hidden = in.range(1, 5);
  s.seed = in.u64();
  s.hot_expert = static_cast<std::int32_t>(in.range(-1, E - 1));
  s.padding_every = static_cast<std::int32_t>(in.range(0, 4));
  if (d.ranks > 1 && in.range(0, 3) == 0) {
    d.odd = static_cast<hostile>(in.range(1, static_cast<int>(hostile::count) - 1));
    d.odd_rank = static_cast<std::int32_t>(in.range(0, d.ranks - 1));
  }
  s.name = "fuzz";
  return d;
}

/// One rank's outcome: its plan, or the error it threw.
struct outcome {
  bool ok = false;
  std::string error;
  ep::plan p;
  ep::local_dispatch_output layout;
};

template <class V>
void same(const V& a, const V& b, const std::string& what) {
  if (a != b) fail(what);
}

void check_plans(const decoded& d, const std::vector<outcome>& out) {
  const std::int32_t R = d.ranks;
  const routing_config& cfg = d.s.cfg;
  const std::int32_t k = cfg.top_k;
  const ep::plan& p0 = out[0].p;
  std::vector<ep::local_dispatch_output> layouts;
  for (const auto& o : out) layouts.push_back(o.layout);
  const auto place = test::ep_oracle::make_placement(d.s, R);
  for (std::int32_t r = 0; r < R; ++r) {
    const ep::plan& p = out[r].p;
    const std::string at = "rank " + std::to_string(r) + ": ";
    same(p.send_matrix, p0.send_matrix, at + "send_matrix differs from rank 0's");
    same(p.source_expert_rows, p0.source_expert_rows, at + "source_expert_rows differ");
    same(p.expert_rows, p0.expert_rows, at + "expert_rows differ");
    same(p.required_rows, p0.required_rows, at + "required_rows differ");
    same(p.dropped_by_rank, p0.dropped_by_rank, at + "dropped_by_rank differs");
    same(p.global_tokens, p0.global_tokens, at + "global_tokens differs");
    for (std::int32_t q = 0; q < R; ++q) {
      if (p.send_rows[q] != p.send_matrix[r * R + q]) fail(at + "send_rows != send_matrix row");
      if (out[q].p.recv_rows[r] != p.send_rows[q])
        fail(at + "sends " + std::to_string(p.send_rows[q]) + " rows to rank " + std::to_string(q) +
             ", which receives " + std::to_string(out[q].p.recv_rows[r]));
    }
    // every assignment: a held one has a send row carrying its token, the others none
    std::int64_t dropped = 0;
    for (std::int64_t t = 0; t < p.tokens; ++t)
      for (std::int32_t j = 0; j < k; ++j) {
        const auto a = static_cast<std::size_t>(t * k + j);
        const fate f = p.decision.fates[a];
        const std::int64_t row = p.assignment_row[a];
        dropped += f == fate::dropped ? 1 : 0;
        if (holds_row(f) != (row >= 0))
          fail(at + "assignment " + std::to_string(a) + ": row vs fate");
        if (row >= p.send_total()) fail(at + "assignment row past the send rows");
        if (row >= 0 && p.send_token[static_cast<std::size_t>(row)] != t)
          fail(at + "send row " + std::to_string(row) + " carries another token");
      }
    if (dropped != p.dropped_by_rank[r]) fail(at + "dropped_by_rank != its dropped fates");
    // the same plan without communication
    const ep::plan sim = ep::simulate_plan(cfg, place, d.s.opt, layouts, r, d.s.hidden, 4);
    same(sim.send_matrix, p.send_matrix, at + "simulate_plan send_matrix");
    same(sim.decision.fates, p.decision.fates, at + "simulate_plan fates");
    same(sim.decision.slot, p.decision.slot, at + "simulate_plan slots");
    same(sim.assignment_row, p.assignment_row, at + "simulate_plan assignment rows");
    same(sim.segment_offsets, p.segment_offsets, at + "simulate_plan segment offsets");
    same(sim.receive_rows, p.receive_rows, at + "simulate_plan receive rows");
  }
}

void run(const decoded& d) {
  const std::int32_t R = d.ranks;
  std::vector<outcome> out(static_cast<std::size_t>(R));
  std::vector<std::vector<std::string>> layer_failures(static_cast<std::size_t>(R));
  ep::loopback_group(R).run([&](ep::transport& t) {
    const std::int32_t me = t.rank();
    outcome& o = out[static_cast<std::size_t>(me)];
    scenario s = d.s;
    std::int64_t hidden = s.hidden;
    std::size_t element_bytes = 4;
    if (me == d.odd_rank) switch (d.odd) {
        case hostile::options:
          s.opt.block_size += 1;
          break;
        case hostile::hidden:
          hidden += 1;
          break;
        case hostile::element_bytes:
          element_bytes = 3;
          break;
        case hostile::config:
          s.cfg.capacity.factor += 0.5;
          break;
        default:
          break;
      }
    try {
      const auto rr = test::ep_oracle::route_rank(s, R, me);
      o.layout = rr.layout;
      o.p = ep::make_plan(t, s.cfg, rr.place, s.opt, rr.layout, hidden, element_bytes);
      o.ok = true;
    } catch (const moeroute::error& e) {
      o.error = e.what();
    }
  });
  std::int32_t failed = 0;
  for (const auto& o : out) failed += o.ok ? 0 : 1;
  if (failed > 0) {
    if (failed != R)
      fail(std::to_string(failed) + " of " + std::to_string(R) +
           " ranks threw: " + out[out[0].ok ? 1 : 0].error);
    for (std::int32_t r = 1; r < R; ++r)
      if (out[r].error != out[0].error)
        fail("rank " + std::to_string(r) + " threw '" + out[r].error + "', rank 0 '" +
             out[0].error + "'");
    return;
  }
  if (d.odd != hostile::none) fail("a hostile rank was not rejected");
  check_plans(d, out);
  std::int64_t dropped = 0;
  for (const auto v : out[0].p.dropped_by_rank) dropped += v;
  if ((d.s.opt.scope == ep::capacity_scope::destination_budget && dropped > 0))
    return;  // no single-device answer: a budget's tail drops depend on the rank split
  ep::loopback_group(R).run([&](ep::transport& t) {
    layer_failures[static_cast<std::size_t>(t.rank())] = test::ep_oracle::run_layer<float>(t, d.s);
  });
  for (const auto& f : layer_failures)
    if (!f.empty()) fail(f.front());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::byte_reader in(data, size);
  const decoded d = decode_scenario(in);
  if (!validate(d.s.cfg)) return 0;  // configs themselves: fuzz_route's job
  run(d);
  return 0;
}
