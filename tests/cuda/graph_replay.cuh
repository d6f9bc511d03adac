// SPDX-License-Identifier: Apache-2.0
// Test helper: capture a launcher call into a CUDA graph and replay it, so every GPU test
// checks graph-capturability the same way.
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <moeroute/status.hpp>

#include <moeroute/cuda/device_buffer.cuh>

namespace moeroute::test {

/// Captures `launch(stream)` (which returns a moeroute::status) into a graph, then `replays`
/// times: `reset()` clobbers the outputs, the graph runs, `check()` compares the outputs.
template <class Launch, class Reset, class Check>
void capture_and_replay(cudaStream_t stream, Launch&& launch, Reset&& reset, Check&& check,
                        int replays = 2) {
  cudaGraph_t graph;
  cuda::throw_if_cuda_error(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal),
                            "begin capture");
  const status st = launch(stream);
  cuda::throw_if_cuda_error(cudaStreamEndCapture(stream, &graph), "end capture");
  INFO(st.message);
  REQUIRE(st.ok());
  cudaGraphExec_t exec;
  cuda::throw_if_cuda_error(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int rep = 0; rep < replays; ++rep) {
    reset();
    cuda::throw_if_cuda_error(cudaDeviceSynchronize(),
                              "sync");  // reset's memsets run on the legacy stream
    cuda::throw_if_cuda_error(cudaGraphLaunch(exec, stream), "graph launch");
    cuda::throw_if_cuda_error(cudaStreamSynchronize(stream), "sync");
    check();
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace moeroute::test
