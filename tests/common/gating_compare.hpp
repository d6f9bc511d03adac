// SPDX-License-Identifier: Apache-2.0
// Comparing a backend's gating with reference::gating: the grid inputs the gating tests use,
// the outputs as host vectors, and the comparison that names the first mismatch. Shared by
// the CUDA tests (on a device and emulated) and the CPU backend's tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/names.hpp>
#include <moeroute/reference/gating.hpp>
#include <moeroute/status.hpp>

namespace moeroute::test {

/// Logits on a grid of 1/64 in [-8, 8): exact in f32 and f16, many exact ties, and two
/// different values always far apart compared with a rounding error of the score functions.
inline std::vector<float> grid_logits(std::int64_t T, std::int32_t E, std::uint32_t salt = 0) {
  std::vector<float> v(static_cast<std::size_t>(T * E));
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t h =
        static_cast<std::uint32_t>(i) * 2654435761u ^ (salt * 0x9E3779B9u + 0x7f4a7c15u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    v[i] = static_cast<float>(static_cast<int>(h % 1024u) - 512) / 64.0f;
  }
  return v;
}

/// Expert bias on a grid of 1/128 in [-0.25, 0.25].
inline std::vector<float> grid_bias(std::int32_t E) {
  std::vector<float> b(static_cast<std::size_t>(E));
  for (std::int32_t e = 0; e < E; ++e) b[e] = static_cast<float>((e * 37) % 65 - 32) / 128.0f;
  return b;
}

template <class In>
std::vector<In> convert(const std::vector<float>& v) {
  std::vector<In> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<In, half_bits>) {
      out[i] = to_half(v[i]);
    } else if constexpr (std::is_same_v<In, bf16_bits>) {
      out[i] = to_bf16(v[i]);
    } else {
      out[i] = v[i];
    }
  }
  return out;
}

/// Everything a backend's gating wrote, on the host.
struct gating_outputs {
  status st;
  std::vector<std::int32_t> ids, reroute_ids;
  std::vector<float> gates, logsumexp, token_priority;
  std::vector<std::uint8_t> second_skipped;
  std::vector<float> aux_scores;            // [T, E] when the harness asked for it, else empty
  std::vector<std::int32_t> aux_count_ids;  // [T, c] likewise
  std::vector<double> aux_score_sum, seq_score_sum;
  std::vector<std::int64_t> aux_count, seq_count, seq_tokens;
  std::int64_t valid_tokens = 0, nonfinite = 0;
  double z_sum_squares = 0.0;
};

inline bool close_rel(double a, double b, double rel, double abs_floor) {
  if (a == b) return true;
  return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b)) + abs_floor;
}

/// "" when every element agrees; else the first mismatch, named.
template <class T>
std::string first_mismatch(const char* what, const std::vector<T>& ref, const std::vector<T>& got,
                           double rel = 0.0, double abs_floor = 0.0, std::int64_t row = 0) {
  if (ref.size() != got.size())
    return std::string(what) + ": size " + std::to_string(got.size()) + " != reference " +
           std::to_string(ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const bool ok = std::is_integral_v<T> ? ref[i] == got[i]
                                          : close_rel(static_cast<double>(ref[i]),
                                                      static_cast<double>(got[i]), rel, abs_floor);
    if (!ok) {
      std::ostringstream o;
      o.precision(17);
      o << what << "[" << i;
      if (row > 0) o << " = (" << i / row << ", " << i % row << ")";
      o << "]: backend " << +got[i] << " vs reference " << +ref[i];
      return o.str();
    }
  }
  return "";
}

