// SPDX-License-Identifier: Apache-2.0
// How the CPU backend runs work in parallel. Every operation cuts its work into tasks whose
// boundaries depend only on the shapes (never on the thread count) and reduces per-task
// partials in task order, so results are bit-identical for any number of threads. Who runs
// the tasks is the caller's choice, passed last as the CUDA launchers take a stream:
//   cpu::executor{}                 OpenMP when the consumer compiles with it, else serial
//   cpu::executor::serial()         the calling thread only
//   cpu::executor{&my_run, &pool}   the engine's own thread pool (a parallel-for hook)
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace moeroute::cpu {

/// @brief A parallel-for: runs task(arg, i) once for every i in [0, tasks), in any order and
///        on any threads, and returns when all have finished. Tasks never throw.
using parallel_for_fn = void (*)(void* context, std::int64_t tasks,
                                 void (*task)(void* arg, std::int64_t i), void* arg);

/// @brief Who runs an operation's tasks. The default uses OpenMP's threads when the including
///        translation unit is compiled with OpenMP (-fopenmp) and the calling thread otherwise;
///        `threads` caps how many OpenMP threads one call uses (0 = OpenMP's default).
struct executor {
  parallel_for_fn run = nullptr;  ///< the engine's parallel-for; null = OpenMP or serial
  void* context = nullptr;        ///< passed to `run` (e.g. the engine's pool)
  int threads = 0;                ///< OpenMP threads per call (0 = default); ignored by `run`

  /// The calling thread only.
  [[nodiscard]] static executor serial() noexcept { return executor{nullptr, nullptr, 1}; }
  /// OpenMP (when compiled with it) with at most n threads.
  [[nodiscard]] static executor openmp(int n = 0) noexcept { return executor{nullptr, nullptr, n}; }
};

/// @brief Runs body(i) for i in [0, tasks) on `ex`. `body` must not throw.
template <class Body>
void parallel_for(const executor& ex, std::int64_t tasks, Body&& body) {
  if (tasks <= 0) return;
  using body_t = std::remove_reference_t<Body>;
  if (ex.run != nullptr && tasks > 1) {
    ex.run(
        ex.context, tasks, [](void* arg, std::int64_t i) { (*static_cast<body_t*>(arg))(i); },
        const_cast<void*>(static_cast<const void*>(&body)));
    return;
  }
#if defined(_OPENMP)
  if (ex.threads != 1 && tasks > 1) {
    const int n = ex.threads > 0 ? ex.threads : 0;
    if (n > 0) {
#pragma omp parallel for schedule(static) num_threads(n)
      for (std::int64_t i = 0; i < tasks; ++i) body(i);
    } else {
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < tasks; ++i) body(i);
    }
    return;
  }
#endif
  for (std::int64_t i = 0; i < tasks; ++i) body(i);
}

/// @brief parallel_for for tasks of very different sizes, given largest first: OpenMP hands
///        them out one at a time (a dynamic schedule), so the threads finish close together.
///        Which thread runs a task never changes a result, as with parallel_for.
template <class Body>
void parallel_for_uneven(const executor& ex, std::int64_t tasks, Body&& body) {
#if defined(_OPENMP)
  if (ex.run == nullptr && ex.threads != 1 && tasks > 1) {
    if (ex.threads > 0) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(ex.threads)
      for (std::int64_t i = 0; i < tasks; ++i) body(i);
    } else {
#pragma omp parallel for schedule(dynamic, 1)
      for (std::int64_t i = 0; i < tasks; ++i) body(i);
    }
    return;
  }
#endif
  parallel_for(ex, tasks, std::forward<Body>(body));
}

/// @brief [begin, end) of task i when n items are cut into `tasks` near-equal runs.
inline void task_range(std::int64_t n, std::int64_t tasks, std::int64_t i, std::int64_t& begin,
                       std::int64_t& end) noexcept {
  const std::int64_t base = n / tasks, extra = n % tasks;
  begin = i * base + (i < extra ? i : extra);
  end = begin + base + (i < extra ? 1 : 0);
}

/// Bytes between the starts of two tasks' per-task partials in a workspace. Tasks on
/// different threads update their partials every token; neighbours closer than this made two
/// threads no faster than one on short rows (cpu::gating, Mixtral, T = 4096, two tasks: 64
/// bytes apart 1.0x, 128 1.4x, 256 2.0x: the prefetchers pull neighbouring lines too).
inline constexpr std::size_t task_gap_bytes = 256;

/// @brief Elements of T per task for `used` elements: rounded up to whole task_gap_bytes.
template <class T>
[[nodiscard]] constexpr std::size_t task_stride(std::size_t used) noexcept {
  constexpr std::size_t per_gap = task_gap_bytes / sizeof(T);
  return (used + per_gap - 1) / per_gap * per_gap;
}

/// @brief Tasks for n items of about `cost` work units each: enough to keep many threads busy
///        and each worth scheduling, at most `max_tasks`. Depends only on its arguments.
[[nodiscard]] inline std::int64_t task_count(std::int64_t n, std::int64_t min_items_per_task,
                                             std::int64_t max_tasks = 256) noexcept {
  if (n <= 0) return 0;
  std::int64_t t = (n + min_items_per_task - 1) / min_items_per_task;
  return t < 1 ? 1 : (t > max_tasks ? max_tasks : t);
}

}  // namespace moeroute::cpu
