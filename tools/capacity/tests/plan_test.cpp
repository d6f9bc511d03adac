// SPDX-License-Identifier: Apache-2.0
// The capacity planner's parts: the distribution statistics against a direct computation
// (every quantile exact), the batch orders, the memory-mapped reader against the in-memory
// one (float32 and float16), the per-batch numbers against the reference routing each batch
// itself, and the recommendation on a hand-made dump whose answer is known.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <moeroute/planner/npy.hpp>
#include <moeroute/presets.hpp>
#include <moeroute/reference.hpp>

#include <moeroute/planner/plan.hpp>

using namespace moeroute;
using namespace moeroute::planner;

namespace {

/// A temporary file, removed at scope end.
struct temp_file {
  std::string path;
  explicit temp_file(const std::string& name)
      : path("/tmp/moeroute_plan_test_" + std::to_string(getpid()) + "_" + name) {}
  ~temp_file() { std::remove(path.c_str()); }
};

/// A float16 .npy written by hand (format 1.0, '<f2').
void write_f16_npy(const std::string& path, const std::vector<float>& v,
                   const std::vector<std::int64_t>& shape) {
  std::string dims;
  for (auto d : shape) dims += std::to_string(d) + ", ";
  std::string header = "{'descr': '<f2', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<std::uint16_t>(header.size());
  f.put(static_cast<char>(len & 0xff));
  f.put(static_cast<char>(len >> 8));
  f << header;
  for (float x : v) {
    const std::uint16_t h = to_half(x).bits;
    f.put(static_cast<char>(h & 0xff));
    f.put(static_cast<char>(h >> 8));
  }
}

std::vector<float> random_logits(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.5f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace

TEST_CASE("plan: quantiles are exact nearest ranks, mean and max direct", "[plan][stats]") {
  std::mt19937 g(3);
  for (std::size_t n : {1u, 2u, 3u, 7u, 16u, 100u, 101u, 1000u}) {
    std::vector<double> v(n);
    for (auto& x : v) x = static_cast<double>(g() % 1000) / 7.0;
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    const distribution d = summarize(v);
    double sum = 0.0;
    for (double x : v) sum += x;
    CHECK(d.mean == sum / static_cast<double>(n));
    CHECK(d.max == s.back());
    // the ceil(q n)-th smallest, by counting: the least value with at least ceil(q n) <= it
    for (const double q : {0.0, 0.01, 0.5, 0.95, 0.99, 1.0}) {
      const auto need = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(q * n)));
      double want = 0.0;
      for (double c : s) {
        const auto at_most = static_cast<std::size_t>(
            std::count_if(v.begin(), v.end(), [&](double x) { return x <= c; }));
        if (at_most >= need) {
          want = c;
          break;
        }
      }
      INFO("n = " << n << ", q = " << q);
      CHECK(nearest_rank(v, q) == want);
    }
    CHECK(d.p50 == nearest_rank(v, 0.5));
    CHECK(d.p95 == nearest_rank(v, 0.95));
    CHECK(d.p99 == nearest_rank(v, 0.99));
  }
  CHECK(summarize({}).max == 0.0);
}

TEST_CASE("plan: batch orders", "[plan]") {
  const auto c = batch_order(10, batching::consecutive, 0);
  CHECK(c == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  const auto a = batch_order(1000, batching::shuffled, 5);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == batch_order(1000, batching::consecutive, 0));  // a permutation
  CHECK(a == batch_order(1000, batching::shuffled, 5));          // reproducible
  CHECK(a != batch_order(1000, batching::shuffled, 6));
  CHECK(a != sorted);
  // grouped: stable by id, so each id's tokens stay in arrival order
  const std::vector<double> ids = {3, 1, 3, 2, 1, 3};
  CHECK(batch_order(6, batching::grouped, 0, ids) == std::vector<std::int64_t>{1, 4, 3, 0, 2, 5});
}

