// SPDX-License-Identifier: Apache-2.0
#include "arrays.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <utility>

namespace moeroute::python {

namespace {

struct elem_info {
  elem e;
  const char* name;
  std::uint8_t code;  // dl::type_code
  std::uint8_t bits;
};

constexpr elem_info elems[] = {
    {elem::f32, "float32", dl::float_, 32},   {elem::f16, "float16", dl::float_, 16},
    {elem::bf16, "bfloat16", dl::bfloat, 16}, {elem::f64, "float64", dl::float_, 64},
    {elem::i32, "int32", dl::int_, 32},       {elem::i64, "int64", dl::int_, 64},
    {elem::u8, "uint8", dl::uint_, 8},
};

std::optional<elem> from_dl(dl::data_type t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == dl::bool_ && t.bits == 8) return elem::u8;  // bool masks read as uint8 0 / 1
  for (const auto& i : elems)
    if (i.code == t.code && i.bits == t.bits) return i.e;
  return std::nullopt;
}

std::optional<elem> from_buffer_format(const std::string& f, py::ssize_t itemsize) {
  std::string c = f;
  if (!c.empty() && (c[0] == '<' || c[0] == '=' || c[0] == '@')) c = c.substr(1);
  if (c == "f") return elem::f32;
  if (c == "d") return elem::f64;
  if (c == "e") return elem::f16;
  if (c == "B" || c == "?") return elem::u8;
  if ((c == "i" || c == "l" || c == "q") && itemsize == 4) return elem::i32;
  if ((c == "l" || c == "q") && itemsize == 8) return elem::i64;
  return std::nullopt;
}

/// True when strides (in `unit`s; null: row-major by definition) lay `shape` out row-major.
/// An extent of 1 may have any stride, and an array without elements is row-major whatever
/// its strides say (numpy 2 hands out odd ones for empty arrays).
template <class Extent, class Stride>
bool row_major(const Extent* shape, const Stride* strides, std::size_t ndim, std::int64_t unit) {
  if (strides == nullptr) return true;
  for (std::size_t d = 0; d < ndim; ++d)
    if (shape[d] == 0) return true;
  std::int64_t expect = unit;
  for (std::size_t d = ndim; d-- > 0;) {
    if (shape[d] != 1 && static_cast<std::int64_t>(strides[d]) != expect) return false;
    expect *= static_cast<std::int64_t>(shape[d]);
  }
  return true;
}

std::string dl_type_text(dl::data_type t) {
  return "code " + std::to_string(t.code) + " bits " + std::to_string(t.bits) +
         (t.lanes != 1 ? " lanes " + std::to_string(t.lanes) : "");
}

}  // namespace

const char* elem_name(elem e) noexcept {
  for (const auto& i : elems)
    if (i.e == e) return i.name;
  return "?";
}

std::optional<elem> elem_from_name(const std::string& s) noexcept {
  for (const auto& i : elems)
    if (s == i.name) return i.e;
  return std::nullopt;
}

std::string shape_text(const extents& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i)
    t += (i ? ", " : "") + (s[i] < 0 ? std::string("*") : std::to_string(s[i]));
  return t + "]";
}

void raise_if(const status& s, const std::string& op) {
  if (!s) throw binding_error((op.empty() ? "" : op + ": ") + to_string(s.code) + ": " + s.message);
}

call_arrays::call_arrays(std::string op, py::dict arrays, std::optional<std::intptr_t> stream,
                         bool device_arrays)
    : op_(std::move(op)),
      arrays_(std::move(arrays)),
      stream_(stream),
      device_arrays_(device_arrays) {
  presets_.reserve(64);  // a fused route presets ~40: no regrowth
}

void call_arrays::fail(const std::string& what) const { throw binding_error(op_ + ": " + what); }

std::size_t call_arrays::slot_of(std::string_view name) noexcept {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return static_cast<std::size_t>(h ^ (h >> 32)) & (preset_slots - 1);
}

