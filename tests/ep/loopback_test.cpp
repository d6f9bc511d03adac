// SPDX-License-Identifier: Apache-2.0
// The expert-parallel suite on the in-process loopback transport, R = 1, 2, 3, 4: every check
// of tests/common/ep_cases.hpp (the same bodies the MPI harness runs under mpiexec).
#include <catch2/catch.hpp>

#include "../common/ep_cases.hpp"
#include "../common/test_util.hpp"

namespace ep = moeroute::ep;
using namespace moeroute::test::ep_oracle;

namespace {
void run_everywhere(std::int32_t R, const check& c) {
  std::vector<std::vector<std::string>> failures(R);
  ep::loopback_group(R).run([&](ep::transport& t) { failures[t.rank()] = c.run(t); });
  for (std::int32_t r = 0; r < R; ++r) {
    INFO(c.name << " R=" << R << " rank " << r);
    for (const auto& f : failures[r]) FAIL_CHECK(f);
  }
}
}  // namespace

TEST_CASE("ep loopback: every check equals the single-device oracle", "[ep]") {
  const std::int32_t R = GENERATE(1, 2, 3, 4);
  for (const auto& c : all_checks(R)) run_everywhere(R, c);
}

TEST_CASE("ep placement: contiguous, round robin and tables", "[ep]") {
  const auto c = ep::placement::contiguous(7, 3);  // 3, 2, 2
  CHECK(c.local_experts(0) == 3);
  CHECK(c.local_experts(2) == 2);
  CHECK(c.owner({3}) == 1);
  CHECK(c.local({3}) == ep::local_expert_id{0});
  CHECK(c.global(2, {1}) == ep::global_expert_id{6});
  const auto rr = ep::placement::round_robin(7, 3);
  CHECK(rr.owner({4}) == 1);
  CHECK(rr.local({4}) == ep::local_expert_id{1});
  const auto many = ep::placement::contiguous(2, 4);  // ranks 2 and 3 own nothing
  CHECK(many.local_experts(3) == 0);
  CHECK(c.fingerprint() != rr.fingerprint());
  CHECK(c.fingerprint() == ep::placement::contiguous(7, 3).fingerprint());
  using moeroute::status_code;
  using moeroute::test::expect_error;
  expect_error(
      [] {
        (void)ep::placement::from_table(3, {{0, 1}, {1, 2}});
      },
      status_code::invalid_argument, {"table[1][0] = 1", "already owned by rank 0"});
  expect_error(
      [] {
        (void)ep::placement::from_table(3, {{0}, {2}});
      },
      status_code::invalid_argument, {"expert 1 is owned by no rank"});
  expect_error(
      [] {
        (void)ep::placement::from_table(3, {{0, 3}, {1, 2}});
      },
      status_code::invalid_argument, {"table[0][1] = 3", "outside"});
  expect_error([] { (void)ep::index(ep::global_expert_id{}); }, status_code::invalid_argument,
               {"no_expert sentinel"});
  expect_error([&] { (void)c.owner({ep::no_expert}); }, status_code::invalid_argument,
               {"sentinel"});
  expect_error([&] { (void)c.global(2, {2}); }, status_code::invalid_argument,
               {"local expert 2", "rank 2"});
}

TEST_CASE("ep options: scopes reject what they cannot do, naming the field", "[ep]") {
  using moeroute::status_code;
  using moeroute::test::expect_error;
  moeroute::routing_config cfg;
  ep::options o;
  o.scope = ep::capacity_scope::global;
  cfg.dispatch.dropped = moeroute::drop_policy::next_choice;
  CHECK(ep::validate(cfg, o).code == status_code::unsupported);
  CHECK_THAT(ep::validate(cfg, o).message, Catch::Matchers::Contains("dispatch.dropped"));
  cfg.dispatch.dropped = moeroute::drop_policy::zero_weight;
  cfg.dispatch.prio = moeroute::priority::score_per_expert;
  CHECK_THAT(ep::validate(cfg, o).message, Catch::Matchers::Contains("dispatch.prio"));
  o.scope = ep::capacity_scope::dropless_worst_case;
  CHECK_THAT(ep::validate(cfg, o).message, Catch::Matchers::Contains("options.worst_case_tokens"));
  o.worst_case_tokens = 8;
  CHECK(ep::validate(cfg, o).ok());
  o.receive_layout = moeroute::layout_kind::padded;
  o.block_size = 4;
  CHECK_THAT(ep::validate(cfg, o).message, Catch::Matchers::Contains("options.block_size"));
}