TEST_CASE("plan: the memory-mapped dump reads what the in-memory reader reads", "[plan][npy]") {
  const std::int64_t L = 3, N = 37, E = 11;
  const auto v = random_logits(static_cast<std::size_t>(L * N * E), 9);
  const std::vector<std::int64_t> shape = {L, N, E};
  for (const bool half : {false, true}) {
    temp_file f(half ? "f16.npy" : "f32.npy");
    if (half)
      write_f16_npy(f.path, v, shape);
    else
      REQUIRE(io::write_npy(f.path, v, shape).ok());
    io::npy_array mem;
    REQUIRE(io::read_npy(f.path, mem).ok());
    mapped_logits map;
    REQUIRE(mapped_logits::open(f.path, map).ok());
    CHECK(map.layers() == L);
    CHECK(map.tokens() == N);
    CHECK(map.experts() == E);
    const std::vector<std::int64_t> rows = {36, 0, 5, 5, 17};
    std::vector<float> got(rows.size() * E);
    for (std::int64_t l = 0; l < L; ++l) {
      map.gather(l, rows, got.data());
      for (std::size_t i = 0; i < rows.size(); ++i)
        for (std::int64_t e = 0; e < E; ++e)
          REQUIRE(got[i * E + e] ==
                  mem.values[static_cast<std::size_t>((l * N + rows[i]) * E + e)]);
    }
  }
  mapped_logits none;
  const status s = mapped_logits::open("/nonexistent/dump.npy", none);
  CHECK(!s.ok());
  CHECK_THAT(s.message, Catch::Contains("/nonexistent/dump.npy"));
}

TEST_CASE("plan: per-batch numbers equal the reference routing each batch", "[plan]") {
  const std::int64_t L = 2, N = 600, E = 8, B = 128;
  const auto v = random_logits(static_cast<std::size_t>(L * N * E), 11);
  temp_file f("ref.npy");
  REQUIRE(io::write_npy(f.path, v, std::vector<std::int64_t>{L, N, E}).ok());
  mapped_logits map;
  REQUIRE(mapped_logits::open(f.path, map).ok());
  plan_options o;
  o.base = presets::deepspeed_topk(8, 2, 1.0, 1);
  o.factors = {{false, 0.75}, {false, 1.25}, {true, 0.0}};
  o.priorities = {priority::token_major, priority::score_per_expert};
  o.policies = {drop_policy::zero_weight, drop_policy::fallback};
  o.batch_tokens = B;
  o.hidden = 64;
  o.buffer_dtype = dtype::f32;
  o.owner = {0, 0, 1, 1, 2, 2, 3, 3};
  o.ranks = 4;
  const auto order = batch_order(N, batching::shuffled, 3);
  const plan_result r = run_plan(o, map, order, {});
  CHECK(r.batches == 4);
  CHECK(r.tokens_left_out == 600 - 4 * 128);
  REQUIRE(r.cells.size() == 2 * 3 * 2 * 2);
  for (const auto& cell : r.cells) {
    routing_config cfg;
    const factor_choice fc = cell.factor == "dropless" ? factor_choice{true, 0.0}
                                                       : factor_choice{false, cell.factor_value};
    REQUIRE(sweep_config(o.base, fc, parse<priority>(cell.priority_name),
                         parse<drop_policy>(cell.policy_name), cfg)
                .ok());
    std::vector<double> drop, fully, rerouted, rank1;
    for (std::int64_t b = 0; b < r.batches; ++b) {
      std::vector<float> x(static_cast<std::size_t>(B * E));
      for (std::int64_t t = 0; t < B; ++t)
        for (std::int64_t e = 0; e < E; ++e)
          x[static_cast<std::size_t>(t * E + e)] =
              v[static_cast<std::size_t>((cell.layer * N + order[b * B + t]) * E + e)];
      const auto rr = reference::route<float>(cfg, x, B);
      const auto L2 = fc.dropless ? reference::layout(cfg, rr.dispatch, layout_kind::compact, 16)
                                  : reference::layout(cfg, rr.dispatch, layout_kind::padded);
      const auto st = reference::compute_stats(rr.dispatch, L2);
      drop.push_back(st.drop_rate);
      fully.push_back(static_cast<double>(st.fully_dropped_tokens));
      rerouted.push_back(static_cast<double>(st.rerouted));
      const auto& d = rr.dispatch;
      const auto rq = d.requested[2] + d.requested[3];
      rank1.push_back(rq > 0 ? static_cast<double>(d.dropped[2] + d.dropped[3]) /
                                   static_cast<double>(rq)
                             : 0.0);
    }
    INFO(cell.layer << " " << cell.factor << " " << cell.priority_name << " " << cell.policy_name);
    const distribution want = summarize(drop);
    CHECK(cell.drop_rate.mean == want.mean);
    CHECK(cell.drop_rate.p50 == want.p50);
    CHECK(cell.drop_rate.p99 == want.p99);
    CHECK(cell.drop_rate.max == want.max);
    CHECK(cell.fully_dropped.max == summarize(fully).max);
    CHECK(cell.rerouted.mean == summarize(rerouted).mean);
    REQUIRE(cell.rank_drop.size() == 4);
    CHECK(cell.rank_drop[1].max == summarize(rank1).max);
  }
}