std::size_t call_arrays::preset_index(std::string_view name) const noexcept {
  for (std::size_t s = slot_of(name);; s = (s + 1) & (preset_slots - 1)) {
    const std::size_t i = preset_table_[s];
    if (i == 0) return presets_.size();  // an empty slot: not preset
    if (presets_[i - 1].name == name) return i - 1;
  }
}

const array_view* call_arrays::preset_of(std::string_view name) const noexcept {
  const std::size_t i = preset_index(name);
  return i < presets_.size() ? &presets_[i].view : nullptr;
}

bool call_arrays::given(std::string_view name) const {
  const py::str key(name.data(), name.size());
  return arrays_.contains(key) && !arrays_[key].is_none();
}

bool call_arrays::has(std::string_view name) const {
  return preset_of(name) != nullptr || given(name);
}

void call_arrays::preset(std::string_view name, const array_view& v) {
  if (const std::size_t i = preset_index(name); i < presets_.size()) {
    presets_[i].view = v;
    return;
  }
  if (presets_.size() >= preset_slots / 2)  // (a fused route makes ~40)
    throw std::logic_error("moeroute binding: more than 128 preset arrays in one call");
  std::size_t s = slot_of(name);
  while (preset_table_[s] != 0) s = (s + 1) & (preset_slots - 1);
  presets_.push_back({std::string(name), v});
  preset_table_[s] = static_cast<std::uint16_t>(presets_.size());
}

const array_view& call_arrays::placed(const array_view& v) {
  if (!placed_) {
    place_ = v.place;
    placed_ = true;
  }
  return v;
}

array_view call_arrays::look(std::string_view name_view, bool writable) {
  const std::string name(name_view);
  py::object obj = arrays_[py::str(name)];
  // an input that requires grad (a stage is not differentiable; moeroute.torch is): its values
  if (!writable && py::hasattr(obj, "requires_grad") && obj.attr("requires_grad").cast<bool>())
    obj = obj.attr("detach")();
  array_view v;
  const bool dlpack = py::hasattr(obj, "__dlpack__");
  py::object cap;
  if (dlpack) {
    try {
      // Device arrays are handed over on the call's stream: the producer orders its pending
      // work before it there (a stream wait, never a host sync).
      // (DLPack names the legacy default stream 1; 0 is reserved as ambiguous)
      const bool on_device =
          stream_ && py::hasattr(obj, "__dlpack_device__") &&
          obj.attr("__dlpack_device__")()[py::int_(0)].cast<std::int32_t>() != dl::cpu;
      cap = on_device ? obj.attr("__dlpack__")(py::arg("stream") = *stream_ == 0 ? 1 : *stream_)
                      : obj.attr("__dlpack__")();
    } catch (py::error_already_set& e) {
      // numpy refuses read-only arrays (DLPack v0 cannot say read-only); read those through
      // the buffer protocol below, and only as inputs.
      if (writable || !e.matches(PyExc_BufferError) || !PyObject_CheckBuffer(obj.ptr()))
        fail(name + ": cannot be exported through DLPack (" +  // the error, not its traceback
             py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
             py::str(e.value()).cast<std::string>() + ")");
      cap = py::object();
    }
  }
  if (cap) {
    if (!PyCapsule_IsValid(cap.ptr(), dl::capsule_name))
      fail(name + ": __dlpack__ did not return a DLPack capsule");
    auto* m = static_cast<dl::managed_tensor*>(PyCapsule_GetPointer(cap.ptr(), dl::capsule_name));
    const dl::tensor& t = m->dl_tensor;
    keep_.push_back(cap);  // the producer frees the tensor with the capsule, after the call
    const auto e = from_dl(t.dtype);
    if (!e) fail(name + ": unsupported dtype (DLPack " + dl_type_text(t.dtype) + ")");
    v.dtype = *e;
    if (!v.shape.assign(t.shape, t.shape + t.ndim))
      fail(name + ": more than " + std::to_string(extents::max_rank) + " dimensions");
    if (!row_major(t.shape, t.strides, static_cast<std::size_t>(t.ndim), 1))
      fail(name +
           ": must be contiguous (row-major); call .contiguous() or "
           "numpy.ascontiguousarray() first");
    v.data = static_cast<char*>(t.data) + t.byte_offset;
    v.place = {t.dev.device_type == dl::cuda_host ? dl::cpu : t.dev.device_type,
               t.dev.device_type == dl::cuda_host ? 0 : t.dev.device_id};
  } else if (PyObject_CheckBuffer(obj.ptr()) && !writable) {
    py::buffer_info b = py::reinterpret_borrow<py::buffer>(obj).request(false);
    const auto e = from_buffer_format(b.format, b.itemsize);
    if (!e) fail(name + ": unsupported dtype (buffer format '" + b.format + "')");
    v.dtype = *e;
    if (!v.shape.assign(b.shape.begin(), b.shape.end()))
      fail(name + ": more than " + std::to_string(extents::max_rank) + " dimensions");
    if (!row_major(b.shape.data(), b.strides.data(), b.shape.size(), b.itemsize))
      fail(name + ": must be contiguous (row-major); call numpy.ascontiguousarray() first");
    v.data = b.ptr;
    v.place = {dl::cpu, 0};
    keep_.push_back(obj);
    bufs_.push_back(std::move(b));
  } else {
    fail(name + ": expected a numpy array or a torch tensor (an object with __dlpack__), got " +
         py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>() +
         (writable ? " (outputs must be writable)" : ""));
  }
  if (v.place.type != dl::cpu && v.place.type != dl::cuda && v.place.type != dl::cuda_managed)
    fail(name + ": arrays must be on the CPU or a CUDA device (DLPack device type " +
         std::to_string(v.place.type) + ")");
  if (v.place.type != dl::cpu && !device_arrays_)
    fail(name +
         ": on a CUDA device, and this call runs on the CPU (this build of the package "
         "has the CPU backend only): pass CPU arrays (tensor.cpu())");
  if (!placed_) {
    place_ = v.place;
    placed_ = true;
  } else if (!(v.place == place_)) {
    fail(name +
         ": on a different device than the call's other arrays (every array of one "
         "call must be on the same device)");
  }
  return v;
}