TEST_CASE("ep loopback: a rank that throws fails its peers instead of hanging", "[ep]") {
  using moeroute::test::expect_error;
  expect_error(
      [] {
        ep::loopback_group(3).run([](ep::transport& t) {
          if (t.rank() == 1)
            throw moeroute::error(
                moeroute::status::make(moeroute::status_code::invalid_argument, "rank 1 gave up"));
          std::int64_t v = 0, all[3];
          t.allgather(&v, all, sizeof v);  // ranks 0 and 2 wait here for rank 1
        });
      },
      moeroute::status_code::invalid_argument, {"rank 1 gave up"});
}

TEST_CASE("ep receive_rows_bound covers every worst-case plan", "[ep]") {
  const std::int32_t R = 3;
  auto s = scenarios(R)[2];
  const auto place = make_placement(s, R);
  ep::loopback_group(R).run([&](ep::transport& t) {
    const batch b = make_batch(s);
    const std::int64_t t0 = b.first[t.rank()], n = b.first[t.rank() + 1] - t0;
    std::vector<float> logits(b.logits.begin() + t0 * 7, b.logits.begin() + (t0 + n) * 7);
    const auto g = moeroute::reference::gating(s.cfg, logits, n);
    const auto p = ep::make_plan(t, s.cfg, place, s.opt,
                                 ep::local_dispatch(s.cfg, place, s.opt, t.rank(), g), 4, 4);
    if (p.receive_rows > ep::receive_rows_bound(s.cfg, place, s.opt, t.rank()))
      throw std::runtime_error("bound exceeded");
  });
}

TEST_CASE("ep simulate_plan (the capacity tool's cluster mode) equals every rank's make_plan",
          "[ep]") {
  for (std::int32_t R : {2, 3, 4}) {
    for (const auto& s : scenarios(R)) {
      INFO(s.name << " R=" << R);
      const auto place = make_placement(s, R);
      std::vector<ep::local_dispatch_output> layouts(R);
      std::vector<ep::plan> plans(R);
      ep::loopback_group(R).run([&](ep::transport& t) {
        const std::int32_t me = t.rank();
        layouts[me] = route_rank(s, R, me).layout;
        plans[me] = ep::make_plan(t, s.cfg, place, s.opt, layouts[me], 4, 4);
      });
      for (std::int32_t r = 0; r < R; ++r) {
        const auto sim = ep::simulate_plan(s.cfg, place, s.opt, layouts, r, 4, 4);
        CHECK(sim.send_matrix == plans[r].send_matrix);
        CHECK(sim.expert_rows == plans[r].expert_rows);
        CHECK(sim.dropped_by_rank == plans[r].dropped_by_rank);
        CHECK(sim.receive_blocks == plans[r].receive_blocks);
        CHECK(sim.send_blocks == plans[r].send_blocks);
        CHECK(sim.assignment_row == plans[r].assignment_row);
        CHECK(sim.decision.fates == plans[r].decision.fates);
        CHECK(sim.decision.weight == plans[r].decision.weight);
        CHECK(sim.receive_rows == plans[r].receive_rows);
      }
    }
  }
}

namespace {
/// A transport with only the two required collectives (an engine's own communicator): block
/// exchanges take transport's default, staged implementation.
class minimal_transport final : public ep::transport {
 public:
  explicit minimal_transport(ep::transport& inner) : inner_(inner) {}
  [[nodiscard]] std::int32_t rank() const override { return inner_.rank(); }
  [[nodiscard]] std::int32_t ranks() const override { return inner_.ranks(); }
  void allgather(const void* s, void* r, std::size_t b) override { inner_.allgather(s, r, b); }
  void alltoallv(const void* s, std::span<const std::int64_t> sr, std::span<const std::int64_t> so,
                 void* r, std::span<const std::int64_t> rr, std::span<const std::int64_t> ro,
                 std::size_t b) override {
    inner_.alltoallv(s, sr, so, r, rr, ro, b);
  }

 private:
  ep::transport& inner_;
};
}  // namespace

TEST_CASE("ep: a transport with only allgather and alltoallv runs every scenario", "[ep]") {
  for (std::int32_t R : {1, 3}) {
    for (const auto& s : scenarios(R)) {
      std::vector<std::vector<std::string>> failures(R);
      ep::loopback_group(R).run([&](ep::transport& t) {
        minimal_transport m(t);
        failures[t.rank()] = run_layer<float>(m, s);
      });
      for (std::int32_t r = 0; r < R; ++r) {
        INFO(s.name << " R=" << R << " rank " << r);
        for (const auto& f : failures[r]) FAIL_CHECK(f);
      }
    }
  }
}