TEST_CASE("plan: consecutive batches without an order array equal the explicit order", "[plan]") {
  const std::int64_t L = 2, N = 700, E = 8, B = 96;
  const auto v = random_logits(static_cast<std::size_t>(L * N * E), 12);
  const auto map = mapped_logits::view(v.data(), io::npy_dtype::f32, L, N, E);  // no file needed
  plan_options o;
  o.base = presets::deepspeed_topk(8, 2, 1.0, 1);
  o.factors = {{false, 1.0}, {true, 0.0}};
  o.priorities = {std::nullopt};
  o.policies = {std::nullopt};
  o.batch_tokens = B;
  const plan_result implicit = run_plan(o, map, {}, {});
  const plan_result explicit_ = run_plan(o, map, batch_order(N, batching::consecutive, 0), {});
  REQUIRE(implicit.cells.size() == explicit_.cells.size());
  for (std::size_t c = 0; c < implicit.cells.size(); ++c) {
    CHECK(implicit.cells[c].drop_rate.mean == explicit_.cells[c].drop_rate.mean);
    CHECK(implicit.cells[c].drop_rate.max == explicit_.cells[c].drop_rate.max);
    CHECK(implicit.cells[c].padding_waste.p99 == explicit_.cells[c].padding_waste.p99);
  }
  for (std::size_t l = 0; l < implicit.recommendations.size(); ++l)
    CHECK(implicit.recommendations[l].factor == explicit_.recommendations[l].factor);
  CHECK(implicit.experts[1].drift == explicit_.experts[1].drift);
  // the kept per-batch counts: [layers][batches][E] int32
  CHECK(implicit.state_bytes == L * (N / B) * E * 4);
  // an order of the wrong length is refused, naming it
  const std::vector<std::int64_t> short_order(10, 0);
  CHECK_THROWS_WITH(run_plan(o, map, short_order, {}), Catch::Contains("order has 10 entries"));
}