void* call_arrays::get(const spec& s, bool required, bool writable) {
  if (const array_view* p = preset_of(s.name))
    return checked(s.name, placed(*p), s.shape, s.dtype).data;
  if (!given(s.name)) {
    if (required) fail(s.name + ": required here, but not given");
    return nullptr;
  }
  return checked(s.name, look(s.name, writable), s.shape, s.dtype).data;
}

array_view call_arrays::view(std::string_view name, const extents& shape, elem_set allowed,
                             bool writable) {
  if (const array_view* p = preset_of(name)) return checked(name, placed(*p), shape, allowed);
  if (!given(name)) fail(std::string(name) + ": required here, but not given");
  return checked(name, look(name, writable), shape, allowed);
}

array_view call_arrays::checked(std::string_view name, const array_view& v, const extents& shape,
                                elem_set allowed) const {
  if (!allowed.has(v.dtype)) {
    std::string names;  // (the message only when it is needed: a call views ~50 arrays)
    for (const auto& i : elems)
      if (allowed.has(i.e)) names += (names.empty() ? "" : ", ") + std::string(i.name);
    fail(std::string(name) + ": dtype " + elem_name(v.dtype) + ", expected " +
         (allowed.several() ? "one of " : "") + names);
  }
  bool shape_ok = v.shape.size() == shape.size();
  for (std::size_t i = 0; shape_ok && i < shape.size(); ++i)
    shape_ok = shape[i] < 0 || shape[i] == v.shape[i];
  if (!shape_ok)
    fail(std::string(name) + ": shape " + shape_text(v.shape) + ", expected " + shape_text(shape));
  return v;
}

}  // namespace moeroute::python
