// SPDX-License-Identifier: Apache-2.0
// The DLPack ABI (v0.x, the "dltensor" capsule every numpy >= 1.22 and torch >= 1.10 hands
// out from __dlpack__()) and the one thing the binding does with it: look at an array's
// pointer, dtype, shape, strides and device while the capsule keeps the producer's memory
// alive. The structs are the ABI's, written out here so the package needs no dlpack header.
#pragma once

#include <cstdint>

namespace moeroute::python::dl {

enum device_type : std::int32_t { cpu = 1, cuda = 2, cuda_host = 3, cuda_managed = 13 };
enum type_code : std::uint8_t { int_ = 0, uint_ = 1, float_ = 2, bfloat = 4, bool_ = 6 };

struct device {
  std::int32_t device_type;
  std::int32_t device_id;
};

struct data_type {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct tensor {
  void* data;
  device dev;
  std::int32_t ndim;
  data_type dtype;
  std::int64_t* shape;
  std::int64_t* strides;  ///< in elements; null = compact row-major
  std::uint64_t byte_offset;
};

struct managed_tensor {
  tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(managed_tensor*);
};

/// The capsule name a producer gives an unconsumed DLManagedTensor.
inline constexpr const char* capsule_name = "dltensor";

}  // namespace moeroute::python::dl
