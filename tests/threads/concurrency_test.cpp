// SPDX-License-Identifier: Apache-2.0
// The CPU backend under concurrency, as engines drive it (docs/api.md "Concurrency"): several
// caller threads at once over one shared const routing_config (each with its own router or
// workspace), OpenMP teams inside each caller, and one caller thread pool shared by several
// callers through cpu::executor's parallel-for hook. Every result must be bit-identical to the
// same step run serially on one thread. Built like every CPU test, and again under
// ThreadSanitizer (with LLVM's OpenMP and its Archer tool) by tests/tsan.sh, which is what
// turns a race these runs happen to survive into a failure.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <moeroute/cpu.hpp>
#include <moeroute/cpu/router.hpp>
#include <moeroute/presets.hpp>

#include "../common/dispatch_cases.hpp"

namespace moeroute::test {
namespace {

constexpr std::int64_t max_tokens = 96, hidden = 16;
constexpr int callers = 4;

std::vector<float> values(std::size_t n, std::uint64_t seed, float lo, float hi) {
  lcg r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = r.uniform(lo, hi);
  return v;
}

/// Everything one training step through cpu::router writes, compared bit for bit.
struct step_result {
  std::vector<std::int32_t> ids, expert, slot;
  std::vector<std::int64_t> offsets, row;
  std::vector<float> weight, y, grad_x, grad_logits;
  double aux = 0, z = 0;
  std::int64_t kept = 0, dropped = 0, capacity = 0;

