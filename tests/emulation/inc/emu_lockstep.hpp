// SPDX-License-Identifier: Apache-2.0
// Lock-step CPU emulation of CUDA blocks (tests/emulation/README.md): every thread of a block is
// a fiber with its own stack, so per-thread registers stay private, `__shared__` variables are
// shared (one block runs at a time), and the cooperative primitives are real barriers:
//   __syncthreads          waits until every live thread of the block has arrived;
//   __shfl_sync / _xor     a warp-wide exchange: write, barrier over the warp, read, barrier.
// A fiber runs until it reaches a barrier, then yields to the scheduler, which resumes the
// fibers round-robin (in reverse thread order when reverse is set). A pass in which no
// fiber advances while some still wait is a deadlock (a barrier some threads never reach, or a
// full-mask shuffle after lanes exited) and aborts with a message.
//
// Not CUDA: no concurrency inside a barrier interval, so it finds order dependence only between
// barriers, and it is no substitute for compute-sanitizer's racecheck on a GPU.
#pragma once

#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

// Uses the built-in variables emu_cuda.hpp defines (threadIdx, blockIdx, blockDim, gridDim).

// glibc's swapcontext makes a sigprocmask system call per switch, which was ~80% of the run
// time; on x86-64 a switch saves and restores only the callee-saved registers and the stack
// pointer (emu_ls_switch), elsewhere it stays swapcontext. The switch leaves by a jump, not
// `ret`: a `ret` into another fiber's stack is always mispredicted (the return-stack buffer
// holds the caller's address), which made a warp shuffle cost half again as much.
#if defined(__x86_64__)
#define EMU_LS_FAST_SWITCH 1
#endif

namespace emu::ls {

struct fiber {
#ifndef EMU_LS_FAST_SWITCH
  ucontext_t ctx{};  // (~1 KB: kept out of the x86-64 fibers, which are copied per block)
#endif
  void* sp = nullptr;  // saved stack pointer (the x86-64 switch below)
  bool done = false;
  std::int64_t warp_arrivals = 0;   // warp barriers passed or entered
  std::int64_t block_arrivals = 0;  // __syncthreads entered
  const char* waiting_at = nullptr;
};

struct scheduler {
#ifndef EMU_LS_FAST_SWITCH
  ucontext_t main{};
#endif
  void* main_sp = nullptr;
  std::vector<fiber> fibers;
  unsigned current = 0;
  std::uint64_t events = 0;  // arrivals and exits: a pass without new events is a deadlock
  const std::function<void()>* body = nullptr;
  std::vector<std::uint64_t> mailbox;  // two words per thread: shuffle source values
  std::vector<unsigned char> dynamic_smem;
  // per warp: lanes arrived at warp barrier n (slot n % 2), and the last barrier all passed
  struct warp_state {
    unsigned arrived[2] = {0, 0};
    std::int64_t complete = 0;
  };
  std::vector<warp_state> warps;
  // the block: live (not exited) threads, arrivals at __syncthreads n (slot n % 2), and the
  // last one all passed
  unsigned live = 0;
  unsigned block_arrived[2] = {0, 0};
  std::int64_t block_complete = 0;
};
inline scheduler sched;
// With EMU_REVERSE set (ctest's cuda_tests_emulated_reverse), threads and blocks are scheduled
// in reverse order, which exposes results that depend on execution order.
inline const bool reverse = std::getenv("EMU_REVERSE") != nullptr;

inline fiber& self() { return sched.fibers[sched.current]; }

#ifdef EMU_LS_FAST_SWITCH
extern "C" void emu_ls_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .weak emu_ls_switch
  .type emu_ls_switch, @function
emu_ls_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  popq %rax
  jmpq *%rax
  .size emu_ls_switch, .-emu_ls_switch
)");
inline void yield_to_scheduler() { emu_ls_switch(&self().sp, sched.main_sp); }
inline void resume(fiber& f) { emu_ls_switch(&sched.main_sp, f.sp); }
#else
inline void yield_to_scheduler() { swapcontext(&self().ctx, &sched.main); }
inline void resume(fiber& f) { swapcontext(&sched.main, &f.ctx); }
#endif

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "emulation: %s (block %u, thread %u)\n", what, blockIdx.x, sched.current);
  std::abort();
}

