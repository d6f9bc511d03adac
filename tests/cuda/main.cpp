// SPDX-License-Identifier: Apache-2.0
// Catch2 main for the GPU tests: with no usable CUDA device the binary exits 77, which CTest
// reports as "skipped" (SKIP_RETURN_CODE 77) — never as a pass. Host code only (the runtime
// API), so the host compiler builds it; Catch2 runs from catch_runner.cpp.
#include "../catch_runner.hpp"

#include <cstdio>

#include <cuda_runtime.h>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("moeroute GPU tests: no CUDA device (%s) — skipping\n",
                e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("moeroute GPU tests on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  return moeroute::test::run_catch(argc, argv);
}
