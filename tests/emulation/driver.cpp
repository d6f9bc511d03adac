// SPDX-License-Identifier: Apache-2.0
// CPU emulation of the dispatch / layout / permute / combine launchers against the CPU
// reference (see README.md). Every case: GPU-path outputs bit-identical to the reference.
#include <emu_shim.hpp>
#include <cstdio>
#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/cuda/permute.cuh>
#include <moeroute/cuda/combine.cuh>
#include <moeroute/reference.hpp>
#include "dispatch_cases.hpp"
#include "dispatch_golden.hpp"
using namespace moeroute;
using namespace moeroute::test;
static int failures = 0, runs = 0;
#define EXPECT(c, ...) do { if (!(c)) { ++failures; std::printf("FAIL %s: ", ctx.c_str()); std::printf(__VA_ARGS__); std::printf("\n"); return false; } } while (0)
template <class A, class B> bool same(const std::string& ctx, const char* what, const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT(a.size() == b.size(), "%s size %zu vs %zu", what, a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT((long long)a[i] == (long long)b[i], "%s[%zu] got %lld want %lld", what, i, (long long)a[i], (long long)b[i]);
  return true;
}
struct out_t { std::vector<int32_t> expert, slot; std::vector<float> weight; std::vector<uint8_t> fate;
  std::vector<int64_t> requested, kept, rerouted, dropped, received, load; cuda::dispatch_totals totals{}; };
static bool run_case(const routing_config& cfg, const reference::gating_output& g, bool pass_valid, const std::string& ctx, out_t* keep = nullptr) {
  ++runs;
  const int64_t n = g.tokens * cfg.top_k; const int E = cfg.num_experts, ET = cfg.total_experts();
  out_t o; o.expert.assign(n, 77); o.slot.assign(n, 77); o.weight.assign(n, 77); o.fate.assign(n, 77);
  o.requested.assign(E, 77); o.kept.assign(E, 77); o.rerouted.assign(E, 77); o.dropped.assign(E, 77); o.received.assign(ET, 77); o.load.assign(ET, 77);
  std::vector<unsigned char> ws(cuda::dispatch_workspace_bytes(cfg, g.tokens) + 1);
  auto* base = ws.data() + ((256 - reinterpret_cast<uintptr_t>(ws.data()) % 256) % 256);
  std::vector<unsigned char> ws2(ws.size() + 256); base = ws2.data() + ((256 - reinterpret_cast<uintptr_t>(ws2.data()) % 256) % 256);
  std::memset(base, 0xCD, ws.size() - 1);
  cuda::dispatch_params p; p.config = cfg; p.tokens = g.tokens; p.reroute_candidates = g.reroute_candidates;
  p.d_ids = g.ids.data(); p.d_gates = g.gates.data(); p.d_reroute_ids = g.reroute_ids.data(); p.d_valid = pass_valid ? g.valid.data() : nullptr;
  p.d_expert = o.expert.data(); p.d_slot = o.slot.data(); p.d_weight = o.weight.data(); p.d_fate = o.fate.data();
  p.d_requested = o.requested.data(); p.d_kept = o.kept.data(); p.d_rerouted = o.rerouted.data(); p.d_dropped = o.dropped.data();
  p.d_received = o.received.data(); p.d_load = o.load.data(); p.d_totals = &o.totals;
  auto st = cuda::dispatch(p, base, ws.size() - 1);
  EXPECT(st.ok(), "status %s", st.message.c_str());
  if (g.tokens == 0) return true;
  const auto r = reference::dispatch(cfg, g);
  if (!same(ctx, "expert", o.expert, r.expert) || !same(ctx, "slot", o.slot, r.slot) || !same(ctx, "fate", o.fate, r.fates) ||
      !same(ctx, "requested", o.requested, r.requested) || !same(ctx, "kept", o.kept, r.kept) || !same(ctx, "rerouted", o.rerouted, r.rerouted) ||
      !same(ctx, "dropped", o.dropped, r.dropped) || !same(ctx, "received", o.received, r.received) || !same(ctx, "load", o.load, r.load)) return false;
  EXPECT(o.totals.capacity == r.capacity && o.totals.fallback_capacity == r.fallback_capacity && o.totals.kept == r.total_kept &&
         o.totals.rerouted == r.total_rerouted && o.totals.dropped == r.total_dropped && o.totals.masked == r.total_masked &&
         o.totals.reroute_rounds == r.reroute_rounds, "totals cap %lld/%lld rounds %lld/%lld masked %lld/%lld", (long long)o.totals.capacity, (long long)r.capacity,
         (long long)o.totals.reroute_rounds, (long long)r.reroute_rounds, (long long)o.totals.masked, (long long)r.total_masked);
  for (int64_t a = 0; a < n; ++a) EXPECT(std::memcmp(&o.weight[a], &r.weight[a], 4) == 0, "weight[%lld] %g vs %g", (long long)a, o.weight[a], r.weight[a]);
  // layouts
  for (int kind = 0; kind < 3; ++kind) {
    if (kind == 0 && cfg.capacity.mode == capacity_mode::unbounded) continue;
    const int64_t block = kind == 2 ? 16 : 1;
    const auto L = kind == 0 ? reference::padded_layout(r) : reference::compact_layout(r, block);
    cuda::layout_params lp; lp.kind = kind == 0 ? cuda::layout_kind::padded : cuda::layout_kind::compact; lp.block_size = block;
    lp.tokens = g.tokens; lp.k = cfg.top_k; lp.experts = E; lp.total_experts = ET;
    lp.max_rows = cuda::layout_max_rows(cfg, g.tokens, lp.kind, block) + (kind == 2 ? 5 : 0);
    std::vector<int64_t> offsets(ET + 1, 9), used(ET, 9), arow(n, 9), nrows(1, 9); std::vector<int32_t> rtok(lp.max_rows, 9), bexp(lp.max_rows / block, 9);
    lp.d_expert = o.expert.data(); lp.d_slot = o.slot.data(); lp.d_load = o.load.data(); lp.d_totals = &o.totals;
    lp.d_offsets = offsets.data(); lp.d_rows_used = used.data(); lp.d_row_token = rtok.data(); lp.d_assignment_row = arow.data();
    lp.d_block_expert = kind == 2 ? bexp.data() : nullptr; lp.d_num_rows = nrows.data();
    auto ls = cuda::build_layout(lp, cfg);
    EXPECT(ls.ok(), "layout status %s", ls.message.c_str());
    EXPECT(nrows[0] == L.num_rows, "num_rows %lld vs %lld", (long long)nrows[0], (long long)L.num_rows);
    if (!same(ctx, "offsets", offsets, L.offsets) || !same(ctx, "rows_used", used, L.rows_used) || !same(ctx, "assignment_row", arow, L.assignment_row)) return false;
    std::vector<int32_t> rt(rtok.begin(), rtok.begin() + L.num_rows);
    if (!same(ctx, "row_token", rt, L.row_token)) return false;
    for (int64_t i = L.num_rows; i < lp.max_rows; ++i) EXPECT(rtok[i] == -1, "row_token tail");
    if (kind == 2) {
      std::vector<int32_t> be(bexp.begin(), bexp.begin() + L.block_expert.size());
      if (!same(ctx, "block_expert", be, L.block_expert)) return false;
      for (size_t i = L.block_expert.size(); i < bexp.size(); ++i) EXPECT(bexp[i] == -1, "block_expert tail");
    }
    // permute + combine (f32 and f16), d = 8 (vector) and d = 3 (scalar)
    for (int64_t d : {int64_t{8}, int64_t{3}}) {
      std::vector<float> x(g.tokens * d); lcg rr(d * 31 + kind);
      for (auto& v : x) v = rr.uniform(-1, 1);
      std::vector<float> buf(lp.max_rows * d, 123.0f), ref_buf(L.num_rows * d);
      reference::permute<float>(L, x, g.tokens, d, ref_buf);
      cuda::permute_params<float> pp; pp.d_x = x.data(); pp.tokens = g.tokens; pp.hidden = d; pp.d_row_token = rtok.data(); pp.rows = lp.max_rows; pp.d_num_rows = nrows.data(); pp.d_out = buf.data();
      auto ps = cuda::permute(pp); EXPECT(ps.ok(), "permute %s", ps.message.c_str());
      for (int64_t i = 0; i < L.num_rows * d; ++i) EXPECT(std::memcmp(&buf[i], &ref_buf[i], 4) == 0, "permute[%lld]", (long long)i);
      for (int64_t i = L.num_rows * d; i < lp.max_rows * d; ++i) EXPECT(buf[i] == 123.0f, "permute tail touched");
      std::vector<float> eo(L.num_rows * d); for (auto& v : eo) v = rr.uniform(-2, 2);
      std::vector<float> y(g.tokens * d, 55.0f), ry(g.tokens * d);
      reference::combine<float>(cfg, r, L, eo, d, x, ry);
      cuda::combine_params<float> cp; cp.d_expert_out = eo.data(); cp.rows = L.num_rows; cp.d_assignment_row = arow.data(); cp.d_weight = o.weight.data();
      cp.d_fate = o.fate.data(); cp.d_x = x.data(); cp.tokens = g.tokens; cp.k = cfg.top_k; cp.hidden = d; cp.dropped = cfg.dispatch.dropped; cp.d_y = y.data();
      auto cs = cuda::combine(cp); EXPECT(cs.ok(), "combine %s", cs.message.c_str());
      for (int64_t i = 0; i < g.tokens * d; ++i) EXPECT(std::memcmp(&y[i], &ry[i], 4) == 0, "combine[%lld] %g vs %g", (long long)i, y[i], ry[i]);
      // half
      std::vector<__half> xh(x.size()), eoh(eo.size()), bh(lp.max_rows * d), yh(y.size());
      std::vector<half_bits> xr(x.size()), eor(eo.size()), yr(y.size());
      for (size_t i = 0; i < x.size(); ++i) { xh[i] = __float2half_rn(x[i]); std::memcpy(&xr[i], &xh[i], 2); }
      for (size_t i = 0; i < eo.size(); ++i) { eoh[i] = __float2half_rn(eo[i]); std::memcpy(&eor[i], &eoh[i], 2); }
      reference::combine<half_bits>(cfg, r, L, eor, d, xr, yr);
      cuda::combine_params<__half> ch; ch.d_expert_out = eoh.data(); ch.rows = L.num_rows; ch.d_assignment_row = arow.data(); ch.d_weight = o.weight.data();
      ch.d_fate = o.fate.data(); ch.d_x = xh.data(); ch.tokens = g.tokens; ch.k = cfg.top_k; ch.hidden = d; ch.dropped = cfg.dispatch.dropped; ch.d_y = yh.data();
      EXPECT(cuda::combine(ch).ok(), "combine half");
      for (size_t i = 0; i < y.size(); ++i) EXPECT(std::memcmp(&yh[i], &yr[i], 2) == 0, "combine half[%zu]", i);
    }
  }
  if (keep) *keep = o;
  return true;
}
int main(int argc, char** argv) {
  // argv[1]: golden directory; argv[2] (any value): run threads and blocks in reverse order
  const std::string golden_dir = argc > 1 ? argv[1] : "tests/data/golden";
  emu_reverse = argc > 2;
  struct shape { int64_t T; int E, k; };
  const shape shapes[] = {{7, 6, 2}, {96, 60, 4}, {300, 8, 8}, {1000, 64, 1}, {1, 1, 1}, {50, 6, 6}, {0, 6, 2}};
  uint64_t seed = 1;
  for (auto sh : shapes) for (int prio = 0; prio < 4; ++prio) for (int drop = 0; drop < (int)drop_case::count; ++drop)
    for (int slots = 0; slots < 2; ++slots) for (int cap = 0; cap < (int)cap_case::count; ++cap) for (int m = 0; m < 2; ++m) {
      case_spec s; s.prio = (priority)prio; s.drop = (drop_case)drop; s.slots = (slot_order)slots; s.cap = (cap_case)cap; s.masked = m; s.after_drop = (drop + slots + m) % 2 == 0;
      auto cfg = make_config(sh.E, sh.k, s);
      auto g = make_gating(cfg, sh.T, seed++, s.masked);
      if (!run_case(cfg, g, s.masked, describe(s, sh.T, sh.E, sh.k)) && failures > 20) return 1;
    }
  int i = 0;
  for (int64_t T : {1, 7, 1000, 4000}) for (int E : {1, 6, 8, 60, 64, 128, 256, 384}) {
    std::vector<int> ks; for (int k : {1, 2, 4, 8, E}) if (k <= E && std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
    for (int k : ks) { if (T * k > (1 << 17)) continue; auto s = spec_for(i); auto cfg = make_config(E, k, s); auto g = make_gating(cfg, T, 1000 + i, s.masked);
      run_case(cfg, g, s.masked, describe(s, T, E, k)); ++i; if (failures > 20) return 1; }
  }
  int64_t skipped = 0; int golden = 0;
  for (auto& gc : load_golden_cases(golden_dir, &skipped)) {
    auto gat = reference::gate<float>(gc.cfg, std::span<const float>(gc.logits), gc.tokens, std::span<const float>(gc.bias));
    run_case(gc.cfg, gat, false, gc.file + " " + gc.name); ++golden;
  }
  std::printf("%d runs (%d golden), %d failures\n", runs, golden, failures);
  return failures != 0;
}