/// Compares every output of a backend's gating with the reference; "" when all agree.
/// ids, counts and token counts exactly; gates, logsumexp and sums within 1e-5 relative.
/// Why not bit for bit (GPU): the kernel's exp / log1p are correctly rounded (double, then float),
/// glibc's expf / log1pf in the reference are not always (1 ulp apart for ~0.06% / ~1% of
/// arguments), and the sigmoid / sqrt-softplus aux normalisation and the chunked aux sums add
/// in another order. Measured in the CPU emulation on random (off-grid) logits: gates at most
/// 3e-7 relative apart, aux sums 2e-7 absolute, ids identical; with the reference's exp /
/// log1p rounded like the kernel's, gates are bit-identical. The 1/64-grid logits keep
/// distinct selection values far apart, so ids must still match exactly.
inline std::string compare(const reference::gating_output& r, const gating_outputs& g) {
  if (!g.st.ok())
    return std::string("gating failed: ") + to_string(g.st.code) + ": " + g.st.message;
  if (r.tokens == 0) return "";
  std::string m;
  if (!(m = first_mismatch("ids", r.ids, g.ids, 0, 0, r.k)).empty()) return m;
  if (!(m = first_mismatch("reroute_ids", r.reroute_ids, g.reroute_ids, 0, 0, r.reroute_candidates))
           .empty())
    return m;
  if (!(m = first_mismatch("gates", r.gates, g.gates, 1e-5, 1e-30, r.k)).empty()) return m;
  if (!(m = first_mismatch("logsumexp", r.logsumexp, g.logsumexp, 1e-5, 1e-6)).empty()) return m;
  if (!(m = first_mismatch("token_priority", r.token_priority, g.token_priority, 1e-5, 1e-30))
           .empty())
    return m;
  if (!(m = first_mismatch("second_skipped", r.second_skipped, g.second_skipped)).empty()) return m;
  if (!g.aux_scores.empty() &&
      !(m = first_mismatch("aux_scores", r.aux_scores, g.aux_scores, 1e-5, 1e-30, r.experts))
           .empty())
    return m;
  if (!g.aux_count_ids.empty() &&
      !(m = first_mismatch("aux_count_ids", r.aux_count_ids, g.aux_count_ids, 0, 0,
                           static_cast<std::int64_t>(r.aux_count_ids.size()) /
                               std::max<std::int64_t>(1, r.tokens)))
           .empty())
    return m;
  if (!(m = first_mismatch("aux_count", r.aux_count, g.aux_count)).empty()) return m;
  if (!(m = first_mismatch("aux_score_sum", r.aux_score_sum, g.aux_score_sum, 1e-5, 1e-12)).empty())
    return m;
  if (r.valid_tokens != g.valid_tokens)
    return "valid_tokens: gpu " + std::to_string(g.valid_tokens) + " vs reference " +
           std::to_string(r.valid_tokens);
  if (r.nonfinite_logits != g.nonfinite)
    return "nonfinite: gpu " + std::to_string(g.nonfinite) + " vs reference " +
           std::to_string(r.nonfinite_logits);
  double z = 0.0;
  for (std::int64_t t = 0; t < r.tokens; ++t)
    if (r.valid[t]) z += static_cast<double>(r.logsumexp[t]) * r.logsumexp[t];
  if (!close_rel(z, g.z_sum_squares, 1e-5, 1e-12))
    return "z_sum_squares: gpu " + std::to_string(g.z_sum_squares) + " vs reference " +
           std::to_string(z);
  if (r.sequences > 0) {
    if (!(m = first_mismatch("seq_tokens", r.seq_tokens, g.seq_tokens)).empty()) return m;
    if (!(m = first_mismatch("seq_count", r.seq_count, g.seq_count, 0, 0, r.experts)).empty())
      return m;
    if (!(m = first_mismatch("seq_score_sum", r.seq_score_sum, g.seq_score_sum, 1e-5, 1e-12,
                             r.experts))
             .empty())
      return m;
  }
  return "";
}

/// A short description of a config for failure messages.
inline std::string describe(const routing_config& c, std::int64_t T) {
  std::ostringstream o;
  o << "T=" << T << " E=" << c.num_experts << " k=" << c.top_k
    << " score=" << to_string(c.gating.score) << " select=" << to_string(c.gating.select)
    << " stage=" << to_string(c.gating.stage) << " renorm=" << to_string(c.gating.renorm)
    << " bias=" << c.gating.expert_bias << " groups=" << c.gating.group_limit.groups << "/"
    << c.gating.group_limit.group_topk << " noise=" << to_string(c.gating.noise.kind) << "/"
    << to_string(c.gating.noise.target) << " counts=" << to_string(c.loss.counts) << "/"
    << to_string(c.loss.count_source) << " L=" << c.loss.sequence_length << "/"
    << to_string(c.loss.sequence_order) << "/" << to_string(c.loss.sequence_reduce)
    << " R=" << c.reroute_candidates();
  return o.str();
}

}  // namespace moeroute::test
