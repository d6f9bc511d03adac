// SPDX-License-Identifier: Apache-2.0
// CPU emulation shim (tests/emulation/README.md): not CUDA, not CUB.
#pragma once
namespace cub { template <class T, int N> struct BlockScan { static_assert(N == 1, "emulation: 1 thread");
  struct TempStorage {}; explicit BlockScan(TempStorage&) {} void ExclusiveSum(T in, T& out, T& agg) { out = T{}; agg = in; } }; }
