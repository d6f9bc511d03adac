// SPDX-License-Identifier: Apache-2.0
// The expert-parallel oracle and test bodies, shared by the loopback tests (threads, Catch2)
// and the MPI harness (processes under mpiexec). Every rank builds the same global batch from
// one seed, routes it with the single-device reference, and slices its own expected result:
// the oracle does no communication. A body returns its failures as text (Catch2's macros are
// not thread-safe), and the caller asserts that the list is empty.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <moeroute/ep.hpp>
#include <moeroute/reference.hpp>

namespace moeroute::test::ep_oracle {

namespace ep = moeroute::ep;

/// One multi-rank scenario.
struct scenario {
  std::string name;
  routing_config cfg;
  ep::options opt;
  std::vector<std::int64_t> tokens;      ///< [R] tokens per rank (0 allowed)
  std::string placement = "contiguous";  ///< contiguous | round_robin | reversed | random (tables)
  std::int64_t hidden = 6;
  std::uint64_t seed = 1;
  std::int32_t hot_expert = -1;    ///< this expert's logits raised: a hot expert (and rank)
  std::int32_t padding_every = 0;  ///< every n-th global token is padding (valid = 0)
};

/// splitmix64: the same numbers on every rank and platform.
inline std::uint64_t mix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline ep::placement make_placement(const scenario& s, std::int32_t R) {
  const std::int32_t E = s.cfg.num_experts;
  if (s.placement == "round_robin") return ep::placement::round_robin(E, R);
  if (s.placement == "reversed") {  // a table: rank r owns a block, experts listed backwards
    std::vector<std::vector<std::int32_t>> t(R);
    for (std::int32_t e = E - 1; e >= 0; --e) t[(E - 1 - e) % R].push_back(e);
    return ep::placement::from_table(E, std::move(t));
  }
  if (s.placement == "random") {  // each expert on a rank drawn from the seed; some may own none
    std::vector<std::vector<std::int32_t>> t(R);
    std::uint64_t st = s.seed ^ 0x51ac3d;
    for (std::int32_t e = 0; e < E; ++e) t[mix(st) % static_cast<std::uint64_t>(R)].push_back(e);
    return ep::placement::from_table(E, std::move(t));
  }
  return ep::placement::contiguous(E, R);
}

inline float uniform(std::uint64_t& s) {  // in [-1, 1), a multiple of 2^-12 (exact in bf16)
  return static_cast<float>(static_cast<std::int64_t>(mix(s) >> 52) - 2048) / 2048.0f;
}

/// The global batch every rank builds: logits [T, E], valid [T], x and dy [T, d].
struct batch {
  std::int64_t tokens = 0;
  std::vector<float> logits;
  std::vector<std::uint8_t> valid;
  std::vector<float> x, dy;
  std::vector<std::int64_t> first;  ///< [R + 1] first global token of each rank
};

inline batch make_batch(const scenario& s) {
  batch b;
  const std::int32_t E = s.cfg.num_experts;
  b.first.assign(s.tokens.size() + 1, 0);
  for (std::size_t r = 0; r < s.tokens.size(); ++r) b.first[r + 1] = b.first[r] + s.tokens[r];
  b.tokens = b.first.back();
  std::uint64_t st = s.seed;
  b.logits.resize(b.tokens * E);
  for (auto& v : b.logits) v = 2.0f * uniform(st);
  if (s.hot_expert >= 0)
    for (std::int64_t t = 0; t < b.tokens; ++t) b.logits[t * E + s.hot_expert] += 3.0f;
  b.valid.assign(b.tokens, 1);
  if (s.padding_every > 0)
    for (std::int64_t t = s.padding_every - 1; t < b.tokens; t += s.padding_every) b.valid[t] = 0;
  b.x.resize(b.tokens * s.hidden);
  for (auto& v : b.x) v = uniform(st);
  b.dy.resize(b.tokens * s.hidden);
  for (auto& v : b.dy) v = uniform(st);
  return b;
}

/// One rank's share of a scenario: the global batch, the placement, its token range, its own
/// routing (reference gating of its slice) and its ep::local_dispatch.
struct rank_routing {
  batch b;
  ep::placement place = ep::placement::contiguous(1, 1);
  std::int64_t t0 = 0, n = 0;  ///< first global token, tokens on this rank
  reference::gating_output g;
  ep::local_dispatch_output layout;
};
inline rank_routing route_rank(const scenario& s, std::int32_t R, std::int32_t me) {
  rank_routing rr;
  rr.b = make_batch(s);
  rr.place = make_placement(s, R);
  rr.t0 = rr.b.first[me];
  rr.n = rr.b.first[me + 1] - rr.t0;
  const std::int32_t E = s.cfg.num_experts;
  std::vector<float> logits(rr.b.logits.begin() + rr.t0 * E,
                            rr.b.logits.begin() + (rr.t0 + rr.n) * E);
  std::vector<std::uint8_t> valid(rr.b.valid.begin() + rr.t0, rr.b.valid.begin() + rr.t0 + rr.n);
  rr.g = reference::gating(s.cfg, logits, rr.n, {}, valid);
  rr.layout = ep::local_dispatch(s.cfg, rr.place, s.opt, me, rr.g);
  return rr;
}

/// The row-wise test expert: out = x * (1 + e / 8), the gradient d in = d out * (1 + e / 8).
inline float expert_scale(std::int32_t e) { return 1.0f + static_cast<float>(e) / 8.0f; }

template <class T>
std::vector<T> convert(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = from_float<T>(v[i]);
  return out;
}

/// Rows of a buffer through the test expert, segment by segment: out[r] = f_e(in[r]).
template <class T>
void run_experts(const std::vector<std::int64_t>& offsets, const std::vector<std::int32_t>& expert,
                 const std::vector<T>& in, std::int64_t d, std::vector<T>& out) {
  out.assign(in.size(), T{});
  for (std::size_t l = 0; l + 1 < offsets.size(); ++l)
    for (std::int64_t r = offsets[l]; r < offsets[l + 1]; ++r)
      for (std::int64_t c = 0; c < d; ++c)
        out[r * d + c] = from_float<T>(to_float(in[r * d + c]) * expert_scale(expert[l]));
}

/// What one device computes for a batch [t0, t1) of the global batch.
template <class T>
struct expected {
  reference::dispatch_output dsp;
  std::vector<T> y, d_x;
  std::vector<float> d_weight;
};

/// The single-device run of tokens [t0, t1): gating, dispatch, compact layout, permute, the
/// test experts, combine; and the backward (combine_backward, expert, permute_backward).
template <class T>
expected<T> single_device(const routing_config& cfg, const batch& b, std::int64_t t0,
                          std::int64_t t1, std::int64_t d) {
  const std::int32_t E = cfg.num_experts;
  const std::int64_t n = t1 - t0;
  std::vector<float> logits(b.logits.begin() + t0 * E, b.logits.begin() + t1 * E);
  std::vector<std::uint8_t> valid(b.valid.begin() + t0, b.valid.begin() + t1);
  const auto g = reference::gating(cfg, logits, n, {}, valid);
  expected<T> out;
  out.dsp = reference::dispatch(cfg, g);
  const auto L = reference::layout(cfg, out.dsp, layout_kind::compact, 1);
  const auto x = convert<T>(std::vector<float>(b.x.begin() + t0 * d, b.x.begin() + t1 * d));
  const auto dy = convert<T>(std::vector<float>(b.dy.begin() + t0 * d, b.dy.begin() + t1 * d));
  std::vector<T> buf(L.num_rows * d), eo;
  reference::permute<T>(cfg, L, x, n, d, buf);
  std::vector<std::int32_t> seg_expert(L.total_experts);
  for (std::int32_t e = 0; e < L.total_experts; ++e) seg_expert[e] = e;
  run_experts(L.offsets, seg_expert, buf, d, eo);
  out.y.assign(n * d, T{});
  reference::combine<T>(cfg, L, out.dsp, eo, d, x, out.y);
  std::vector<T> d_eo(L.num_rows * d), d_buf;
  out.d_weight.assign(n * cfg.top_k, 0.0f);
  out.d_x.assign(n * d, T{});
  if constexpr (!std::is_same_v<T, double>) {
    reference::combine_backward<T>(cfg, L, out.dsp, eo, d, dy, d_eo, out.d_weight, out.d_x);
    run_experts(L.offsets, seg_expert, d_eo, d, d_buf);
    reference::permute_backward<T>(cfg, L, out.dsp, d_buf, d, out.d_x, true);
  }
  return out;
}

/// Collects failures with context.
struct report {
  std::vector<std::string> failures;
  std::string where;
  void fail(const std::string& m) {
    if (failures.size() < 8) failures.push_back(where + ": " + m);
  }
  template <class A, class B>
  void equal(const char* what, const A& got, const B& want) {
    if (got.size() != want.size()) {
      fail(std::string(what) + ": size " + std::to_string(got.size()) + " vs " +
           std::to_string(want.size()));
      return;
    }
    for (std::size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(got[i])) != 0) {
        fail(std::string(what) + ": first difference at element " + std::to_string(i));
        return;
      }
  }
};

