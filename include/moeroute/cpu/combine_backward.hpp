// SPDX-License-Identifier: Apache-2.0
// CPU backend: the backward pass of combine — the operation and params of
// cuda::combine_backward (permute's: cpu/permute_backward.hpp). d expert_out and d x are
// bit-identical to the reference's (fp32, rank order, no fma contraction in this file); d weight is
// a dot product summed in 16 fixed lanes (the reference: sequentially), within fp32 rounding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <moeroute/config.hpp>
#include <moeroute/cpu/detail/rows.hpp>
#include <moeroute/cpu/element.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/combine_backward.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

MOEROUTE_PRECISE_FP_BEGIN
namespace moeroute::cpu {

using moeroute::combine_backward_params;

/// @brief Checks config, shapes and pointers (check_params); names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg,
                              const combine_backward_params<Element>& p) {
  static_assert(is_element_v<Element>, "Element must be float, half_bits or bf16_bits");
  return check_params(cfg, p);
}

namespace detail {

/// sum_c a[c] * b[c] in fp32, 16 fixed lanes then lane by lane then the tail
[[nodiscard]] inline float dot(const float* __restrict a, const float* __restrict b,
                               std::int64_t n) noexcept {
  constexpr int lanes = 16;
  float lane[lanes] = {};
  std::int64_t c = 0;
  for (; c + lanes <= n; c += lanes)
    for (int l = 0; l < lanes; ++l) lane[l] += a[c + l] * b[c + l];
  float s = 0.0f;
  for (int l = 0; l < lanes; ++l) s += lane[l];
  for (; c < n; ++c) s += a[c] * b[c];
  return s;
}

}  // namespace detail

