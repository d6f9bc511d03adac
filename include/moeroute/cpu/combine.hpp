// SPDX-License-Identifier: Apache-2.0
// CPU backend: weighted sum of expert outputs back into tokens — the operation and params of
// cuda::combine, the bits of reference::combine (fp32, rank order, every product and sum
// rounded on its own: this file is compiled without fma contraction).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <moeroute/config.hpp>
#include <moeroute/cpu/detail/rows.hpp>
#include <moeroute/cpu/element.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/combine.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::cpu {

using moeroute::combine_params;

/// Largest k whose rows combine() keeps in a small array for its 16-column path.
inline constexpr std::int32_t select_small_max_rows = 32;

/// @brief Checks config, shapes and pointers (check_params); names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const combine_params<Element>& p) {
  static_assert(is_element_v<Element>, "Element must be float, half_bits or bf16_bits");
  return check_params(cfg, p);
}

namespace detail {
/// @brief Columns [c, c + 16 Q) of one token's output: y = 0 + w0 v0 + w1 v1 + ... over its
///        `live` rows, in 16 Q / rows::lanes registers side by side (the reference's order and
///        rounding), the next token's rows asked for along the way (rows::prefetch_along).
template <std::int32_t Q, class Element>
[[gnu::always_inline]] inline void combine_step(const Element* const* row_ptr, const float* wt,
                                                std::int32_t live, const Element* const* next_ptr,
                                                std::int32_t next, std::int64_t c, Element* y,
                                                bool stream) noexcept {
  constexpr std::int32_t L = rows::lanes, V = 16 * Q / L;  // registers a step
  for (std::int32_t j = 0; j < next; ++j)
    for (std::int32_t v = 0; v < V; ++v) rows::prefetch_along(next_ptr[j], c + L * v);
  rows::f32l a[V] = {}, x[V];
  for (std::int32_t j = 0; j < live; ++j) {
    for (std::int32_t v = 0; v < V; ++v) rows::load_lanes<L>(row_ptr[j] + c + L * v, x[v]);
    for (std::int32_t v = 0; v < V; ++v) a[v] += wt[j] * x[v];
  }
  for (std::int32_t v = 0; v < V; ++v) rows::store_lanes<L>(a[v], y + c + L * v, stream);
}
}  // namespace detail

