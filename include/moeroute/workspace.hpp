// SPDX-License-Identifier: Apache-2.0
// Caller-owned workspace: a size query in plain C++ and a carver that hands out sub-buffers at
// 256-byte alignment (as CUB does), so launchers never allocate.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moeroute {

inline constexpr std::size_t workspace_alignment = 256;

[[nodiscard]] constexpr std::size_t align_up(std::size_t n,
                                             std::size_t a = workspace_alignment) noexcept {
  return (n + a - 1) / a * a;
}

/// @brief Accumulates sub-buffer sizes (sizing pass) or hands out pointers (carving pass) with
///        the same sequence of calls, so the two can never disagree.
class workspace_carver {
 public:
  /// Sizing pass: base = nullptr. Carving pass: base = the caller's buffer.
  explicit workspace_carver(void* base = nullptr, std::size_t capacity = 0) noexcept
      : base_(static_cast<std::byte*>(base)), capacity_(capacity) {}

  /// @brief Reserves `count` elements of T; returns nullptr in the sizing pass.
  template <class T>
  T* take(std::size_t count) noexcept {
    const std::size_t at = used_;
    used_ = align_up(used_ + count * sizeof(T));
    if (base_ == nullptr) return nullptr;
    return reinterpret_cast<T*>(base_ + at);
  }

  [[nodiscard]] std::size_t bytes() const noexcept { return used_; }
  /// True when the carving pass fits in the caller's buffer.
  [[nodiscard]] bool fits() const noexcept { return used_ <= capacity_; }

 private:
  std::byte* base_;
  std::size_t capacity_;
  std::size_t used_ = 0;
};

}  // namespace moeroute
