// SPDX-License-Identifier: Apache-2.0
// Comparing a backend's dispatch with reference::dispatch (Catch2 assertions that name the
// first differing element), shared by the CUDA and the CPU backend tests.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include <moeroute/reference/dispatch.hpp>
#include <moeroute/types.hpp>

namespace moeroute::test {

/// Everything a backend's dispatch wrote, on the host.
struct host_dispatch {
  std::vector<std::int32_t> expert, slot;
  std::vector<float> weight;
  std::vector<fate> fates;
  std::vector<std::int64_t> requested, kept, rerouted, dropped, received, load;
  dispatch_totals totals{};
};

template <class A, class B>
void require_same(const char* what, const std::vector<A>& got, const std::vector<B>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto g = static_cast<std::int64_t>(got[i]);
    const auto w = static_cast<std::int64_t>(want[i]);
    if (g != w) FAIL(what << "[" << i << "]: got " << g << ", expected " << w);
  }
}

/// Every element bit for bit (floats compared as bits), the first difference named.
template <class T>
void require_bits(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0)
      FAIL(what << "[" << i << "]: got " << +got[i] << ", expected " << +want[i]);
}

/// A backend's dispatch == reference dispatch: integers exactly, weights within 1e-6 relative.
inline void require_matches(const host_dispatch& h, const reference::dispatch_output& r) {
  require_same("expert", h.expert, r.expert);
  require_same("slot", h.slot, r.slot);
  REQUIRE(h.fates == r.fates);
  require_same("requested", h.requested, r.requested);
  require_same("kept", h.kept, r.kept);
  require_same("rerouted", h.rerouted, r.rerouted);
  require_same("dropped", h.dropped, r.dropped);
  require_same("received", h.received, r.received);
  require_same("load", h.load, r.load);
  const dispatch_totals want = r.totals();
  CHECK(h.totals.capacity == want.capacity);
  CHECK(h.totals.fallback_capacity == want.fallback_capacity);
  CHECK(h.totals.kept == want.kept);
  CHECK(h.totals.rerouted == want.rerouted);
  CHECK(h.totals.dropped == want.dropped);
  CHECK(h.totals.masked == want.masked);
  CHECK(h.totals.reroute_rounds == want.reroute_rounds);
  require_bits("weight", h.weight, r.weight);
}

/// Bitwise equality of two runs (weights compared as bits).
inline void require_bitwise(const host_dispatch& a, const host_dispatch& b) {
  REQUIRE(a.expert == b.expert);
  REQUIRE(a.slot == b.slot);
  REQUIRE(a.fates == b.fates);
  REQUIRE(a.weight.size() == b.weight.size());
  REQUIRE(std::memcmp(a.weight.data(), b.weight.data(), a.weight.size() * sizeof(float)) == 0);
  REQUIRE(a.requested == b.requested);
  REQUIRE(a.kept == b.kept);
  REQUIRE(a.rerouted == b.rerouted);
  REQUIRE(a.dropped == b.dropped);
  REQUIRE(a.received == b.received);
  REQUIRE(a.load == b.load);
  REQUIRE(std::memcmp(&a.totals, &b.totals, sizeof a.totals) == 0);
}

}  // namespace moeroute::test
