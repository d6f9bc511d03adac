// SPDX-License-Identifier: Apache-2.0
// Synthetic router-logit batches for the capacity tool and the benchmarks. Deterministic: the
// same (scenario, T, E, parameters, seed) gives the same bits on every machine (Philox draws
// turned into floats with correctly rounded operations only, see moeroute/rng.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <moeroute/rng.hpp>

namespace moeroute::planner {

enum class scenario_kind { uniform, zipf, collapsed, homogeneous, mixed };

inline constexpr std::string_view scenario_names[] = {"uniform", "zipf", "collapsed", "homogeneous",
                                                      "mixed"};

inline const char* to_string(scenario_kind s) { return scenario_names[static_cast<int>(s)].data(); }

/// @return true and sets `out` when `name` is a scenario name.
inline bool parse_scenario(std::string_view name, scenario_kind& out) {
  for (int i = 0; i < 5; ++i)
    if (name == scenario_names[i]) {
      out = static_cast<scenario_kind>(i);
      return true;
    }
  return false;
}

struct scenario_params {
  double zipf_s = 1.2;              ///< Zipf exponent: expert popularity ~ 1 / rank^s
  double collapse_share = 0.5;      ///< collapsed: share p of tokens forced onto expert 0
  double homogeneous_noise = 0.05;  ///< homogeneous: per-token noise around one shared row
  std::int32_t mixed_sources = 64;  ///< mixed: number of distinct "documents" interleaved
  std::uint64_t seed = 1234;
};

namespace detail {
inline constexpr std::uint32_t stream_scenarios = 0xBE7C4u;  // the scenarios' own Philox stream

inline float normal_at(std::uint64_t seed, std::uint64_t index, std::uint64_t salt) {
  const auto r = rng::draw(seed, salt, stream_scenarios, index);
  return rng::normal(r.v[0], r.v[1]);
}
inline float gumbel_at(std::uint64_t seed, std::uint64_t index, std::uint64_t salt) {
  const auto r = rng::draw(seed, salt, stream_scenarios, index);
  return rng::gumbel(r.v[2]);
}
inline float uniform_at(std::uint64_t seed, std::uint64_t index, std::uint64_t salt) {
  const auto r = rng::draw(seed, salt, stream_scenarios, index);
  return rng::uniform_open(r.v[3]);
}
}  // namespace detail

/// @brief Router logits [T, E], row-major.
///   uniform:     iid N(0, 1): every expert equally likely, the balanced case.
///   zipf:        log(p_e) + Gumbel noise with p_e ~ 1/(rank+1)^s under a fixed random
///                permutation of the experts, so the top-1 choice is exactly Zipf(s)-distributed.
///   collapsed:   a share p of the tokens (chosen at random) puts +8 on expert 0, the rest are
///                uniform: router collapse onto one expert.
///   homogeneous: one shared N(0,1) row plus small noise: near-identical tokens (a batch from
///                one repetitive document), the batch-composition failure mode.
///   mixed:       `mixed_sources` such rows, tokens interleaved across them with noise 0.5:
///                the same batch mixed from many documents, for contrast.
inline std::vector<float> make_logits(scenario_kind kind, std::int64_t T, std::int32_t E,
                                      const scenario_params& p) {
  if (T < 0 || E < 1) throw std::invalid_argument("make_logits: T must be >= 0 and E >= 1");
  std::vector<float> x(static_cast<std::size_t>(T) * E);
  const std::uint64_t s = p.seed;
  const std::uint64_t uE = static_cast<std::uint64_t>(E);
  switch (kind) {
    case scenario_kind::uniform:
      for (std::int64_t i = 0; i < T * E; ++i) x[i] = detail::normal_at(s, i, 1);
      break;
    case scenario_kind::zipf: {
      // random permutation of the ranks (Fisher-Yates with Philox), so expert 0 is not special
      std::vector<std::int32_t> rank(E);
      for (std::int32_t e = 0; e < E; ++e) rank[e] = e;
      for (std::int32_t e = E - 1; e > 0; --e) {
        const auto j =
            static_cast<std::int32_t>(detail::uniform_at(s, e, 2) * static_cast<float>(e + 1));
        std::swap(rank[e], rank[j > e ? e : j]);
      }
      std::vector<float> logp(E);
      for (std::int32_t e = 0; e < E; ++e)
        logp[e] = static_cast<float>(-p.zipf_s * std::log(static_cast<double>(rank[e]) + 1.0));
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int32_t e = 0; e < E; ++e) {
          const std::uint64_t i = static_cast<std::uint64_t>(t) * uE + e;
          x[i] = logp[e] + detail::gumbel_at(s, i, 3);
        }
      break;
    }
    case scenario_kind::collapsed:
      for (std::int64_t t = 0; t < T; ++t) {
        const bool collapse = detail::uniform_at(s, t, 4) < p.collapse_share;
        for (std::int32_t e = 0; e < E; ++e) {
          const std::uint64_t i = static_cast<std::uint64_t>(t) * uE + e;
          x[i] = detail::normal_at(s, i, 5) + ((collapse && e == 0) ? 8.0f : 0.0f);
        }
      }
      break;
    case scenario_kind::homogeneous: {
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int32_t e = 0; e < E; ++e) {
          const std::uint64_t i = static_cast<std::uint64_t>(t) * uE + e;
          x[i] = detail::normal_at(s, e, 6) +
                 static_cast<float>(p.homogeneous_noise) * detail::normal_at(s, i, 7);
        }
      break;
    }
    case scenario_kind::mixed: {
      const std::int64_t src = p.mixed_sources < 1 ? 1 : p.mixed_sources;
      for (std::int64_t t = 0; t < T; ++t) {
        const std::uint64_t doc = static_cast<std::uint64_t>(t % src);
        for (std::int32_t e = 0; e < E; ++e) {
          const std::uint64_t i = static_cast<std::uint64_t>(t) * uE + e;
          x[i] = detail::normal_at(s, doc * uE + e, 8) + 0.5f * detail::normal_at(s, i, 9);
        }
      }
      break;
    }
  }
  return x;
}

}  // namespace moeroute::planner
