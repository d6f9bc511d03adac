// SPDX-License-Identifier: Apache-2.0
// An owning device array for examples, tests and tools: the thin convenience layer that may
// allocate, and says so. cudaMalloc in the constructor, cudaFree in the destructor; upload and
// download synchronise. The launchers never use it — they take raw pointers to memory the
// caller owns, however the caller allocates it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <moeroute/cuda/launch.cuh>
#include <moeroute/status.hpp>

namespace moeroute::cuda {

/// @brief Throws moeroute::error (cuda_error, naming `what`) when `e` is not cudaSuccess.
inline void throw_if_cuda_error(cudaError_t e, const char* what) {
  throw_if_error(from_cuda(e, what));
}

/// @brief n elements of T in device memory. Size 0 holds a null pointer. Move-only.
/// @note Allocates (cudaMalloc) and synchronises (upload, download, fill_bytes): not for a
///       training step's hot path — allocate once, reuse.
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : n_(n) {
    if (n)
      throw_if_cuda_error(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc");
  }
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) { upload(host); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  ~device_buffer() { reset(); }

  /// Frees the memory; the buffer is then empty.
  void reset() noexcept {
    if (p_) (void)cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  [[nodiscard]] T* get() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return n_ * sizeof(T); }

  /// Copies `host` (exactly size() elements) to the device; synchronous.
  void upload(const std::vector<T>& host) {
    if (host.size() != n_)
      throw error(status::make(status_code::invalid_shape,
                               "device_buffer::upload: " + std::to_string(host.size()) +
                                   " elements for a buffer of " + std::to_string(n_)));
    if (n_)
      throw_if_cuda_error(cudaMemcpy(p_, host.data(), bytes(), cudaMemcpyHostToDevice),
                          "cudaMemcpy H2D");
  }
  /// The device contents, copied to the host; synchronous.
  [[nodiscard]] std::vector<T> download() const { return download(n_); }
  /// The first `count` elements (<= size()), copied to the host; synchronous. For a buffer a
  /// launcher fills only in part: copying the rest would read memory nothing wrote.
  [[nodiscard]] std::vector<T> download(std::size_t count) const {
    if (count > n_)
      throw error(status::make(status_code::invalid_shape,
                               "device_buffer::download: " + std::to_string(count) +
                                   " elements of a buffer of " + std::to_string(n_)));
    std::vector<T> host(count);
    if (count)
      throw_if_cuda_error(cudaMemcpy(host.data(), p_, count * sizeof(T), cudaMemcpyDeviceToHost),
                          "cudaMemcpy D2H");
    return host;
  }
  /// Sets every byte to `byte` (e.g. 0xFF to poison outputs before a launch); synchronous.
  void fill_bytes(int byte) {
    if (n_) throw_if_cuda_error(cudaMemset(p_, byte, bytes()), "cudaMemset");
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace moeroute::cuda