  bool operator==(const step_result& o) const {
    const auto same = [](const auto& a, const auto& b) {
      return a.size() == b.size() &&
             (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
    };
    return same(ids, o.ids) && same(expert, o.expert) && same(slot, o.slot) &&
           same(offsets, o.offsets) && same(row, o.row) && same(weight, o.weight) && same(y, o.y) &&
           same(grad_x, o.grad_x) && same(grad_logits, o.grad_logits) &&
           std::memcmp(&aux, &o.aux, sizeof aux) == 0 && std::memcmp(&z, &o.z, sizeof z) == 0 &&
           kept == o.kept && dropped == o.dropped && capacity == o.capacity;
  }
};

/// The inputs of step `seed`: T = 17..96 tokens, so batches of several sizes share a router.
struct step_input {
  std::int64_t T;
  std::vector<float> logits, x, dy, bias;
};

step_input input_for(const routing_config& cfg, std::uint64_t seed) {
  step_input in;
  in.T = 17 + static_cast<std::int64_t>(seed * 29 % (max_tokens - 16));
  const std::int32_t E = cfg.num_experts;
  in.logits = make_logits(in.T, E, seed);
  in.x = values(static_cast<std::size_t>(in.T * hidden), seed + 1, -1.0f, 1.0f);
  in.dy = values(static_cast<std::size_t>(in.T * hidden), seed + 2, -1.0f, 1.0f);
  if (cfg.gating.expert_bias) in.bias = values(static_cast<std::size_t>(E), seed + 3, -0.5f, 0.5f);
  return in;
}

/// route -> permute -> experts (expert e scales its rows by 1 + e / 8) -> combine, then the
/// backward of sum(y * dy) through combine, the experts, permute and gating. Empty on failure.
step_result run_step(cpu::router<float>& r, const step_input& in, const cpu::executor& ex) {
  step_result out;
  const routing_config& cfg = r.config();
  if (!r.route(in.logits, in.bias, {}, ex)) return out;
  const auto scale_rows = [&](std::span<float> rows) {
    for (std::int32_t e = 0; e < cfg.total_experts(); ++e)
      for (std::int64_t i = r.offsets()[e] * hidden; i < r.offsets()[e + 1] * hidden; ++i)
        rows[static_cast<std::size_t>(i)] *= 1.0f + static_cast<float>(e) / 8.0f;
  };
  std::span<float> expert_in, y, d_expert_out, d_x, d_logits;
  if (!r.permute(in.x, expert_in, ex)) return out;
  scale_rows(expert_in);
  const std::vector<float> expert_out(expert_in.begin(), expert_in.end());
  if (!r.combine(expert_out, in.x, y, ex)) return out;
  out.y.assign(y.begin(), y.end());
  if (!r.combine_backward(in.dy, expert_out, d_expert_out, ex)) return out;
  scale_rows(d_expert_out);
  if (!r.permute_backward(d_expert_out, d_x, ex)) return out;
  out.grad_x.assign(d_x.begin(), d_x.end());
  if (!r.gating_backward(in.logits, d_logits, {}, ex)) return out;
  out.grad_logits.assign(d_logits.begin(), d_logits.end());
  const std::size_t n = static_cast<std::size_t>(in.T * cfg.top_k);
  const auto g = r.gated();
  const auto d = r.dispatched();
  out.ids.assign(g.d_ids, g.d_ids + n);
  out.expert.assign(d.d_expert, d.d_expert + n);
  out.slot.assign(d.d_slot, d.d_slot + n);
  out.weight.assign(d.d_weight, d.d_weight + n);
  out.row.assign(r.layout().d_assignment_row, r.layout().d_assignment_row + n);
  out.offsets.assign(r.offsets().begin(), r.offsets().end());
  out.aux = r.losses().aux;
  out.z = r.losses().z;
  out.kept = r.totals().kept;
  out.dropped = r.totals().dropped;
  out.capacity = r.totals().capacity;
  return out;
}

/// The configs the runs cover: every preset at E = 16 (capacity bounded, so there are drops),
/// each also with residual drops.
std::vector<routing_config> configs() {
  std::vector<routing_config> out;
  for (const auto& p : presets::registry) {
    routing_config cfg = presets::by_name(p.name, 16, std::min(p.default_k, 16));
    if (cfg.capacity.mode == capacity_mode::unbounded) {
      cfg.capacity.mode = capacity_mode::factor;
      cfg.capacity.factor = 1.0;
    }
    out.push_back(cfg);
    cfg.dispatch.dropped = drop_policy::residual;
    if (validate(cfg)) out.push_back(cfg);
  }
  return out;
}

constexpr std::uint64_t steps = 6;

/// Each config's steps run serially on one thread: what every concurrent run must equal.
std::vector<std::vector<step_result>> serial_results(const std::vector<routing_config>& cfgs) {
  std::vector<std::vector<step_result>> want(cfgs.size());
  for (std::size_t c = 0; c < cfgs.size(); ++c) {
    cpu::router<float> r(cfgs[c], max_tokens, hidden);
    for (std::uint64_t s = 0; s < steps; ++s) {
      want[c].push_back(run_step(r, input_for(cfgs[c], s), cpu::executor::serial()));
      REQUIRE(!want[c].back().y.empty());
    }
  }
  return want;
}

/// `callers` threads at once; caller i runs every config's steps from its own router, starting
/// at a different step, through the executor make_ex(i) gives. Returns the mismatches (checked
/// on the main thread: Catch2's assertions are not thread-safe).
std::vector<std::string> run_callers(const std::vector<routing_config>& cfgs,
                                     const std::vector<std::vector<step_result>>& want,
                                     const std::function<cpu::executor(int)>& make_ex) {
  std::vector<std::vector<std::string>> bad(callers);
  std::vector<std::thread> threads;
  for (int i = 0; i < callers; ++i)
    threads.emplace_back([&, i] {
      const cpu::executor ex = make_ex(i);
      for (std::size_t c = 0; c < cfgs.size(); ++c) {
        cpu::router<float> r(cfgs[c], max_tokens, hidden);  // cfgs[c] is shared, read-only
        for (std::uint64_t j = 0; j < steps; ++j) {
          const std::uint64_t s = (j + static_cast<std::uint64_t>(i)) % steps;
          if (!(run_step(r, input_for(cfgs[c], s), ex) == want[c][s]))
            bad[i].push_back("caller " + std::to_string(i) + ", config " + std::to_string(c) +
                             ", step " + std::to_string(s));
        }
      }
    });
  for (auto& t : threads) t.join();
  std::vector<std::string> all;
  for (const auto& b : bad) all.insert(all.end(), b.begin(), b.end());
  return all;
}

/// A caller-owned thread pool several callers share: each parallel-for is a job whose tasks the
/// pool's workers and the calling thread claim one at a time (an engine's pool in miniature).
class shared_pool {
 public:
  explicit shared_pool(int workers) {
    for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { work(); });
  }
  ~shared_pool() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  shared_pool(const shared_pool&) = delete;
  shared_pool& operator=(const shared_pool&) = delete;

  static void run(void* pool, std::int64_t tasks, void (*task)(void*, std::int64_t), void* arg) {
    static_cast<shared_pool*>(pool)->parallel_for(tasks, task, arg);
  }
  [[nodiscard]] std::int64_t jobs_run() const { return jobs_run_.load(); }

 private:
  struct job {
    std::int64_t tasks = 0;
    void (*task)(void*, std::int64_t) = nullptr;
    void* arg = nullptr;
    std::int64_t next = 0, done = 0;  // guarded by the pool's mutex
    std::condition_variable finished;
  };

  void parallel_for(std::int64_t tasks, void (*task)(void*, std::int64_t), void* arg) {
    job j;
    j.tasks = tasks;
    j.task = task;
    j.arg = arg;
    std::unique_lock lock(m_);
    queue_.push_back(&j);
    cv_.notify_all();
    while (j.next < j.tasks) run_one(j, lock);  // the caller helps
    j.finished.wait(lock, [&] { return j.done == j.tasks; });
    ++jobs_run_;
  }