/// The scope's single-device equivalent: what routing each rank's slice should reproduce.
inline routing_config oracle_config(const scenario& s) {
  routing_config c = s.cfg;
  if (s.opt.scope == ep::capacity_scope::dropless ||
      s.opt.scope == ep::capacity_scope::dropless_worst_case ||
      s.opt.scope == ep::capacity_scope::destination_budget)
    c.capacity.mode = capacity_mode::unbounded;
  return c;
}

/// One rank's whole layer: layout, plan, dispatch, experts, combine, backward; checked against
/// the oracle. Runs on any transport (loopback thread or MPI process).
template <class T>
std::vector<std::string> run_layer(ep::transport& t, const scenario& s) {
  report rep;
  const std::int32_t R = t.ranks(), me = t.rank();
  rep.where = s.name + " R=" + std::to_string(R) + " rank " + std::to_string(me);
  const std::int64_t d = s.hidden;
  const rank_routing rr = route_rank(s, R, me);
  const batch& b = rr.b;
  const auto& place = rr.place;
  const std::int64_t t0 = rr.t0, n = rr.n, t1 = t0 + n;
  const std::int32_t k = s.cfg.top_k;

  // The oracle: the concatenated batch on one device (or this rank's batch, per_source), sliced.
  const routing_config ocfg = oracle_config(s);
  const bool own_batch = s.opt.scope == ep::capacity_scope::per_source;
  const auto want =
      own_batch ? single_device<T>(ocfg, b, t0, t1, d) : single_device<T>(ocfg, b, 0, b.tokens, d);
  const std::int64_t o0 = own_batch ? 0 : t0;  // where this rank's tokens start in the oracle

  // The expert-parallel layer.
  const auto& L = rr.layout;
  const ep::plan p = ep::make_plan(t, s.cfg, place, s.opt, L, d, sizeof(T));
  const auto x = convert<T>(std::vector<float>(b.x.begin() + t0 * d, b.x.begin() + t1 * d));
  const auto dy = convert<T>(std::vector<float>(b.dy.begin() + t0 * d, b.dy.begin() + t1 * d));
  std::vector<std::byte> ws(ep::workspace_bytes(p));
  std::vector<T> recv(p.receive_rows * d), eo, returned(p.send_total() * d), y(n * d);
  std::vector<ep::row_source> src(p.receive_rows);
  ep::dispatch<T>(t, p, x, recv, ws);
  ep::dispatch_sources(t, p, src, ws);
  run_experts(p.segment_offsets, p.segment_expert, recv, d, eo);
  ep::combine<T>(t, p, eo, x, returned, y, ws);

  // Routing decisions equal the oracle's for this rank's tokens.
  const auto slice = [&](const auto& v, std::int64_t per) {
    using V = typename std::decay_t<decltype(v)>::value_type;
    return std::vector<V>(v.begin() + o0 * per, v.begin() + (o0 + n) * per);
  };
  rep.equal("fates", p.decision.fates, slice(want.dsp.fates, k));
  rep.equal("weights", p.decision.weight, slice(want.dsp.weight, k));
  std::vector<std::int32_t> final_expert(p.decision.expert);
  rep.equal("final experts", final_expert, slice(want.dsp.expert, k));
  if (s.opt.scope == ep::capacity_scope::global || own_batch)
    rep.equal("slots", p.decision.slot, slice(want.dsp.slot, k));
  if (!own_batch) {
    // group counts: every routed expert receives what it holds on one device
    std::vector<std::int64_t> load(want.dsp.load.begin(),
                                   want.dsp.load.begin() + s.cfg.num_experts);
    rep.equal("expert_rows", p.expert_rows, load);
    if (p.dropped() != want.dsp.total_dropped)
      rep.fail("dropped " + std::to_string(p.dropped()) + " vs one device's " +
               std::to_string(want.dsp.total_dropped));
  }
  // per (source, expert) counts: this rank's row of them is its send total, and their column
  // sums are the rows each routed expert receives
  {
    const std::int64_t ET = s.cfg.total_experts();
    std::int64_t mine = 0;
    for (std::int64_t e = 0; e < ET; ++e) mine += p.source_expert_rows[me * ET + e];
    if (mine != p.send_total()) rep.fail("source_expert_rows row != rows sent");
    for (std::int32_t e = 0; e < s.cfg.num_experts; ++e) {
      std::int64_t col = 0;
      for (std::int32_t r = 0; r < R; ++r) col += p.source_expert_rows[r * ET + e];
      if (col != p.expert_rows[e]) rep.fail("source_expert_rows column != expert_rows");
    }
  }
  std::int64_t received = 0;
  for (std::int32_t s2 = 0; s2 < R; ++s2) received += p.send_matrix[s2 * R + me];
  if (received != p.recv_total()) rep.fail("send_matrix column != rows received");

  // The layer's output equals one device's, bit for bit.
  rep.equal("y", y, slice(want.y, d));

  // Provenance: rows within each segment in (source rank, token) order, carrying that
  // token's hidden state.
  const auto xs = convert<T>(b.x);
  for (std::int32_t l = 0; l < p.segments(); ++l) {
    std::int64_t prev = -1;
    for (std::int64_t r = p.segment_offsets[l]; r < p.segment_offsets[l + 1]; ++r) {
      const auto& so = src[r];
      if (so.rank < 0) continue;
      const std::int64_t gt = b.first[so.rank] + so.token;
      if (gt <= prev) rep.fail("segment " + std::to_string(l) + " rows out of (rank, token) order");
      prev = gt;
      if (std::memcmp(&recv[r * d], &xs[gt * d], d * sizeof(T)) != 0)
        rep.fail("received row " + std::to_string(r) + " is not its source token's x");
    }
  }

  // A reused plan and a fresh one give the same bits.
  {
    const ep::plan p2 = ep::make_plan(t, s.cfg, place, s.opt, L, d, sizeof(T));
    std::vector<T> recv2(p2.receive_rows * d), eo2, ret2(p2.send_total() * d), y2(n * d), y3(n * d);
    ep::dispatch<T>(t, p2, x, recv2, ws);
    run_experts(p2.segment_offsets, p2.segment_expert, recv2, d, eo2);
    ep::combine<T>(t, p2, eo2, x, ret2, y2, ws);
    ep::combine<T>(t, p, eo, x, ret2, y3, ws);
    rep.equal("rerun received", recv2, recv);
    rep.equal("rerun y (fresh plan)", y2, y);
    rep.equal("rerun y (reused plan)", y3, y);
  }

  // Backward: gradients equal one device's.
  if constexpr (!std::is_same_v<T, double>) {
    std::vector<T> d_eo(p.receive_rows * d), d_recv, d_x(n * d);
    std::vector<float> d_w(n * k);
    ep::combine_backward<T>(t, p, returned, dy, d_eo, d_w, d_x, ws);
    run_experts(p.segment_offsets, p.segment_expert, d_eo, d, d_recv);
    ep::dispatch_backward<T>(t, p, d_recv, d_x, ws, true);
    rep.equal("d_weight", d_w, slice(want.d_weight, k));
    rep.equal("d_x", d_x, slice(want.d_x, d));
  }
  return rep.failures;
}

