// SPDX-License-Identifier: Apache-2.0
// A router-logit dump ([layers, N, E] or [N, E], float32 or float16 .npy) memory-mapped
// read-only, so the capacity planner walks dumps larger than RAM: the kernel pages rows in as
// batches gather them and drops them under memory pressure. The header is parsed and checked
// by moeroute::io (the same checks as the in-memory reader, io::read_npy).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <moeroute/dtype.hpp>
#include <moeroute/planner/npy.hpp>
#include <moeroute/status.hpp>

namespace moeroute::planner {

/// @brief A read-only mapping of a logit dump. Move-only; unmaps on destruction.
class mapped_logits {
 public:
  mapped_logits() = default;
  mapped_logits(const mapped_logits&) = delete;
  mapped_logits& operator=(const mapped_logits&) = delete;
  mapped_logits(mapped_logits&& o) noexcept { *this = std::move(o); }
  mapped_logits& operator=(mapped_logits&& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(size_, o.size_);
    std::swap(header_, o.header_);
    return *this;
  }
  ~mapped_logits() {
    if (base_ != nullptr && size_ > 0) munmap(base_, size_);
  }

  /// @brief Maps `path`; invalid_argument naming the file for a missing or malformed one.
  [[nodiscard]] static status open(const std::string& path, mapped_logits& out) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return status::make(status_code::invalid_argument, "cannot open '" + path + "'");
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
      ::close(fd);
      return status::make(status_code::invalid_argument,
                          "'" + path + "' is empty or cannot be examined");
    }
    const auto size = static_cast<std::size_t>(st.st_size);
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED)
      return status::make(status_code::invalid_argument, "cannot map '" + path + "'");
    mapped_logits m;
    m.base_ = p;
    m.size_ = size;
    const auto* bytes = static_cast<const std::uint8_t*>(p);
    const std::size_t prefix = std::min<std::size_t>(size, io::npy_max_header_bytes + 16);
    if (auto s = io::parse_npy_header({bytes, prefix}, size, m.header_); !s)
      return status::make(s.code, path + ": " + s.message);
    out = std::move(m);
    return status::success();
  }

  /// @brief A view of logits already in memory ([layers, tokens, experts], float32 or float16,
  ///        little-endian), which the caller keeps alive; nothing is mapped or unmapped.
  [[nodiscard]] static mapped_logits view(const void* data, io::npy_dtype dtype,
                                          std::int64_t layers, std::int64_t tokens,
                                          std::int64_t experts) {
    mapped_logits m;
    m.base_ = const_cast<void*>(data);
    m.header_.dtype = dtype;
    m.header_.shape = {layers, tokens, experts};
    m.header_.data_offset = 0;
    return m;
  }

  [[nodiscard]] std::int64_t layers() const noexcept {
    return header_.shape.size() == 3 ? header_.shape[0] : 1;
  }
  [[nodiscard]] std::int64_t tokens() const noexcept {
    return header_.shape.empty() ? 0 : header_.shape[header_.shape.size() - 2];
  }
  [[nodiscard]] std::int64_t experts() const noexcept {
    return header_.shape.empty() ? 0 : header_.shape.back();
  }
  [[nodiscard]] io::npy_dtype dtype() const noexcept { return header_.dtype; }
  [[nodiscard]] const io::npy_header& header() const noexcept { return header_; }
  /// Bytes of the file mapped (0 for a view of memory the caller holds).
  [[nodiscard]] std::size_t mapped_bytes() const noexcept { return size_; }

  /// @brief Tells the kernel how the rows will be read (sequential for consecutive batches).
  void advise(bool sequential) const {
    if (base_ != nullptr && size_ > 0)
      madvise(base_, size_, sequential ? MADV_SEQUENTIAL : MADV_RANDOM);
  }

  /// @brief Rows `rows` of `layer` as float into out [rows.size(), E] (float16 widened
  ///        exactly, big-endian files swapped). Rows must be in [0, tokens()).
  void gather(std::int64_t layer, std::span<const std::int64_t> rows, float* out) const {
    const std::int64_t E = experts(), N = tokens();
    const std::size_t item = io::item_size(header_.dtype);
    const auto* data = static_cast<const std::uint8_t*>(base_) + header_.data_offset;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::uint8_t* src = data + static_cast<std::size_t>((layer * N + rows[i]) * E) * item;
      float* dst = out + static_cast<std::int64_t>(i) * E;
      if (header_.dtype == io::npy_dtype::f32 && !header_.big_endian) {
        std::memcpy(dst, src, static_cast<std::size_t>(E) * 4);
        continue;
      }
      for (std::int64_t e = 0; e < E; ++e) {
        const std::uint8_t* b = src + e * static_cast<std::int64_t>(item);
        if (header_.dtype == io::npy_dtype::f32) {
          const std::uint32_t u = std::uint32_t{b[3]} | (std::uint32_t{b[2]} << 8) |
                                  (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[0]} << 24);
          std::memcpy(dst + e, &u, 4);
        } else {
          const std::uint8_t lo = header_.big_endian ? b[1] : b[0];
          const std::uint8_t hi = header_.big_endian ? b[0] : b[1];
          dst[e] = to_float(half_bits{static_cast<std::uint16_t>(lo | (hi << 8))});
        }
      }
    }
  }

 private:
  void* base_ = nullptr;
  std::size_t size_ = 0;
  io::npy_header header_{};
};

}  // namespace moeroute::planner