  // Claims and runs one task of j (lock held on entry and exit, released while it runs).
  void run_one(job& j, std::unique_lock<std::mutex>& lock) {
    const std::int64_t i = j.next++;
    if (j.next == j.tasks) queue_.erase(std::find(queue_.begin(), queue_.end(), &j));
    lock.unlock();
    j.task(j.arg, i);
    lock.lock();
    if (++j.done == j.tasks) j.finished.notify_all();
  }

  void work() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      run_one(*queue_.front(), lock);
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<job*> queue_;
  bool stop_ = false;
  std::atomic<std::int64_t> jobs_run_{0};
  std::vector<std::thread> workers_;
};

TEST_CASE("concurrency: caller threads share one config, each with its own router", "[threads]") {
  const auto cfgs = configs();
  const auto want = serial_results(cfgs);
  const auto bad = run_callers(cfgs, want, [](int) { return cpu::executor::serial(); });
  CAPTURE(bad.size());
  REQUIRE(bad.empty());
}

TEST_CASE("concurrency: an OpenMP team inside each of several caller threads", "[threads]") {
  const auto cfgs = configs();
  const auto want = serial_results(cfgs);
  const auto bad = run_callers(cfgs, want, [](int i) { return cpu::executor::openmp(1 + i % 3); });
  CAPTURE(bad.size());
  REQUIRE(bad.empty());
}

TEST_CASE("concurrency: one caller thread pool shared by several callers", "[threads]") {
  const auto cfgs = configs();
  const auto want = serial_results(cfgs);
  shared_pool pool(3);
  const auto bad = run_callers(cfgs, want, [&](int) {
    return cpu::executor{&shared_pool::run, &pool, 0};
  });
  CAPTURE(bad.size());
  REQUIRE(bad.empty());
  REQUIRE(pool.jobs_run() > 0);  // the hook was taken, not bypassed
}

TEST_CASE("concurrency: the params API from several threads over one shared config", "[threads]") {
  // gating and dispatch with caller-owned outputs and workspace, no router: the config object
  // itself is what every thread reads at once
  const routing_config cfg = presets::deepseek_v3(64, 8);
  const std::int64_t T = 256;
  const std::int32_t k = cfg.top_k;
  struct outputs {
    std::vector<std::int32_t> ids, expert, slot;
    std::vector<float> gates, weight;
  };
  const auto run = [&](std::uint64_t seed, const cpu::executor& ex) {
    const auto logits = make_logits(T, cfg.num_experts, seed);
    const auto bias = values(static_cast<std::size_t>(cfg.num_experts), seed, -0.1f, 0.1f);
    router_buffers b(cfg, T, 1, sizeof(float), {}, [](const routing_config& c, std::int64_t t) {
      return std::max(cpu::gating_workspace_bytes(c, t), cpu::dispatch_workspace_bytes(c, t));
    });
    std::vector<std::byte> block(b.bytes());
    b.attach(block.data());
    gating_params<float> g;
    g.d_logits = logits.data();
    g.tokens = T;
    g.d_bias = bias.data();
    g.out = b.gating_out();
    const auto ws = b.get<std::byte>("workspace");
    outputs o;
    if (!cpu::gating(cfg, g, ws.data(), ws.size(), ex)) return o;
    dispatch_params d;
    d.tokens = T;
    d.gated = g.out;
    d.out = b.dispatch_out();
    if (!cpu::dispatch(cfg, d, ws.data(), ws.size(), ex)) return o;
    const auto n = static_cast<std::size_t>(T * k);
    o.ids.assign(g.out.d_ids, g.out.d_ids + n);
    o.gates.assign(g.out.d_gates, g.out.d_gates + n);
    o.expert.assign(d.out.d_expert, d.out.d_expert + n);
    o.slot.assign(d.out.d_slot, d.out.d_slot + n);
    o.weight.assign(d.out.d_weight, d.out.d_weight + n);
    return o;
  };
  std::vector<outputs> want;
  for (std::uint64_t s = 0; s < callers; ++s) want.push_back(run(s, cpu::executor::serial()));
  std::vector<int> same(callers * callers, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < callers; ++i)
    threads.emplace_back([&, i] {
      for (int j = 0; j < callers; ++j) {
        const auto s = static_cast<std::size_t>((i + j) % callers);
        const outputs got = run(s, cpu::executor::openmp(2));
        same[static_cast<std::size_t>(i * callers + j)] =
            !got.ids.empty() && got.ids == want[s].ids && got.expert == want[s].expert &&
            got.slot == want[s].slot &&
            std::memcmp(got.gates.data(), want[s].gates.data(), got.gates.size() * 4) == 0 &&
            std::memcmp(got.weight.data(), want[s].weight.data(), got.weight.size() * 4) == 0;
      }
    });
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < same.size(); ++i) {
    INFO("run " << i);
    REQUIRE(same[i] == 1);
  }
}

}  // namespace
}  // namespace moeroute::test