/// Element-wise sums over ranks of a few doubles (every rank gets the same sums).
template <std::size_t N>
std::array<double, N> sum_over_ranks(ep::transport& t, const std::array<double, N>& mine) {
  std::vector<std::array<double, N>> all(static_cast<std::size_t>(t.ranks()));
  t.allgather(mine.data(), all.data(), sizeof mine);
  std::array<double, N> total{};
  for (const auto& a : all)
    for (std::size_t i = 0; i < N; ++i) total[i] += a[i];
  return total;
}

/// Adjointness in double: <dispatch(x), g> = <x, dispatch_backward(g)>, the inner products
/// summed over ranks.
inline std::vector<std::string> run_adjoint(ep::transport& t, const scenario& s) {
  report rep;
  const std::int32_t R = t.ranks(), me = t.rank();
  rep.where = s.name + " adjoint R=" + std::to_string(R) + " rank " + std::to_string(me);
  const std::int64_t d = s.hidden;
  const rank_routing rr = route_rank(s, R, me);
  const std::int64_t n = rr.n;
  const ep::plan p = ep::make_plan(t, s.cfg, rr.place, s.opt, rr.layout, d, sizeof(double));
  std::vector<std::byte> ws(ep::workspace_bytes(p));
  std::uint64_t st = s.seed * 77 + static_cast<std::uint64_t>(me);
  std::vector<double> x(n * d), gr(p.receive_rows * d), recv(p.receive_rows * d), dx(n * d);
  for (auto& v : x) v = uniform(st) + uniform(st) / 4096.0;
  for (auto& v : gr) v = uniform(st) + uniform(st) / 4096.0;
  ep::dispatch<double>(t, p, x, recv, ws);
  ep::dispatch_backward<double>(t, p, gr, dx, ws);
  // padding rows of the receive layout are not images of x: zero their gradient's share
  for (std::int64_t r = 0; r < p.receive_rows; ++r) {
    bool used = false;
    for (std::int32_t l = 0; l < p.segments(); ++l)
      used = used || (r >= p.segment_offsets[l] && r < p.segment_offsets[l] + p.segment_used[l]);
    if (!used)
      for (std::int64_t c = 0; c < d; ++c) gr[r * d + c] = 0.0;
  }
  double lhs = 0.0, rhs = 0.0;
  for (std::size_t i = 0; i < recv.size(); ++i) lhs += recv[i] * gr[i];
  for (std::size_t i = 0; i < x.size(); ++i) rhs += x[i] * dx[i];
  const auto [L1, R1] = sum_over_ranks<2>(t, {lhs, rhs});  // inner products over all ranks
  if (std::abs(L1 - R1) > 1e-12 * (1.0 + std::abs(L1)))
    rep.fail("<dispatch x, g> = " + std::to_string(L1) +
             " but <x, dispatch_backward g> = " + std::to_string(R1));
  return rep.failures;
}