/// @brief y[t] = sum over j = 0..k-1 of weight[t, j] * expert_out[row(t, j)], in fp32 in rank
///        order (bit-identical to reference::combine); drop_policy::residual: a valid token
///        with no row gets y[t] = x[t] (copied). Tokens run in fixed blocks on `ex`.
/// @return success, or invalid_* naming the field (an assignment row outside [-1, rows)).
/// @note Synchronous, no allocation (a tile of floats on the stack). T = 0 or d = 0: success.
template <class Element>
[[nodiscard]] status combine(const routing_config& cfg, const combine_params<Element>& p,
                             const executor& ex = {}) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  const std::int32_t k = cfg.top_k;
  const std::int64_t n = p.tokens * k, d = p.hidden;
  const std::int64_t* rows_of = p.layout.d_assignment_row;
  if (auto s = rows::check_layout_rows(rows_of, n, nullptr, p.rows, p.tokens); !s) return s;
  const bool residual = cfg.dispatch.dropped == drop_policy::residual;
  const std::int64_t tasks = task_count(p.tokens, std::max<std::int64_t>(1, 8192 / d + 1));
  // a large output goes past the caches (rows::stream_min_bytes; the same values) where every
  // 16-column store of every row is aligned (an engine's tensors are: PyTorch's CPU allocator
  // aligns to 64 bytes). OLMoE / Qwen3 combine, T = 4096, d = 2048, 16 MiB out: 62 -> 68 % of
  // a memcpy's bandwidth; Mixtral 74 -> 100 % (measured)
  const bool stream =
      d % 16 == 0 && rows::stream_aligned(p.d_y) &&
      p.tokens * d * static_cast<std::int64_t>(sizeof(Element)) >= rows::stream_min_bytes;
  parallel_for(ex, tasks, [&](std::int64_t i) {
    std::int64_t begin, end;
    task_range(p.tokens, tasks, i, begin, end);
    float acc[rows::tile], v[rows::tile];
    for (std::int64_t t = begin; t < end; ++t) {
      bool any = false;
      for (std::int32_t j = 0; j < k; ++j) any = any || rows_of[t * k + j] >= 0;
      if (residual && !any && p.dispatched.d_fate[t * k] != fate::masked) {
        std::memcpy(static_cast<void*>(p.d_y + t * d), p.d_x + t * d,
                    static_cast<std::size_t>(d) * sizeof(Element));
        continue;
      }
      std::int64_t c0 = 0;
      if constexpr (rows::has_vector_path<Element>) {
        // 16 columns at a time, the k rows summed in a register: 0 + w0 v0 + w1 v1 + ..., the
        // reference's order and rounding (no fma in this file)
        const Element* row_ptr[select_small_max_rows];
        const Element* next_ptr[select_small_max_rows];
        float wt[select_small_max_rows];
        std::int32_t live = 0, next = 0;
        if (k <= select_small_max_rows) {
          for (std::int32_t j = 0; j < k; ++j)
            if (const std::int64_t row = rows_of[t * k + j]; row >= 0) {
              row_ptr[live] = p.d_expert_out + row * d;
              wt[live++] = p.dispatched.d_weight[t * k + j];
            }
          // the next token's rows are elsewhere in a large buffer: each asked for a line at a
          // time as this token's walk reaches it (whole rows up front: k = 8 combine ran at
          // 17 GB/s, 30 GB/s this way, on the EPYC of performance.md)
          if (t + 1 < p.tokens)  // across the task's end too: tasks are a few tokens
            for (std::int32_t j = 0; j < k; ++j)
              if (const std::int64_t row = rows_of[(t + 1) * k + j]; row >= 0)
                next_ptr[next++] = p.d_expert_out + row * d;
          // (the row's address held in a local: stores through Element* may alias p's fields,
          // which the compiler would otherwise reload every 16 columns)
          Element* const y = p.d_y + t * d;
          // 64 columns a step, four sums side by side: one 16-column sum a step left each
          // load's latency exposed (Switch-Base combine: 50 -> 55-61 % of a memcpy)
          for (; c0 + 64 <= d; c0 += 64)
            detail::combine_step<4>(row_ptr, wt, live, next_ptr, next, c0, y, stream);
          for (; c0 + 16 <= d; c0 += 16)
            detail::combine_step<1>(row_ptr, wt, live, next_ptr, next, c0, y, stream);
        }
      }
      for (; c0 < d; c0 += rows::tile) {
        const std::int64_t w = std::min(rows::tile, d - c0);
        // the next token's rows are elsewhere in a large buffer: ask for them a token ahead
        if (t + 1 < end)
          for (std::int32_t j = 0; j < k; ++j)
            if (const std::int64_t row = rows_of[(t + 1) * k + j]; row >= 0)
              rows::prefetch(p.d_expert_out + row * d + c0, w);
        std::fill(acc, acc + w, 0.0f);
        for (std::int32_t j = 0; j < k; ++j) {
          const std::int64_t row = rows_of[t * k + j];
          if (row < 0) continue;
          const float wt = p.dispatched.d_weight[t * k + j];
          rows::load(p.d_expert_out + row * d + c0, w, v);
          for (std::int64_t c = 0; c < w; ++c) acc[c] += wt * v[c];
        }
        rows::store(acc, w, p.d_y + t * d + c0);
      }
    }
    if (stream) rows::stream_fence();
  });
  return status::success();
}

}  // namespace moeroute::cpu
MOEROUTE_PRECISE_FP_END