inline void fiber_entry() {
  (*sched.body)();
  self().done = true;
  --sched.live;
  ++sched.events;
#ifdef EMU_LS_FAST_SWITCH
  yield_to_scheduler();  // never resumed: the scheduler skips done fibers
  std::abort();
#endif
  // returning resumes uc_link (the scheduler)
}

/// Makes f start fiber_entry on `stack` at its first resume.
inline void start(fiber& f, std::vector<char>& stack) {
#ifdef EMU_LS_FAST_SWITCH
  auto top = reinterpret_cast<std::uintptr_t>(stack.data() + stack.size()) & ~std::uintptr_t{15};
  // emu_ls_switch pops six registers and the address it jumps to, fiber_entry, leaving the
  // stack aligned as at a call (rsp + 8 a multiple of 16)
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;  // fiber_entry's return address: it never returns
  *--sp = reinterpret_cast<void*>(&fiber_entry);
  for (int i = 0; i < 6; ++i) *--sp = nullptr;
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack.data();
  f.ctx.uc_stack.ss_size = stack.size();
  f.ctx.uc_link = &sched.main;
  makecontext(&f.ctx, fiber_entry, 0);
#endif
}

/// Lanes of the warp of thread t: [first, last).
inline void warp_range(unsigned t, unsigned& first, unsigned& last) {
  first = t / 32 * 32;
  last = first + 32 < sched.fibers.size() ? first + 32 : static_cast<unsigned>(sched.fibers.size());
}

/// Every lane of this warp arrives at its n-th warp barrier before any leaves it.
inline void warp_barrier(const char* where) {
  fiber& me = self();
  const std::int64_t n = ++me.warp_arrivals;
  ++sched.events;
  unsigned first, last;
  warp_range(sched.current, first, last);
  // O(1) per arrival: the last lane to arrive marks barrier n complete and clears its counter
  // (arrivals at n + 2, the next user of that counter, start only after n is complete)
  auto& w = sched.warps[sched.current / 32];
  if (++w.arrived[n % 2] == last - first) {
    w.arrived[n % 2] = 0;
    w.complete = n;
    return;
  }
  for (bool first_wait = true;; first_wait = false) {
    if (w.complete >= n) return;
    // still waiting after every lane had a turn: a lane that passed this barrier and then
    // exited is fine; one that exited before it is not
    if (!first_wait)
      for (unsigned l = first; l < last; ++l)
        if (sched.fibers[l].warp_arrivals < n && sched.fibers[l].done)
          fail("full-mask shuffle after a lane of the warp exited");
    me.waiting_at = where;
    yield_to_scheduler();
    me.waiting_at = nullptr;
  }
}

template <class T>
T exchange(T v, unsigned src_thread) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  const unsigned t = sched.current;
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  // One barrier per shuffle: the mailbox of warp barrier n is half n % 2. A lane writes that
  // half again only before barrier n + 2, i.e. after passing n + 1, which every lane enters
  // only after reading what it needed at barrier n.
  const std::size_t half = (self().warp_arrivals + 1) % 2 * sched.fibers.size();
  sched.mailbox[half + t] = bits;
  warp_barrier("shuffle");
  unsigned first, last;
  warp_range(t, first, last);
  if (src_thread >= last) fail("shuffle source lane outside the block");
  const std::uint64_t got = sched.mailbox[half + src_thread];
  T r;
  std::memcpy(&r, &got, sizeof(T));
  return r;
}

/// Bit l set for each lane l of this warp whose value equals ours (__match_any_sync): every lane
/// posts its value, one barrier, each reads all of its warp's posts.
inline unsigned match_any(std::uint64_t v) {
  const unsigned t = sched.current;
  const std::size_t half = (self().warp_arrivals + 1) % 2 * sched.fibers.size();
  sched.mailbox[half + t] = v;
  warp_barrier("__match_any_sync");
  unsigned first, last;
  warp_range(t, first, last);
  unsigned mask = 0;
  for (unsigned l = first; l < last; ++l)
    if (sched.mailbox[half + l] == v) mask |= 1u << (l - first);
  return mask;
}

