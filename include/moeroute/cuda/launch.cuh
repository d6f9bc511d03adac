// SPDX-License-Identifier: Apache-2.0
// Launcher plumbing shared by every CUDA op: CUDA error -> status, grid sizing, and the one
// checked launch every kernel goes through.
//
// The launch seam. `launch()` is the only place a kernel is started. It uses
// cudaLaunchKernelEx, whose return value is the error of this launch alone, so a launcher never
// calls cudaGetLastError (which would also report, and clear, an error the caller's own code
// left behind). A build that defines MOEROUTE_EMULATION (the CPU emulation of the test suite,
// tests/emulation/) supplies `moeroute_emulation::launch` with the same arguments, and every
// kernel then runs on the host, thread by thread.
//
// Programmatic dependent launch (Hopper and later): with MOEROUTE_CUDA_PDL=1 in the
// environment, launch() gives each kernel compiled for sm_90 or later the
// programmatic-stream-serialization attribute, so its blocks may be scheduled while the kernel
// before it in the stream finishes (a decode step's chain of small kernels then overlaps the
// launch latencies). Safe because every moeroute kernel first waits for the grids it depends on
// (kernels::enter_after_prior_grid, kernels/moeroute/kernels/grid_dependency.cuh). Off by
// default until a device run has measured it (docs/gpu-results.md); the attribute is given
// only where the kernel's PTX is sm_90's, i.e. where that wait is compiled in.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include <cuda_runtime.h>

#include <moeroute/status.hpp>

namespace moeroute::cuda {

/// @brief Turns a cudaError_t into a status naming the call that failed.
[[nodiscard]] inline status from_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return status::success();
  return status::make(status_code::cuda_error, std::string(what) + ": " + cudaGetErrorName(e) +
                                                   ": " + cudaGetErrorString(e));
}

/// @brief Blocks for n items at `threads` per block, at least 1 and at most `cap`.
[[nodiscard]] inline unsigned grid_for(std::int64_t n, int threads,
                                       std::int64_t cap = 65535LL * 32) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b);
}

/// Grid, block and dynamic shared memory of one launch.
struct launch_shape {
  unsigned grid = 1;
  unsigned block = 1;
  std::size_t smem = 0;
};

/// @brief One block per row (grid-stride past 65535 * 16 rows), its threads over the row's
///        `chunks` accesses: a multiple of 32 from 32 to 256.
[[nodiscard]] inline launch_shape row_shape(std::int64_t rows, std::int64_t chunks) {
  std::int64_t threads = (chunks + 31) / 32 * 32;
  threads = threads < 32 ? 32 : (threads > 256 ? 256 : threads);
  const std::int64_t blocks = rows < 1 ? 1 : (rows > 65535LL * 16 ? 65535LL * 16 : rows);
  return {static_cast<unsigned>(blocks), static_cast<unsigned>(threads), 0};
}

/// @brief True when MOEROUTE_CUDA_PDL=1 (read once per process).
[[nodiscard]] inline bool programmatic_launch_requested() {
  static const bool on = [] {
    const char* v = std::getenv("MOEROUTE_CUDA_PDL");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

/// @brief Whether `kernel` may be launched as a programmatic dependent of the kernel before it:
///        requested, and the kernel's code for the current device compiled from sm_90 PTX or
///        later (older PTX, JIT-compiled for a newer device, has no griddepcontrol.wait).
///        Cached per thread by (device, kernel): the attribute query costs a driver call.
[[nodiscard]] inline bool programmatic_launch(const void* kernel) {
  if (!programmatic_launch_requested()) return false;
#if defined(MOEROUTE_EMULATION)
  (void)kernel;
  return false;
#else
  struct entry {
    const void* kernel = nullptr;
    int device = -1;
    bool allowed = false;
  };
  thread_local std::array<entry, 64> cache{};
  thread_local std::size_t next = 0;
  // (a failed query is cleared from the thread's last error, where the caller's next
  // cudaGetLastError would take it for its own: the launch then goes without the attribute)
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  for (const entry& e : cache)
    if (e.kernel == kernel && e.device == device) return e.allowed;
  cudaFuncAttributes attributes{};
  const cudaError_t queried = cudaFuncGetAttributes(&attributes, kernel);
  if (queried != cudaSuccess) (void)cudaGetLastError();
  const bool allowed = queried == cudaSuccess && attributes.ptxVersion >= 90;
  cache[next] = {kernel, device, allowed};
  next = (next + 1) % cache.size();
  return allowed;
#endif
}

/// @brief Launches `kernel` with `args` on `stream` and returns the launch's own status
///        (`name` goes into the message). Arguments convert to the kernel's parameter types,
///        as in a <<<>>> launch. Asynchronous; never synchronises, never clears the runtime's
///        last-error state.
template <class... Params, class... Args>
[[nodiscard]] status launch(const char* name, void (*kernel)(Params...), launch_shape shape,
                            cudaStream_t stream, Args&&... args) {
#if defined(MOEROUTE_EMULATION)
  return from_cuda(moeroute_emulation::launch(kernel, shape.grid, shape.block, shape.smem, stream,
                                              std::forward<Args>(args)...),
                   name);
#else
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(shape.grid);
  config.blockDim = dim3(shape.block);
  config.dynamicSmemBytes = shape.smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  if (programmatic_launch(reinterpret_cast<const void*>(kernel))) {
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  return from_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), name);
#endif
}

}  // namespace moeroute::cuda
