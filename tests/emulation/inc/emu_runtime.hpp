// SPDX-License-Identifier: Apache-2.0
// The few CUDA runtime calls the GPU tests make (tests/cuda/device_buffer.cuh, the harnesses),
// on host memory, so that the GPU test code itself runs against the lock-step emulation
// (tests/emulation/README.md). "Device" memory is 256-byte aligned host memory; copies and
// memsets are immediate; synchronisation is a no-op. Include after emu_lockstep.hpp and before
// any test header.
//
// Graph capture is emulated too: between cudaStreamBeginCapture and cudaStreamEndCapture every
// launch and async memset is recorded instead of run, and cudaGraphLaunch replays the record.
// A launcher that reads results on the host during capture therefore sees stale memory, as it
// would on a GPU.
#pragma once

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include <cuda_runtime.h>

#include <emu_lockstep.hpp>

namespace emu::rt {

template <class T>
cudaError_t malloc_device(T** p, std::size_t bytes) {
  const std::size_t n = (bytes + 255) / 256 * 256;
  *p = static_cast<T*>(std::aligned_alloc(256, n == 0 ? 256 : n));
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(static_cast<void*>(*p), 0xA5, n == 0 ? 256 : n);  // device memory is not zeroed
  return cudaSuccess;
}
inline cudaError_t free_device(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t copy(void* dst, const void* src, std::size_t n) {
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind) { return copy(dst, src, n); }
inline cudaError_t copy_async(void* dst, const void* src, std::size_t n, cudaMemcpyKind, cudaStream_t = nullptr) {
  return copy(dst, src, n);
}

// Graph capture: a graph is the list of recorded launches and memsets (emu::ls::capture).
struct graph_record {
  std::vector<std::function<void()>> steps;
};
inline graph_record* capturing = nullptr;

inline cudaError_t set(void* p, int v, std::size_t n) {
  if (capturing) {
    capturing->steps.push_back([p, v, n] { std::memset(p, v, n); });
  } else if (n) {
    std::memset(p, v, n);
  }
  return cudaSuccess;
}
inline cudaError_t set_async(void* p, int v, std::size_t n, cudaStream_t = nullptr) { return set(p, v, n); }

inline cudaError_t sync() { return cudaSuccess; }
inline cudaError_t sync_stream(cudaStream_t) { return cudaSuccess; }
inline cudaError_t stream_create(cudaStream_t* s) {
  static int token = 0;
  *s = reinterpret_cast<cudaStream_t>(&++token);
  return cudaSuccess;
}
inline cudaError_t stream_destroy(cudaStream_t) { return cudaSuccess; }
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
inline cudaError_t instantiate(cudaGraphExec_t* e, cudaGraph_t g, cudaGraphNode_t*, char*, std::size_t) {
  return instantiate(e, g);
}
inline cudaError_t graph_launch(cudaGraphExec_t e, cudaStream_t) {
  for (auto& f : reinterpret_cast<graph_record*>(e)->steps) f();
  return cudaSuccess;
}
inline cudaError_t graph_destroy(cudaGraph_t g) {
  delete reinterpret_cast<graph_record*>(g);
  return cudaSuccess;
}
inline cudaError_t graph_exec_destroy(cudaGraphExec_t) { return cudaSuccess; }

}  // namespace emu::rt

#define cudaMalloc(p, n) emu::rt::malloc_device((p), (n))
#define cudaFree(p) emu::rt::free_device(p)
#define cudaMemcpy(...) emu::rt::copy(__VA_ARGS__)
#define cudaMemcpyAsync(...) emu::rt::copy_async(__VA_ARGS__)
#undef cudaMemsetAsync
#define cudaMemset(p, v, n) emu::rt::set((p), (v), (n))
#define cudaMemsetAsync(...) emu::rt::set_async(__VA_ARGS__)
#define cudaDeviceSynchronize() emu::rt::sync()
#define cudaStreamSynchronize(s) emu::rt::sync_stream(s)
#define cudaStreamCreate(s) emu::rt::stream_create(s)
#define cudaStreamDestroy(s) emu::rt::stream_destroy(s)
#define cudaStreamBeginCapture(s, m) emu::rt::begin_capture((s), (m))
#define cudaStreamEndCapture(s, g) emu::rt::end_capture((s), (g))
#define cudaGraphInstantiate(...) emu::rt::instantiate(__VA_ARGS__)
#define cudaGraphLaunch(e, s) emu::rt::graph_launch((e), (s))
#define cudaGraphDestroy(g) emu::rt::graph_destroy(g)
#define cudaGraphExecDestroy(e) emu::rt::graph_exec_destroy(e)