/// Set by the emulated cudaStreamBeginCapture (emu_runtime.hpp): work is recorded here instead
/// of run, and replayed by cudaGraphLaunch.
inline std::vector<std::function<void()>>* capture = nullptr;

/// Serialises the work of host threads that launch concurrently (the expert-parallel device
/// loopback runs one thread per simulated rank): the scheduler and __shared__ statics are
/// process-wide, so one block runs at a time across all threads, as within one.
inline std::recursive_mutex& work_mutex() {
  static std::recursive_mutex m;
  return m;
}

/// Runs `work` now, or records it while a stream capture is open.
inline void enqueue(std::function<void()> work) {
  std::lock_guard lock(work_mutex());
  if (capture != nullptr) {
    capture->push_back(std::move(work));
  } else {
    work();
  }
}

/// Runs `grid` blocks of `block` fibers each; `smem` bytes of dynamic shared memory per block,
/// filled with 0xCD so that reading it before writing shows up as garbage.
inline void run_blocks(unsigned grid, unsigned block, std::size_t smem,
                       const std::function<void()>& body) {
  blockDim.x = block;
  gridDim.x = grid;
  sched.body = &body;
  constexpr std::size_t stack_bytes = 256 * 1024;
  static std::vector<std::vector<char>> stacks;
  for (unsigned bi = 0; bi < grid; ++bi) {
    blockIdx.x = reverse ? grid - 1 - bi : bi;
    sched.fibers.assign(block, fiber{});
    sched.mailbox.assign(2 * std::size_t{block}, 0);
    sched.dynamic_smem.assign(smem + 16, 0xCD);
    sched.warps.assign((block + 31) / 32, scheduler::warp_state{});
    sched.live = block;
    sched.block_arrived[0] = sched.block_arrived[1] = 0;
    sched.block_complete = 0;
    for (unsigned t = 0; t < block; ++t) {
      fiber& f = sched.fibers[t];
      // stacks are reused from block to block: allocating (and zeroing) 256 KiB per thread
      // per block dominated the run time of kernels with one block per token
      if (stacks.size() <= t) stacks.emplace_back(stack_bytes);
      start(f, stacks[t]);
    }
    unsigned live = block;
    while (live > 0) {
      const std::uint64_t before = sched.events;
      for (unsigned i = 0; i < block; ++i) {
        const unsigned t = reverse ? block - 1 - i : i;
        fiber& f = sched.fibers[t];
        if (f.done) continue;
        sched.current = t;
        threadIdx.x = t;
        resume(f);
        if (f.done) --live;
      }
      if (live > 0 && sched.events == before) {
        for (unsigned t = 0; t < block; ++t)
          if (!sched.fibers[t].done)
            std::fprintf(stderr, "  thread %u waits at %s\n", t,
                         sched.fibers[t].waiting_at ? sched.fibers[t].waiting_at : "?");
        fail("deadlock: no thread can advance");
      }
    }
  }
  sched.fibers.clear();
}

/// __syncthreads: waits until every live thread of the block has arrived. O(1) per arrival, as
/// the warp barrier: barrier n completes when its arrivals equal the live threads (a thread
/// that exits before it lowers that count; one that arrived cannot exit before it completes).
inline void block_barrier() {
  fiber& me = self();
  const std::int64_t n = ++me.block_arrivals;
  ++sched.events;
  unsigned& arrived = sched.block_arrived[n % 2];
  ++arrived;
  for (;;) {
    if (sched.block_complete >= n) return;
    if (arrived == sched.live) {
      arrived = 0;
      sched.block_complete = n;
      return;
    }
    me.waiting_at = "__syncthreads";
    yield_to_scheduler();
    me.waiting_at = nullptr;
  }
}

}  // namespace emu::ls
