// SPDX-License-Identifier: Apache-2.0
// The arrays of one binding call, looked at through DLPack: each named argument is checked
// against what the operation needs (dtype, exact shape, C-contiguous, on the call's device)
// and turned into a raw pointer for the params struct. Every failure raises moeroute.Error
// with the operation and the argument in its message. Read-only numpy arrays, which numpy
// will not export through DLPack, are read through the buffer protocol instead (inputs only).
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
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

/// An array's extents, held inline (a call looks at ~50 arrays: a heap vector each was most
/// of a small batch's binding cost). An array of more than max_rank dimensions is refused.
class extents {
 public:
  static constexpr std::size_t max_rank = 8;
  extents() = default;
  extents(std::initializer_list<std::int64_t> e) { must_assign(e.begin(), e.end()); }
  explicit extents(const std::vector<std::int64_t>& e) { must_assign(e.begin(), e.end()); }
  /// Copies [first, last); false (and empty) when there are more than max_rank.
  template <class It>
  bool assign(It first, It last) {
    n_ = 0;
    for (; first != last; ++first) {
      if (n_ == max_rank) {
        n_ = 0;
        return false;
      }
      d_[n_++] = static_cast<std::int64_t>(*first);
    }
    return true;
  }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] const std::int64_t* begin() const noexcept { return d_; }
  [[nodiscard]] const std::int64_t* end() const noexcept { return d_ + n_; }
  [[nodiscard]] std::int64_t operator[](std::size_t i) const noexcept { return d_[i]; }
  [[nodiscard]] std::vector<std::int64_t> vector() const { return {begin(), end()}; }

 private:
  template <class It>
  void must_assign(It first, It last) {  // a shape the binding writes itself: a bug if too long
    if (!assign(first, last)) throw std::length_error("moeroute binding: a shape of > 8 extents");
  }

  std::int64_t d_[max_rank] = {};
  std::size_t n_ = 0;
};

/// The dtypes an argument may have (a templated op takes several), as a bit set.
class elem_set {
 public:
  constexpr elem_set(elem e) noexcept : bits_(bit(e)) {}  // NOLINT: one dtype is a set
  constexpr elem_set(std::initializer_list<elem> es) noexcept {
    for (elem e : es) bits_ |= bit(e);
  }
  [[nodiscard]] constexpr bool has(elem e) const noexcept { return (bits_ & bit(e)) != 0; }
  [[nodiscard]] constexpr bool several() const noexcept { return (bits_ & (bits_ - 1)) != 0; }

 private:
  static constexpr std::uint32_t bit(elem e) noexcept { return 1u << static_cast<unsigned>(e); }
  std::uint32_t bits_ = 0;
};

/// What an operation needs of one array: its name, shape and dtype.
struct spec {
  std::string name;
  extents shape;
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
  extents shape;
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
  [[nodiscard]] bool has(std::string_view name) const;

  /// @brief Gives `name` as an array already looked at: later reads take `v` without a
  ///        DLPack or buffer hand-over (fused route: an input read once for four stages, and
  ///        the outputs it carved from its one buffer). Replaces an earlier preset of `name`.
  void preset(std::string_view name, const array_view& v);

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
  [[nodiscard]] array_view view(std::string_view name, const extents& shape, elem_set allowed,
                                bool writable);

  /// The device every array seen so far lives on (CPU before the first).
  [[nodiscard]] device_place place() const noexcept { return place_; }

  /// Raises moeroute.Error "<op>: <what>".
  [[noreturn]] void fail(const std::string& what) const;

 private:
  [[nodiscard]] std::size_t preset_index(std::string_view name) const noexcept;  // or size
  [[nodiscard]] const array_view* preset_of(std::string_view name) const noexcept;
  /// True when the caller's dict gives `name` (not None).
  [[nodiscard]] bool given(std::string_view name) const;
  /// `v` (a preset), the call's device taken from it if it is the first array seen.
  const array_view& placed(const array_view& v);
  /// The caller's array `name` (given) through DLPack or the buffer protocol.
  array_view look(std::string_view name, bool writable);
  /// `v` when its dtype is one of `allowed` and its shape `shape`; else raises, naming `name`.
  [[nodiscard]] array_view checked(std::string_view name, const array_view& v, const extents& shape,
                                   elem_set allowed) const;

  std::string op_;
  py::dict arrays_;
  std::optional<std::intptr_t> stream_;
  std::vector<py::object> keep_;       // capsules and buffer owners, alive for the call
  std::vector<py::buffer_info> bufs_;  // buffer-protocol views of read-only inputs
  /// Presets are found through an open-addressing table of 256 slots (index + 1, 0 empty)
  /// keyed by a hash of the name: a fused route makes ~40 presets and ~100 lookups, and a scan
  /// of them all was a fifth of its binding time.
  static constexpr std::size_t preset_slots = 256;
  [[nodiscard]] static std::size_t slot_of(std::string_view name) noexcept;
  struct preset_entry {
    std::string name;
    array_view view;
  };
  std::uint16_t preset_table_[preset_slots] = {};
  std::vector<preset_entry> presets_;
  device_place place_{};
  bool placed_ = false;
  bool device_arrays_ = false;
};

/// "[2, 3]"; a negative extent (any, in an expected shape) prints as *.
[[nodiscard]] std::string shape_text(const extents& s);

}  // namespace moeroute::python
