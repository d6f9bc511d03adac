// SPDX-License-Identifier: Apache-2.0
// The device expert-parallel layer over real NCCL, one rank per visible GPU in this process
// (ncclCommInitAll; NCCL 2.28 refuses two ranks on one GPU, so one GPU gives the 1-rank
// smoke test): every scenario, f32 and bf16, against the host path on the same plan (over a
// host loopback group of as many ranks: NCCL moves device rows only). Exit 77
// without a device (ctest: skipped), 0 when every rank passed, 1 otherwise.
#include <cstdio>
#include <exception>
#include <vector>

#include <moeroute/ep/loopback.hpp>
#include <moeroute/ep/nccl.cuh>

#include "../cuda/ep_device_check.cuh"

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("ep_nccl_tests: no CUDA device, skipped\n");
    return 77;
  }
  std::vector<ncclComm_t> comms(devices);
  std::vector<int> ids(devices);
  for (int i = 0; i < devices; ++i) ids[i] = i;
  if (ncclCommInitAll(comms.data(), devices, ids.data()) != ncclSuccess) {
    std::printf("ep_nccl_tests: ncclCommInitAll failed\n");
    return 1;
  }
  namespace eo = moeroute::test::ep_oracle;
  const auto all = eo::scenarios(devices);
  int failed = 0, checks = 0;
  for (const auto& s : all) {
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      ++checks;
      std::vector<std::vector<std::string>> failures(devices);
      // NCCL moves the device rows; a host loopback group of as many ranks carries the plan's
      // counts and the host path that gives the expected values. One thread per rank.
      try {
        moeroute::ep::loopback_group(devices).run([&](moeroute::ep::transport& host) {
          const int r = host.rank();
          cudaSetDevice(r);
          cudaStream_t stream;
          cudaStreamCreate(&stream);
          moeroute::ep::nccl_transport t(comms[r], stream);
          failures[r] =
              bf16 ? moeroute::test::ep_device::device_vs_host<__nv_bfloat16>(t, host, stream, s)
                   : moeroute::test::ep_device::device_vs_host<float>(t, host, stream, s);
          cudaStreamSynchronize(stream);
          cudaStreamDestroy(stream);
        });
      } catch (const std::exception& e) {
        failures[0].push_back(s.name + ": " + e.what());
      }
      for (int r = 0; r < devices; ++r)
        for (const auto& f : failures[r]) {
          std::printf("FAIL rank %d%s: %s\n", r, bf16 ? " [bf16]" : " [f32]", f.c_str());
          failed = 1;
        }
    }
  }
  for (auto c : comms) ncclCommDestroy(c);
  std::printf("ep_nccl_tests: %d ranks (one per GPU), %d checks, %s\n", devices, checks,
              failed ? "FAILED" : "all passed");
  return failed;
}