TEST_CASE("plan: the recommendation on a dump whose answer is known", "[plan][recommend]") {
  // E = 4, k = 1, batches of 8: batch 0 sends every token to expert 0 (8 requests there),
  // batch 1 two tokens to each expert. Megatron's rule C = ceil(f * 8 * 1 / 4) = ceil(2 f).
  const std::int64_t E = 4, B = 8, N = 16;
  std::vector<float> v(static_cast<std::size_t>(N * E), 0.0f);
  for (std::int64_t t = 0; t < N; ++t) {
    const std::int64_t e = t < 8 ? 0 : (t - 8) / 2;
    v[static_cast<std::size_t>(t * E + e)] = 5.0f;
  }
  temp_file f("known.npy");
  REQUIRE(io::write_npy(f.path, v, std::vector<std::int64_t>{1, N, E}).ok());
  mapped_logits map;
  REQUIRE(mapped_logits::open(f.path, map).ok());
  presets::megatron_options mo;
  mo.pre_softmax = true;
  mo.capacity_factor = 1.0;
  plan_options o;
  o.base = presets::megatron(4, 1, mo);
  o.factors = {{false, 1.0}};
  o.priorities = {std::nullopt};
  o.policies = {std::nullopt};
  o.batch_tokens = B;
  o.hidden = 10;
  o.buffer_dtype = dtype::f32;
  const auto order = batch_order(N, batching::consecutive, 0);
  const auto rec = [&](double target, double q) {
    o.target_drop = target;
    o.quantile = q;
    return run_plan(o, map, order, {}).recommendations;
  };
  // every batch without overflow: C = 8, and ceil(2 f) >= 8 first at f = 3.51 (3.50 gives 7)
  auto r = rec(0.0, 1.0);
  REQUIRE(r.size() == 2);
  CHECK(r[0].met);
  CHECK(r[0].capacity == 8);
  CHECK(r[0].factor == 3.51);
  CHECK(r[0].overflow_quantile == 0.0);
  CHECK(r[0].buffer_bytes == 4 * 8 * 10 * 4);
  // padding: batch 0 uses 8 of 32 slots, batch 1 all 8 of 32: 75% both
  CHECK(r[0].padding_waste == 0.75);
  // dropless compact (blocks of 16): batch 0 one expert of 8 -> 16 rows; batch 1 four of 2 ->
  // 64 rows
  CHECK(r[0].dropless_bytes == 64 * 10 * 4);
  CHECK(r[1].layer == -1);
  CHECK(r[1].factor == 3.51);
  // the median batch (nearest rank 1 of 2: the balanced one) needs C = 2: f = 0.51 .. 1.0
  r = rec(0.0, 0.5);
  CHECK(r[0].capacity == 2);
  CHECK(r[0].factor == 0.51);
  CHECK(r[0].overflow_max == 0.75);  // batch 0 keeps 2 of 8
  // allowing half of batch 0's assignments to overflow: C = 4, f = 1.51
  r = rec(0.5, 1.0);
  CHECK(r[0].capacity == 4);
  CHECK(r[0].factor == 1.51);
  CHECK(r[0].overflow_quantile == 0.5);
}

TEST_CASE("plan: numeric .npy arrays (ids, biases) of any integer, bool or float type",
          "[plan][npy]") {
  const auto file = [](const std::string& descr, const std::string& shape,
                       const std::vector<std::uint8_t>& data) {
    std::string header =
        "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    const std::string text =
        std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
    std::vector<std::uint8_t> b(text.begin(), text.end());
    b.insert(b.end(), data.begin(), data.end());
    return b;
  };
  io::npy_numeric a;
  REQUIRE(io::parse_npy_numeric(file("|i1", "(3,)", {0xff, 0x02, 0x80}), a).ok());
  CHECK(a.values == std::vector<double>{-1, 2, -128});
  REQUIRE(io::parse_npy_numeric(file(">i4", "(2,)", {0, 0, 1, 0, 0xff, 0xff, 0xff, 0xfe}), a).ok());
  CHECK(a.values == std::vector<double>{256, -2});
  REQUIRE(io::parse_npy_numeric(file("<u2", "(1, 2)", {1, 1, 0xff, 0xff}), a).ok());
  CHECK(a.shape == std::vector<std::int64_t>{1, 2});
  CHECK(a.values == std::vector<double>{257, 65535});
  REQUIRE(io::parse_npy_numeric(file("|b1", "(2,)", {1, 0}), a).ok());
  CHECK(a.values == std::vector<double>{1, 0});
  REQUIRE(io::parse_npy_numeric(file("<f8", "()", {0, 0, 0, 0, 0, 0, 0xf8, 0x3f}), a).ok());
  CHECK(a.values == std::vector<double>{1.5});
  REQUIRE(io::parse_npy_numeric(
              file("<i8", "(1,)", {0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), a)
              .ok());
  CHECK(a.values == std::vector<double>{-2});
  const status bad = io::parse_npy_numeric(file("<c8", "(1,)", std::vector<std::uint8_t>(8)), a);
  CHECK_THAT(bad.message, Catch::Contains("unsupported dtype descr '<c8'"));
  const status short_data = io::parse_npy_numeric(file("<i4", "(3,)", {1, 0, 0, 0}), a);
  CHECK_THAT(short_data.message, Catch::Contains("data size mismatch"));
}
