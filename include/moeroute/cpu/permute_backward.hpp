// SPDX-License-Identifier: Apache-2.0
// CPU backend: the backward pass of permute — the operation and params of
// cuda::permute_backward, the bits of reference::permute_backward (fp32, each token's distinct
// rows in rank order; no fma contraction in this file).
#pragma once

#include <algorithm>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/cpu/detail/rows.hpp>
#include <moeroute/cpu/element.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/permute_backward.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::cpu {

using moeroute::permute_backward_params;

/// @brief Checks config, shapes and pointers (check_params); names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg,
                              const permute_backward_params<Element>& p) {
  static_assert(is_element_v<Element>, "Element must be float, half_bits or bf16_bits");
  return check_params(cfg, p);
}

/// @brief Permute backward on the CPU: d x[t] = (accumulate ? d x[t] : 0) + the sum of
///        d buf over token t's distinct rows in rank order (fp32): bit-identical to
///        reference::permute_backward. Tokens run in fixed blocks on `ex`.
/// @note Synchronous, no allocation. T = 0 or d = 0: success, nothing written.
template <class Element>
[[nodiscard]] status permute_backward(const routing_config& cfg,
                                      const permute_backward_params<Element>& p,
                                      const executor& ex = {}) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0 || p.hidden == 0) return status::success();
  const std::int32_t k = cfg.top_k;
  const std::int64_t d = p.hidden;
  if (auto s = rows::check_layout_rows(p.layout.d_assignment_row, p.tokens * k, nullptr, p.rows,
                                       p.tokens);
      !s)
    return s;
  const std::int64_t tasks = task_count(p.tokens, std::max<std::int64_t>(1, 8192 / d + 1));
  parallel_for(ex, tasks, [&](std::int64_t i) {
    std::int64_t begin, end;
    task_range(p.tokens, tasks, i, begin, end);
    float acc[rows::tile], v[rows::tile];
    for (std::int64_t t = begin; t < end; ++t) {
      const std::int64_t* rows_of = p.layout.d_assignment_row + t * k;
      std::int64_t c0 = 0;
      if constexpr (rows::has_vector_path<Element>) {  // 16 columns at a time, in registers
        const Element* distinct[32];
        std::int32_t live = 0;
        if (k <= 32)
          for (std::int32_t j = 0; j < k; ++j) {
            const std::int64_t row = rows_of[j];
            bool seen = row < 0;
            for (std::int32_t i2 = 0; i2 < j && !seen; ++i2) seen = rows_of[i2] == row;
            if (!seen) distinct[live++] = p.d_grad_buf + row * d;
          }
        // the next token's rows, a line at a time (rows::prefetch_along)
        const Element* ahead[32];
        std::int32_t next = 0;
        if (k <= 32 && t + 1 < p.tokens)
          for (std::int32_t j = 0; j < k; ++j)
            if (const std::int64_t row = rows_of[k + j]; row >= 0)
              ahead[next++] = p.d_grad_buf + row * d;
        if (k <= 32)
          for (; c0 + 16 <= d; c0 += 16)
            for (std::int64_t c = c0; c < c0 + 16; c += rows::lanes) {  // (registers)
              for (std::int32_t j = 0; j < next; ++j) rows::prefetch_along(ahead[j], c);
              rows::f32l a = {}, x;
              if (p.accumulate) rows::load_lanes<rows::lanes>(p.d_grad_x + t * d + c, a);
              for (std::int32_t j = 0; j < live; ++j) {
                rows::load_lanes<rows::lanes>(distinct[j] + c, x);
                a += x;
              }
              rows::store_lanes<rows::lanes>(a, p.d_grad_x + t * d + c);
            }
      }
      for (; c0 < d; c0 += rows::tile) {
        const std::int64_t w = std::min(rows::tile, d - c0);
        if (p.accumulate) {
          rows::load(p.d_grad_x + t * d + c0, w, acc);
        } else {
          std::fill(acc, acc + w, 0.0f);
        }
        for (std::int32_t j = 0; j < k; ++j) {
          const std::int64_t row = rows_of[j];
          bool seen = row < 0;
          for (std::int32_t i2 = 0; i2 < j && !seen; ++i2) seen = rows_of[i2] == row;
          if (seen) continue;
          rows::load(p.d_grad_buf + row * d + c0, w, v);
          for (std::int64_t c = 0; c < w; ++c) acc[c] += v[c];
        }
        rows::store(acc, w, p.d_grad_x + t * d + c0);
      }
    }
  });
  return status::success();
}

}  // namespace moeroute::cpu
MOEROUTE_PRECISE_FP_END