/// Adjointness of combine (fixed weights, linear in the experts' outputs) and combine_backward's
/// row gradient, in float: <combine(eo), dy> = <eo, d eo> over all ranks, to float rounding.
inline std::vector<std::string> run_combine_adjoint(ep::transport& t, const scenario& s) {
  report rep;
  const std::int32_t R = t.ranks(), me = t.rank();
  rep.where = s.name + " combine adjoint R=" + std::to_string(R) + " rank " + std::to_string(me);
  const std::int64_t d = s.hidden;
  const rank_routing rr = route_rank(s, R, me);
  const std::int64_t n = rr.n;
  const ep::plan p = ep::make_plan(t, s.cfg, rr.place, s.opt, rr.layout, d, sizeof(float));
  std::vector<std::byte> ws(ep::workspace_bytes(p));
  std::uint64_t st = s.seed * 91 + static_cast<std::uint64_t>(me);
  std::vector<float> eo(p.receive_rows * d), dy(n * d), y(n * d), x(n * d), ret(p.send_total() * d),
      d_eo(p.receive_rows * d), d_w(n * s.cfg.top_k);
  for (auto& v : eo) v = uniform(st);
  for (auto& v : dy) v = uniform(st);
  ep::combine<float>(t, p, eo, x, ret, y, ws);
  ep::combine_backward<float>(t, p, ret, dy, d_eo, d_w, {}, ws);
  std::array<double, 2> sums{};
  for (std::size_t i = 0; i < y.size(); ++i) sums[0] += double(y[i]) * dy[i];
  for (std::size_t i = 0; i < eo.size(); ++i) sums[1] += double(eo[i]) * d_eo[i];
  const auto all = sum_over_ranks<2>(t, sums);
  if (std::abs(all[0] - all[1]) > 1e-4 * (1.0 + std::abs(all[0])))
    rep.fail("<combine eo, dy> = " + std::to_string(all[0]) +
             " but <eo, combine_backward dy> = " + std::to_string(all[1]));
  if (all[0] == 0.0) rep.fail("zero inner product: the check checks nothing");
  return rep.failures;
}

