// SPDX-License-Identifier: Apache-2.0
// CPU backend: gather hidden states [T, d] into an expert layout [rows, d] — the operation and
// params of cuda::permute, the bits of reference::permute. Each row is one contiguous copy
// (rows::copy_bytes), with the next row's source asked for on the way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <moeroute/config.hpp>
#include <moeroute/cpu/detail/rows.hpp>
#include <moeroute/cpu/element.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/params/permute.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cpu {

using moeroute::permute_params;

/// @brief Checks config, shapes and pointers (check_params); names the first bad field.
template <class Element>
[[nodiscard]] status validate(const routing_config& cfg, const permute_params<Element>& p) {
  static_assert(is_element_v<Element>, "Element must be float, half_bits or bf16_bits");
  return check_params(cfg, p);
}

/// @brief out[row] = x[row_token[row]] for rows < *layout.d_num_rows (all `rows` when null);
///        padding rows (-1) get zeros. Rows run in fixed blocks on `ex`.
/// @return success, or invalid_* naming the field (a row_token outside [-1, T) included).
/// @note Synchronous, no allocation; an exact copy. T = 0 (or rows = 0, or d = 0): success,
///       nothing written; rows in [num_rows, rows) are not touched.
template <class Element>
[[nodiscard]] status permute(const routing_config& cfg, const permute_params<Element>& p,
                             const executor& ex = {}) {
  if (auto s = validate(cfg, p); !s) return s;
  if (p.tokens == 0 || p.rows == 0 || p.hidden == 0) return status::success();
  const std::int64_t used = p.layout.d_num_rows ? std::min(*p.layout.d_num_rows, p.rows) : p.rows;
  if (auto s = rows::check_layout_rows(nullptr, 0, p.layout.d_row_token, used, p.tokens); !s)
    return s;
  const std::int64_t d = p.hidden;
  const std::size_t bytes = static_cast<std::size_t>(d) * sizeof(Element);
  const std::int64_t tasks = task_count(used, std::max<std::int64_t>(1, 16384 / d + 1));
  // a large output goes past the caches, as combine's does (rows::stream_min_bytes), where
  // every row starts 64-byte aligned: the same bytes
  const bool stream = bytes % 64 == 0 && reinterpret_cast<std::uintptr_t>(p.d_out) % 64 == 0 &&
                      used * static_cast<std::int64_t>(bytes) >= rows::stream_min_bytes;
  parallel_for(ex, tasks, [&](std::int64_t i) {
    std::int64_t begin, end;
    task_range(used, tasks, i, begin, end);
    for (std::int64_t r = begin; r < end; ++r) {
      const std::int32_t t = p.layout.d_row_token[r];
      if (t < 0) {
        std::memset(static_cast<void*>(p.d_out + r * d), 0, bytes);
      } else {
        // the next row's source asked for along the copy: the rows are scattered over x (a
        // libc memcpy per row, the source left to the hardware's prefetch: 45-53 % of a plain
        // memcpy's bandwidth for Switch-Base; this: about 100 %)
        const std::int32_t tn = r + 1 < end ? p.layout.d_row_token[r + 1] : -1;
        rows::copy_bytes(p.d_out + r * d, p.d_x + t * d, bytes, tn >= 0 ? p.d_x + tn * d : nullptr,
                         stream);
      }
    }
    if (stream) rows::stream_fence();
  });
  return status::success();
}

}  // namespace moeroute::cpu
