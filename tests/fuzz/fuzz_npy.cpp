// SPDX-License-Identifier: Apache-2.0
// libFuzzer target over the planner's .npy reader (moeroute/planner/npy.hpp). Any byte string must
// give either a well-formed array or a status whose message starts "malformed .npy: " — no crash,
// no read past the bytes given, no allocation beyond them. Invariants checked on success: a 2-D or
// 3-D non-negative shape, prod(shape) values, data that fills the input exactly, the header
// parse agreeing with the whole-file parse, values equal to the bytes decoded by hand, and any
// truncation of a good file rejected.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>

#include <moeroute/planner/npy.hpp>

#define NPY_CHECK(cond)                                                                      \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "fuzz_npy: invariant violated: %s (line %d)\n", #cond, __LINE__); \
      __builtin_trap();                                                                      \
    }                                                                                        \
  } while (0)

namespace io = moeroute::io;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  io::npy_array a;
  const moeroute::status s = io::parse_npy(bytes, a);

  // the numeric reader (ids, biases): success with prod(shape) values, or a malformed message
  io::npy_numeric num;
  const moeroute::status sn = io::parse_npy_numeric(bytes, num);
  if (sn.ok()) {
    std::uint64_t m = 1;
    for (std::int64_t e : num.shape) m *= static_cast<std::uint64_t>(e);
    NPY_CHECK(num.values.size() == m);
  } else {
    NPY_CHECK(sn.message.rfind("malformed .npy: ", 0) == 0);
  }

  // the header parser given only a prefix must never read past it
  io::npy_header hp;
  const moeroute::status sp = io::parse_npy_header(bytes.first(size / 2), size, hp);
  if (sp.ok()) NPY_CHECK(hp.data_offset <= size / 2);

  if (!s.ok()) {
    NPY_CHECK(s.code == moeroute::status_code::invalid_argument);
    NPY_CHECK(s.message.rfind("malformed .npy: ", 0) == 0);
    return 0;
  }
  io::npy_header h;
  NPY_CHECK(io::parse_npy_header(bytes, size, h).ok());
  NPY_CHECK(h.shape == a.shape && h.dtype == a.dtype);
  NPY_CHECK(a.shape.size() == 2 || a.shape.size() == 3);
  std::uint64_t n = 1;
  for (std::int64_t e : a.shape) {
    NPY_CHECK(e >= 0);
    n *= static_cast<std::uint64_t>(e);
  }
  NPY_CHECK(a.values.size() == n);
  NPY_CHECK(h.data_bytes == n * io::item_size(h.dtype));
  NPY_CHECK(h.data_offset + h.data_bytes == size);
  NPY_CHECK(a.layers() * a.tokens() * a.experts() == static_cast<std::int64_t>(n));
  if (sp.ok()) NPY_CHECK(hp.shape == h.shape && hp.data_offset == h.data_offset);
  // values are the data bytes, widened exactly (bit-for-bit for f32, NaN stays NaN)
  for (std::size_t i = 0; i < n && i < 64; ++i) {
    const std::uint8_t* p = data + h.data_offset + i * io::item_size(h.dtype);
    float want;
    if (h.dtype == io::npy_dtype::f32) {
      std::uint32_t u = 0;
      for (int b = 0; b < 4; ++b) u |= std::uint32_t{p[h.big_endian ? 3 - b : b]} << (8 * b);
      std::memcpy(&want, &u, 4);
    } else {
      const std::uint16_t u =
          static_cast<std::uint16_t>(p[h.big_endian ? 1 : 0] | (p[h.big_endian ? 0 : 1] << 8));
      want = moeroute::to_float(moeroute::half_bits{u});
    }
    NPY_CHECK((std::isnan(want) && std::isnan(a.values[i])) ||
              std::memcmp(&want, &a.values[i], 4) == 0);
  }
  // a truncated good file is always rejected
  if (size > 0) {
    io::npy_array t;
    NPY_CHECK(!io::parse_npy(bytes.first(size - 1), t).ok());
  }
  return 0;
}