/// @brief Combine backward on the CPU: d expert_out [rows, d] (padding rows 0), d weight [T, k]
///        (0 for assignments without a row) and, when d_grad_x is given, the residual
///        pass-through d x [T, d] (dy for a valid token with no row under drop_policy::residual,
///        else 0). Rows and tokens run in fixed blocks on `ex`.
/// @note Synchronous, no allocation. T = 0: d_grad_expert_out (all padding) gets 0.
template <class Element>
[[nodiscard]] status combine_backward(const routing_config& cfg,
                                      const combine_backward_params<Element>& p,
                                      const executor& ex = {}) {
  if (auto s = validate(cfg, p); !s) return s;
  const std::int32_t k = cfg.top_k;
  const std::int64_t d = p.hidden, n = p.tokens * k;
  if (auto s = rows::check_layout_rows(p.layout.d_assignment_row, n,
                                       p.rows > 0 && d > 0 ? p.layout.d_row_token : nullptr, p.rows,
                                       p.tokens);
      !s)
    return s;
  // d expert_out, row by row: the assignments of the row's token that hold it, in rank order
  if (p.rows > 0 && d > 0) {
    const std::int64_t tasks = task_count(p.rows, std::max<std::int64_t>(1, 8192 / d + 1));
    parallel_for(ex, tasks, [&](std::int64_t i) {
      std::int64_t begin, end;
      task_range(p.rows, tasks, i, begin, end);
      float acc[rows::tile], v[rows::tile];
      for (std::int64_t r = begin; r < end; ++r) {
        const std::int32_t t = p.layout.d_row_token[r];
        std::int64_t c0 = 0;
        if constexpr (rows::has_vector_path<Element>) {  // 16 columns at a time, in registers
          float wt[32];
          std::int32_t live = 0;
          if (t >= 0 && k <= 32)
            for (std::int32_t j = 0; j < k; ++j)
              if (p.layout.d_assignment_row[t * k + j] == r)
                wt[live++] = p.dispatched.d_weight[t * k + j];
          // the next row's token's dy, a line at a time (rows::prefetch_along)
          const std::int32_t t_next = r + 1 < p.rows ? p.layout.d_row_token[r + 1] : -1;
          const Element* dy_next = p.d_dy + (t_next >= 0 ? t_next : 0) * d;
          if (t < 0 || k <= 32)
            for (; c0 + 16 <= d; c0 += 16)
              for (std::int64_t c = c0; c < c0 + 16; c += rows::lanes) {  // (registers)
                if (t_next >= 0) rows::prefetch_along(dy_next, c);
                rows::f32l a = {}, x;
                if (live > 0) rows::load_lanes<rows::lanes>(p.d_dy + t * d + c, x);
                for (std::int32_t j = 0; j < live; ++j) a += wt[j] * x;
                rows::store_lanes<rows::lanes>(a, p.d_grad_expert_out + r * d + c);
              }
        }
        for (; c0 < d; c0 += rows::tile) {
          const std::int64_t w = std::min(rows::tile, d - c0);
          std::fill(acc, acc + w, 0.0f);
          if (t >= 0) {
            rows::load(p.d_dy + t * d + c0, w, v);
            for (std::int32_t j = 0; j < k; ++j) {
              if (p.layout.d_assignment_row[t * k + j] != r) continue;
              const float wt = p.dispatched.d_weight[t * k + j];
              for (std::int64_t c = 0; c < w; ++c) acc[c] += wt * v[c];
            }
          }
          rows::store(acc, w, p.d_grad_expert_out + r * d + c0);
        }
      }
    });
  }
  if (p.tokens == 0) return status::success();
  // d weight and the residual pass-through, token by token
  const bool residual = cfg.dispatch.dropped == drop_policy::residual;
  const std::int64_t tasks = task_count(p.tokens, std::max<std::int64_t>(1, 8192 / (d + 1) + 1));
  parallel_for(ex, tasks, [&](std::int64_t i) {
    std::int64_t begin, end;
    task_range(p.tokens, tasks, i, begin, end);
    float dy[rows::tile], v[rows::tile];
    for (std::int64_t t = begin; t < end; ++t) {
      bool any = false;
      for (std::int32_t j = 0; j < k; ++j) {
        const std::int64_t a = t * k + j;
        const std::int64_t row = p.layout.d_assignment_row[a];
        float total = 0.0f;
        if (row >= 0 && holds_row(p.dispatched.d_fate[a])) {
          any = true;
          std::int64_t c0 = 0;
          // 16 lanes over the row, folded by halves
          if constexpr (rows::has_vector_path<Element>) {
            // the next assignment's row (this token's next, or the next token's first), a line
            // at a time (rows::prefetch_along)
            const std::int64_t next_a = a + 1 < p.tokens * k ? a + 1 : a;
            const std::int64_t next_row = p.layout.d_assignment_row[next_a];
            const Element* ahead = p.d_expert_out + (next_row >= 0 ? next_row : row) * d;
            // (lane l of the 16 sums the columns c with c % 16 == l, held in registers of the
            // ISA's width: the fold's order, and so its bits, do not depend on the ISA)
            constexpr std::int32_t P = 16 / rows::lanes;
            rows::f32l part[P] = {}, g, x;
            for (; c0 + 16 <= d; c0 += 16)
              for (std::int32_t q = 0; q < P; ++q) {
                const std::int64_t c = c0 + q * rows::lanes;
                rows::prefetch_along(ahead, c);
                rows::load_lanes<rows::lanes>(p.d_dy + t * d + c, g);
                rows::load_lanes<rows::lanes>(p.d_expert_out + row * d + c, x);
                part[q] += g * x;
              }
            rows::f32x16 lanes;
            std::memcpy(&lanes, part, sizeof lanes);
            total = math::fold_sum(lanes);
          }
          for (; c0 < d; c0 += rows::tile) {
            const std::int64_t w = std::min(rows::tile, d - c0);
            rows::load(p.d_dy + t * d + c0, w, dy);
            rows::load(p.d_expert_out + row * d + c0, w, v);
            total += detail::dot(dy, v, w);
          }
        }
        p.d_grad_weight[a] = total;
      }
      if (p.d_grad_x == nullptr || d == 0) continue;
      const bool pass = residual && !any && p.dispatched.d_fate[t * k] != fate::masked;
      if (pass) {
        std::memcpy(static_cast<void*>(p.d_grad_x + t * d), p.d_dy + t * d,
                    static_cast<std::size_t>(d) * sizeof(Element));
      } else {
        std::memset(static_cast<void*>(p.d_grad_x + t * d), 0,
                    static_cast<std::size_t>(d) * sizeof(Element));
      }
    }
  });
  return status::success();
}

}  // namespace moeroute::cpu
MOEROUTE_PRECISE_FP_END
