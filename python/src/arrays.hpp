// SPDX-License-Identifier: Apache-2.0
// The arrays of one binding call, looked at through DLPack: each named argument is checked
// against what the operation needs (dtype, exact shape, C-contiguous, on the call's device)
// and turned into a raw pointer for the params struct. Every failure raises moeroute.Error
// with the operation and the argument in its message. Read-only numpy arrays, which numpy
// will not export through DLPack, are read through the buffer protocol instead (inputs only).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <moeroute/status.hpp>

#include "dlpack.hpp"

namespace moeroute::python {

namespace py = pybind11;

/// Raised for every bad argument and every failed library status (moeroute.Error in Python).
struct binding_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Raises binding_error "<op>: <code>: <message>" for a failed status (no prefix without op).
void raise_if(const status& s, const std::string& op = {});

/// The element types arrays of the binding hold.
enum class elem : std::uint8_t { f32, f16, bf16, f64, i32, i64, u8 };

[[nodiscard]] const char* elem_name(elem e) noexcept;
/// numpy / torch dtype name -> elem (float32, float16, bfloat16, float64, int32, int64, uint8).
[[nodiscard]] std::optional<elem> elem_from_name(const std::string& s) noexcept;

/// What an operation needs of one array: its name, shape and dtype.
struct spec {
  std::string name;
  std::vector<std::int64_t> shape;
  elem dtype = elem::f32;
};

/// Where the arrays of a call live.
struct device_place {
  std::int32_t type = dl::cpu;  ///< dl::device_type
  std::int32_t id = 0;
  friend bool operator==(const device_place&, const device_place&) = default;
};

/// One array argument after the checks.
struct array_view {
  void* data = nullptr;
  elem dtype = elem::f32;
  std::vector<std::int64_t> shape;
  device_place place;
};

/// @brief The named arrays of one call (a dict name -> numpy array / torch tensor / any
///        __dlpack__ producer). Keeps every capsule alive until the call returns.
class call_arrays {
 public:
  /// @param op the operation, for messages ("gating")
  /// @param stream passed to __dlpack__(stream=...) for device arrays (a CUDA stream handle)
  /// @param device_arrays accept CUDA arrays (a CUDA backend's call); else CPU arrays only
  call_arrays(std::string op, py::dict arrays, std::optional<std::intptr_t> stream = {},
              bool device_arrays = false);

  /// True when `name` is given (and not None), or preset.
  [[nodiscard]] bool has(const std::string& name) const;

  /// @brief Gives `name` as an array already looked at: later reads take `v` without a
  ///        DLPack or buffer hand-over (fused route: an input read once for four stages, and
  ///        the outputs it carved from its one buffer). Replaces an earlier preset of `name`.
  void preset(const std::string& name, const array_view& v);

  /// @brief The array `s.name`: exactly shape `s.shape` and dtype `s.dtype`, or null when it
  ///        is absent and not `required`. `writable`: the call writes it.
  [[nodiscard]] void* get(const spec& s, bool required, bool writable);

  template <class T>
  [[nodiscard]] T* in(const spec& s, bool required) {
    return static_cast<T*>(get(s, required, false));
  }
  template <class T>
  [[nodiscard]] T* out(const spec& s, bool required) {
    return static_cast<T*>(get(s, required, true));
  }

  /// @brief An array whose dtype is one of `allowed` (the element type of a templated op) and
  ///        whose shape is `shape` (-1 = any extent there, read back from the array).
  [[nodiscard]] array_view view(const std::string& name, const std::vector<std::int64_t>& shape,
                                const std::vector<elem>& allowed, bool writable);

  /// The device every array seen so far lives on (CPU before the first).
  [[nodiscard]] device_place place() const noexcept { return place_; }

  /// Raises moeroute.Error "<op>: <what>".
  [[noreturn]] void fail(const std::string& what) const;

 private:
  array_view look(const std::string& name, bool writable);

  std::string op_;
  py::dict arrays_;
  std::optional<std::intptr_t> stream_;
  std::vector<py::object> keep_;       // capsules and buffer owners, alive for the call
  std::vector<py::buffer_info> bufs_;  // buffer-protocol views of read-only inputs
  std::vector<std::pair<std::string, array_view>> presets_;
  device_place place_{};
  bool placed_ = false;
  bool device_arrays_ = false;
};

/// "[2, 3]"; a negative extent (any, in an expected shape) prints as *.
[[nodiscard]] std::string shape_text(const std::vector<std::int64_t>& s);

}  // namespace moeroute::python