/// Runs body on every rank and expects the same moeroute::error everywhere, whose message
/// contains every word. Returns failures.
inline std::vector<std::string> expect_error_everywhere(ep::transport& t, const std::string& name,
                                                        const std::function<void()>& body,
                                                        status_code code,
                                                        std::vector<std::string> words) {
  report rep;
  rep.where = name + " R=" + std::to_string(t.ranks()) + " rank " + std::to_string(t.rank());
  std::string msg;
  try {
    body();
    rep.fail("no error");
  } catch (const error& e) {
    msg = e.get_status().message;
    if (e.get_status().code != code)
      rep.fail(std::string("code ") + to_string(e.get_status().code) + ", wanted " +
               to_string(code) + ": " + msg);
    for (const auto& w : words)
      if (msg.find(w) == std::string::npos) rep.fail("message lacks '" + w + "': " + msg);
  }
  // every rank got the same message
  char mine[256] = {};
  std::memcpy(mine, msg.data(), std::min<std::size_t>(msg.size(), 255));
  std::vector<char> all(256 * static_cast<std::size_t>(t.ranks()));
  t.allgather(mine, all.data(), 256);
  for (std::int32_t r = 1; r < t.ranks(); ++r)
    if (std::memcmp(all.data(), all.data() + 256 * r, 256) != 0)
      rep.fail("rank " + std::to_string(r) + " got a different error than rank 0");
  return rep.failures;
}

}  // namespace moeroute::test::ep_oracle
