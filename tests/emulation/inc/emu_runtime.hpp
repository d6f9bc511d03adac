// SPDX-License-Identifier: Apache-2.0
// The CUDA runtime calls the GPU tests make, on host memory, so that the test code itself runs
// against the lock-step emulation (README.md). "Device" memory is 256-byte aligned host memory
// filled with 0xA5 (device memory is not zeroed); copies and memsets are immediate, or recorded
// while a stream is captured; synchronisation is a no-op (everything has run by then).
//
// Graph capture: between cudaStreamBeginCapture and cudaStreamEndCapture every launch, async
// memset and async copy is recorded instead of run, and cudaGraphLaunch replays the record. A
// launcher that read results on the host during capture would therefore see stale memory, as it
// would on a GPU. Included by emu_cuda.hpp.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include <cuda_runtime.h>

namespace emu::rt {

template <class T>
cudaError_t malloc_device(T** p, std::size_t bytes) {
  const std::size_t n = (bytes + 255) / 256 * 256;
  *p = static_cast<T*>(std::aligned_alloc(256, n == 0 ? 256 : n));
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(static_cast<void*>(*p), 0xA5, n == 0 ? 256 : n);
  return cudaSuccess;
}
inline cudaError_t free_device(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t copy(void* dst, const void* src, std::size_t n,
                        cudaMemcpyKind = cudaMemcpyDefault) {
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t copy_async(void* dst, const void* src, std::size_t n,
                              cudaMemcpyKind = cudaMemcpyDefault, cudaStream_t = nullptr) {
  emu::ls::enqueue([=] {
    if (n) std::memmove(dst, src, n);
  });
  return cudaSuccess;
}
inline cudaError_t set(void* p, int v, std::size_t n) {
  if (n) std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t set_async(void* p, int v, std::size_t n, cudaStream_t = nullptr) {
  emu::ls::enqueue([=] {
    if (n) std::memset(p, v, n);
  });
  return cudaSuccess;
}
inline cudaError_t no_op() { return cudaSuccess; }
inline cudaError_t stream_create(cudaStream_t* s) {
  static int tokens[4096];
  static std::atomic<int> next{0};
  *s = reinterpret_cast<cudaStream_t>(&tokens[next++ % 4096]);
  return cudaSuccess;
}
// Events order work across streams; everything here has run when it was enqueued, so an
// event is only a handle.
inline cudaError_t event_create(cudaEvent_t* e) {
  static int tokens[4096];
  static std::atomic<int> next{0};
  *e = reinterpret_cast<cudaEvent_t>(&tokens[next++ % 4096]);
  return cudaSuccess;
}

// Graph capture: a graph is the list of work recorded while capturing (emu::ls::capture).
struct graph_record {
  std::vector<std::function<void()>> steps;
};
inline graph_record* capturing = nullptr;

inline cudaError_t begin_capture(cudaStream_t, cudaStreamCaptureMode) {
  capturing = new graph_record;
  emu::ls::capture = &capturing->steps;
  return cudaSuccess;
}
inline cudaError_t end_capture(cudaStream_t, cudaGraph_t* g) {
  *g = reinterpret_cast<cudaGraph_t>(capturing);
  capturing = nullptr;
  emu::ls::capture = nullptr;
  return cudaSuccess;
}
inline cudaError_t instantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long = 0) {
  *e = reinterpret_cast<cudaGraphExec_t>(g);
  return cudaSuccess;
}
inline cudaError_t graph_launch(cudaGraphExec_t e, cudaStream_t) {
  for (auto& f : reinterpret_cast<graph_record*>(e)->steps) f();
  return cudaSuccess;
}
inline cudaError_t graph_destroy(cudaGraph_t g) {
  delete reinterpret_cast<graph_record*>(g);
  return cudaSuccess;
}

}  // namespace emu::rt

#define cudaMalloc(p, n) emu::rt::malloc_device((p), (n))
#define cudaFree(p) emu::rt::free_device(p)
#define cudaMemcpy(...) emu::rt::copy(__VA_ARGS__)
#define cudaMemcpyAsync(...) emu::rt::copy_async(__VA_ARGS__)
#define cudaMemset(p, v, n) emu::rt::set((p), (v), (n))
#define cudaMemsetAsync(...) emu::rt::set_async(__VA_ARGS__)
#define cudaDeviceSynchronize() emu::rt::no_op()
#define cudaStreamSynchronize(s) ((void)(s), emu::rt::no_op())
#define cudaStreamCreate(s) emu::rt::stream_create(s)
#define cudaStreamCreateWithFlags(s, f) ((void)(f), emu::rt::stream_create(s))
#define cudaStreamDestroy(s) ((void)(s), emu::rt::no_op())
#define cudaEventCreateWithFlags(e, f) ((void)(f), emu::rt::event_create(e))
#define cudaEventCreate(e) emu::rt::event_create(e)
#define cudaEventDestroy(e) ((void)(e), emu::rt::no_op())
#define cudaEventRecord(e, s) ((void)(e), (void)(s), emu::rt::no_op())
#define cudaStreamWaitEvent(s, e, f) ((void)(s), (void)(e), (void)(f), emu::rt::no_op())
#define cudaStreamBeginCapture(s, m) emu::rt::begin_capture((s), (m))
#define cudaStreamEndCapture(s, g) emu::rt::end_capture((s), (g))
#define cudaGraphInstantiate(...) emu::rt::instantiate(__VA_ARGS__)
#define cudaGraphLaunch(e, s) emu::rt::graph_launch((e), (s))
#define cudaGraphDestroy(g) emu::rt::graph_destroy(g)
#define cudaGraphExecDestroy(e) ((void)(e), emu::rt::no_op())
