// SPDX-License-Identifier: Apache-2.0
// The device expert-parallel launchers on the one-GPU loopback (R = 1..4 ranks as threads),
// against the host expert-parallel path on the same plan (ep_device_check.cuh). On a device
// and on the CPU emulation.
#include <catch2/catch.hpp>

#include "ep_device_check.cuh"

namespace ep = moeroute::ep;
namespace eo = moeroute::test::ep_oracle;
using moeroute::test::ep_device::device_vs_host;

TEST_CASE("ep device launchers on the one-GPU loopback equal the host path", "[cuda][ep][quick]") {
  const std::int32_t R = GENERATE(1, 2, 3, 4);
  const auto all = eo::scenarios(R);
  // dropless compact / block 4 table, global padded with after-drop renorm, per-source with a
  // shared fallback expert, per-source next_choice padded
  for (std::size_t i :
       {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{7}, std::size_t{8}}) {
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      std::vector<std::vector<std::string>> failures(R);
      ep::cuda::loopback_group(R).run([&](ep::cuda::loopback_transport& t, cudaStream_t stream) {
        failures[t.rank()] = bf16 ? device_vs_host<__nv_bfloat16>(t, t, stream, all[i])
                                  : device_vs_host<float>(t, t, stream, all[i]);
      });
      for (std::int32_t r = 0; r < R; ++r) {
        INFO(all[i].name << (bf16 ? " [bf16]" : " [f32]") << " R=" << R << " rank " << r);
        for (const auto& f : failures[r]) FAIL_CHECK(f);
      }
    }
  }
}
