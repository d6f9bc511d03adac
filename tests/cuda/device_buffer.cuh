// SPDX-License-Identifier: Apache-2.0
// Test helper: an owning device buffer (tests may allocate; launchers may not).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>

namespace moeroute::test {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : n_(n) {
    if (n) check_cuda(cudaMalloc(&p_, n * sizeof(T)), "cudaMalloc");
  }
  explicit device_buffer(const std::vector<T>& h) : device_buffer(h.size()) { upload(h); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  ~device_buffer() { if (p_) cudaFree(p_); }

  void upload(const std::vector<T>& h) {
    if (h.size() != n_) throw std::runtime_error("device_buffer::upload size mismatch");
    if (n_) check_cuda(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_) check_cuda(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  void fill_bytes(int byte) { if (n_) check_cuda(cudaMemset(p_, byte, n_ * sizeof(T)), "memset"); }
  [[nodiscard]] T* get() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace moeroute::test
