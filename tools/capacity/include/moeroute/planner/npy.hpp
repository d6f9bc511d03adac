// SPDX-License-Identifier: Apache-2.0
// Reader for NumPy's .npy format (what np.save writes), for router logits [T, E] or
// [layers, T, E] in float32 or float16. Plain C++20, header-only, no CUDA.
//
// Every malformed input is rejected with a status (or, from the throwing overloads, a
// moeroute::error) whose message says what is wrong and where; no input makes it crash, read
// out of bounds, or allocate more than the bytes it was given (the fuzz target relies on it).
//
// Accepted: magic "\x93NUMPY", versions 1.0 / 2.0 / 3.0, descr '<f4' '<f2' (and the
// big-endian '>f4' '>f2', byte-swapped on load), fortran_order False, a 2-D or 3-D shape, and
// exactly prod(shape) * itemsize data bytes after the header.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <moeroute/dtype.hpp>
#include <moeroute/status.hpp>

namespace moeroute::io {

/// Element types the reader understands.
enum class npy_dtype : std::uint8_t { f32, f16 };

[[nodiscard]] constexpr std::size_t item_size(npy_dtype t) noexcept {
  return t == npy_dtype::f32 ? 4 : 2;
}
[[nodiscard]] constexpr const char* to_string(npy_dtype t) noexcept {
  return t == npy_dtype::f32 ? "float32" : "float16";
}

/// What the header of a .npy file says.
struct npy_header {
  int major = 0, minor = 0;
  npy_dtype dtype = npy_dtype::f32;
  bool big_endian = false;
  std::vector<std::int64_t> shape;  ///< 2 or 3 extents, C order
  std::size_t data_offset = 0;      ///< first byte of the data (magic + lengths + header)
  std::size_t data_bytes = 0;       ///< prod(shape) * item size
  [[nodiscard]] std::int64_t elements() const noexcept {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
};

/// A loaded array, converted to float (float16 exactly widened).
struct npy_array {
  npy_dtype dtype = npy_dtype::f32;  ///< the dtype stored in the file
  std::vector<std::int64_t> shape;   ///< [T, E] or [layers, T, E]
  std::vector<float> values;         ///< prod(shape) values, C order
  [[nodiscard]] std::int64_t layers() const noexcept { return shape.size() == 3 ? shape[0] : 1; }
  [[nodiscard]] std::int64_t tokens() const noexcept {
    return shape.empty() ? 0 : shape[shape.size() - 2];
  }
  [[nodiscard]] std::int64_t experts() const noexcept { return shape.empty() ? 0 : shape.back(); }
};

/// Largest header numpy itself will write or read (format 2.0 allows 4 GiB; we cap it).
inline constexpr std::size_t npy_max_header_bytes = std::size_t{1} << 20;

namespace detail {

[[nodiscard]] inline status npy_bad(std::string m) {
  return status::make(status_code::invalid_argument, "malformed .npy: " + std::move(m));
}

inline std::string printable(std::string_view s, std::size_t max = 40) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

/// A tiny parser for the Python dict literal of a .npy header, e.g.
/// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class npy_header_parser {
 public:
  explicit npy_header_parser(std::string_view s) : s_(s) {}

  /// The dict's three values, unchecked.
  [[nodiscard]] status parse_dict(std::string& descr, bool& fortran,
                                  std::vector<std::int64_t>& shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_ws();
    if (!eat('{')) return err("header does not start with '{'");
    for (;;) {
      skip_ws();
      if (eat('}')) break;
      std::string key;
      if (auto st = parse_string(key); !st) return st;
      skip_ws();
      if (!eat(':')) return err("expected ':' after key '" + printable(key) + "'");
      skip_ws();
      if (key == "descr") {
        if (have_descr) return err("duplicate key 'descr'");
        have_descr = true;
        if (auto st = parse_string(descr); !st) return st;
      } else if (key == "fortran_order") {
        if (have_order) return err("duplicate key 'fortran_order'");
        have_order = true;
        if (auto st = parse_bool(fortran); !st) return st;
      } else if (key == "shape") {
        if (have_shape) return err("duplicate key 'shape'");
        have_shape = true;
        if (auto st = parse_shape(shape); !st) return st;
      } else {
        return err("unexpected key '" + printable(key) +
                   "' (a .npy header has exactly descr, "
                   "fortran_order and shape)");
      }
      skip_ws();
      if (eat(',')) continue;
      skip_ws();
      if (eat('}')) break;
      return err("expected ',' or '}' in the header dict");
    }
    skip_ws();
    if (pos_ != s_.size()) return err("trailing characters after the header dict");
    if (!have_descr) return npy_bad("header has no 'descr' key");
    if (!have_order) return npy_bad("header has no 'fortran_order' key");
    if (!have_shape) return npy_bad("header has no 'shape' key");
    if (fortran)
      return npy_bad(
          "fortran_order is True: save a C-ordered array "
          "(np.save(f, np.ascontiguousarray(a)))");
    return status::success();
  }

  /// A router-logit header: float32 / float16, 2-D or 3-D.
  [[nodiscard]] status parse(npy_header& h) {
    std::string descr;
    bool fortran = false;
    if (auto st = parse_dict(descr, fortran, h.shape); !st) return st;
    if (descr == "<f4") {
      h.dtype = npy_dtype::f32;
      h.big_endian = false;
    } else if (descr == "<f2") {
      h.dtype = npy_dtype::f16;
      h.big_endian = false;
    } else if (descr == ">f4") {
      h.dtype = npy_dtype::f32;
      h.big_endian = true;
    } else if (descr == ">f2") {
      h.dtype = npy_dtype::f16;
      h.big_endian = true;
    } else {
      return npy_bad("unsupported dtype descr '" + printable(descr) +
                     "': router logits must be float32 ('<f4') or float16 ('<f2'); convert with "
                     "arr.astype(np.float32)");
    }
    if (h.shape.size() != 2 && h.shape.size() != 3)
      return npy_bad(
          "shape has " + std::to_string(h.shape.size()) +
          " dimensions: expected 2 ([tokens, experts]) or 3 ([layers, tokens, experts])");
    return status::success();
  }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;

  [[nodiscard]] status err(const std::string& what) const {
    return npy_bad(what + " at header offset " + std::to_string(pos_) + " (header: \"" +
                   printable(s_, 120) + "\")");
  }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  [[nodiscard]] status parse_string(std::string& out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"'))
      return err("expected a quoted string");
    const char q = s_[pos_++];
    out.clear();
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\') return err("escape sequences are not supported in header strings");
      out += s_[pos_++];
      if (out.size() > 64) return err("string in header is too long");
    }
    if (!eat(q)) return err("unterminated string");
    return status::success();
  }
  [[nodiscard]] status parse_bool(bool& b) {
    const std::string_view rest = s_.substr(pos_);
    if (rest.substr(0, 4) == "True") {
      b = true;
      pos_ += 4;
      return status::success();
    }
    if (rest.substr(0, 5) == "False") {
      b = false;
      pos_ += 5;
      return status::success();
    }
    return err("fortran_order must be True or False");
  }
  [[nodiscard]] status parse_shape(std::vector<std::int64_t>& shape) {
    shape.clear();
    if (!eat('(')) return err("shape must be a tuple like (T, E)");
    for (;;) {
      skip_ws();
      if (eat(')')) break;
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9')
        return err("shape entries must be non-negative integers");
      std::int64_t v = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        const int digit = s_[pos_] - '0';
        if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10)
          return err("shape entry overflows int64");
        v = v * 10 + digit;
        ++pos_;
      }
      if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;  // Python 2 long suffix
      if (shape.size() >= 32) return err("shape has more than 32 dimensions");
      shape.push_back(v);
      skip_ws();
      if (eat(',')) continue;
      skip_ws();
      if (eat(')')) break;
      return err("expected ',' or ')' in shape");
    }
    return status::success();
  }
};

inline std::uint32_t read_le32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) |
         (std::uint32_t{p[3]} << 24);
}

}  // namespace detail

/// @brief Parses the preamble and header of a .npy file.
/// @param prefix    the first bytes of the file (at least the whole header; more is fine)
/// @param file_size total size of the file in bytes (the data must fill it exactly)
/// @param[out] h    the header; data_offset and data_bytes say where the data lies
/// @return success, or invalid_argument with a message starting "malformed .npy: ".
[[nodiscard]] inline status parse_npy_header(std::span<const std::uint8_t> prefix,
                                             std::size_t file_size, npy_header& h) {
  using detail::npy_bad;
  h = npy_header{};
  static constexpr std::uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (prefix.size() < 6 || std::memcmp(prefix.data(), magic, 6) != 0)
    return npy_bad(
        "bad magic: the file does not start with \"\\x93NUMPY\" (is it a .npy file "
        "written by np.save? .npz archives and pickles are not supported)");
  if (prefix.size() < 8) return npy_bad("file ends inside the version bytes");
  h.major = prefix[6];
  h.minor = prefix[7];
  if ((h.major != 1 && h.major != 2 && h.major != 3) || h.minor != 0)
    return npy_bad("unsupported format version " + std::to_string(h.major) + "." +
                   std::to_string(h.minor) + " (supported: 1.0, 2.0, 3.0)");
  const std::size_t len_bytes = h.major == 1 ? 2 : 4;
  if (prefix.size() < 8 + len_bytes) return npy_bad("file ends inside the header length");
  const std::size_t header_len =
      h.major == 1 ? (std::size_t{prefix[8]} | (std::size_t{prefix[9]} << 8))
                   : static_cast<std::size_t>(detail::read_le32(prefix.data() + 8));
  const std::size_t header_start = 8 + len_bytes;
  if (header_len > npy_max_header_bytes)
    return npy_bad("header length " + std::to_string(header_len) + " exceeds the 1 MiB limit");
  if (header_start + header_len > file_size)
    return npy_bad("header length " + std::to_string(header_len) +
                   " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  if (header_start + header_len > prefix.size())
    return npy_bad("header length " + std::to_string(header_len) + " runs past the bytes given");
  const std::string_view text(reinterpret_cast<const char*>(prefix.data() + header_start),
                              header_len);
  for (char c : text)
    if (c == '\0') return npy_bad("header contains a NUL byte");
  if (auto s = detail::npy_header_parser(text).parse(h); !s) return s;

  // Element count and byte count, with overflow checks on every product.
  std::uint64_t n = 1;
  for (std::int64_t d : h.shape) {
    const auto ud = static_cast<std::uint64_t>(d);
    if (ud != 0 && n > std::numeric_limits<std::uint64_t>::max() / ud)
      return npy_bad("shape product overflows");
    n *= ud;
  }
  const std::uint64_t isz = item_size(h.dtype);
  if (n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / isz ||
      n * isz > std::numeric_limits<std::size_t>::max())
    return npy_bad("shape product overflows (" + std::to_string(n) + " elements)");
  h.data_offset = header_start + header_len;
  h.data_bytes = static_cast<std::size_t>(n * isz);
  const std::size_t have = file_size - h.data_offset;
  if (have != h.data_bytes)
    return npy_bad("data size mismatch: shape and dtype need " + std::to_string(h.data_bytes) +
                   " bytes after the header, the file has " + std::to_string(have));
  return status::success();
}

/// @brief Converts the data bytes of a parsed header to float.
/// @param data exactly h.data_bytes bytes
[[nodiscard]] inline status decode_npy_data(const npy_header& h, std::span<const std::uint8_t> data,
                                            npy_array& out) {
  if (data.size() != h.data_bytes)
    return detail::npy_bad("data size mismatch: expected " + std::to_string(h.data_bytes) +
                           " bytes, got " + std::to_string(data.size()));
  out.dtype = h.dtype;
  out.shape = h.shape;
  const std::size_t n = h.data_bytes / item_size(h.dtype);
  out.values.resize(n);
  const std::uint8_t* p = data.data();
  if (h.dtype == npy_dtype::f32) {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint8_t b[4];
      std::memcpy(b, p + 4 * i, 4);
      const std::uint32_t u = h.big_endian
                                  ? (std::uint32_t{b[3]} | (std::uint32_t{b[2]} << 8) |
                                     (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[0]} << 24))
                                  : detail::read_le32(b);
      float f;
      std::memcpy(&f, &u, 4);
      out.values[i] = f;
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint8_t lo = p[2 * i + (h.big_endian ? 1 : 0)],
                         hi = p[2 * i + (h.big_endian ? 0 : 1)];
      out.values[i] = to_float(half_bits{static_cast<std::uint16_t>(lo | (hi << 8))});
    }
  }
  return status::success();
}

/// @brief Parses a whole .npy file held in memory. Never throws except std::bad_alloc; the
///        allocation is bounded by the size of `bytes`.
[[nodiscard]] inline status parse_npy(std::span<const std::uint8_t> bytes, npy_array& out) {
  npy_header h;
  if (auto s = parse_npy_header(bytes, bytes.size(), h); !s) return s;
  return decode_npy_data(h, bytes.subspan(h.data_offset, h.data_bytes), out);
}

/// @brief Reads a .npy file from disk. Reads the header first, checks it against the file
///        size, and only then reads the data.
/// @return success; invalid_argument for a missing/unreadable file or a malformed one.
[[nodiscard]] inline status read_npy(const std::string& path, npy_array& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return status::make(status_code::invalid_argument, "cannot open '" + path + "'");
  f.seekg(0, std::ios::end);
  const std::streamoff end = f.tellg();
  if (end < 0)
    return status::make(status_code::invalid_argument,
                        "cannot determine the size of '" + path + "'");
  const auto file_size = static_cast<std::size_t>(end);
  f.seekg(0, std::ios::beg);
  // Preamble: at most 12 bytes, then the header it announces.
  std::vector<std::uint8_t> prefix(std::min<std::size_t>(file_size, 12));
  if (!f.read(reinterpret_cast<char*>(prefix.data()), static_cast<std::streamsize>(prefix.size())))
    return status::make(status_code::invalid_argument, "cannot read '" + path + "'");
  npy_header h;
  auto s = parse_npy_header(prefix, file_size, h);
  if (!s && prefix.size() >= 10 && prefix[0] == 0x93) {
    // Need the full header: size it from the length field (bounded by the checks above).
    const std::size_t len_bytes = prefix[6] == 1 ? 2 : 4;
    const std::size_t header_len =
        len_bytes == 2
            ? (std::size_t{prefix[8]} | (std::size_t{prefix[9]} << 8))
            : (prefix.size() >= 12 ? static_cast<std::size_t>(detail::read_le32(prefix.data() + 8))
                                   : 0);
    const std::size_t want = 8 + len_bytes + header_len;
    if (header_len <= npy_max_header_bytes && want <= file_size && want > prefix.size()) {
      const std::size_t old = prefix.size();
      prefix.resize(want);
      if (!f.read(reinterpret_cast<char*>(prefix.data() + old),
                  static_cast<std::streamsize>(want - old)))
        return status::make(status_code::invalid_argument,
                            "cannot read the header of '" + path + "'");
      s = parse_npy_header(prefix, file_size, h);
    }
  }
  if (!s) return status::make(s.code, path + ": " + s.message);
  std::vector<std::uint8_t> data(h.data_bytes);
  f.seekg(static_cast<std::streamoff>(h.data_offset), std::ios::beg);
  if (!data.empty() &&
      !f.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size())))
    return status::make(status_code::invalid_argument, "cannot read the data of '" + path + "'");
  if (auto d = decode_npy_data(h, data, out); !d)
    return status::make(d.code, path + ": " + d.message);
  return status::success();
}

/// @brief Throwing form of read_npy: throws moeroute::error on any failure.
[[nodiscard]] inline npy_array load_npy(const std::string& path) {
  npy_array a;
  throw_if_error(read_npy(path, a));
  return a;
}

/// A numeric array of any rank read whole (request ids, expert bias, token sources): integers
/// and floats of 1, 2, 4 or 8 bytes in either byte order and bools, widened to double
/// (integers exactly up to 2^53).
struct npy_numeric {
  std::string descr;                ///< as in the file, e.g. "<i4"
  std::vector<std::int64_t> shape;  ///< any rank (0-D: one value)
  std::vector<double> values;       ///< prod(shape) values, C order
};

/// @brief Parses a whole numeric .npy file held in memory (see npy_numeric).
/// @return success, or invalid_argument with a message starting "malformed .npy: ".
[[nodiscard]] inline status parse_npy_numeric(std::span<const std::uint8_t> bytes,
                                              npy_numeric& out) {
  using detail::npy_bad;
  out = npy_numeric{};
  static constexpr std::uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), magic, 6) != 0)
    return npy_bad("bad magic: not a .npy file written by np.save");
  const int major = bytes[6];
  if ((major != 1 && major != 2 && major != 3) || bytes[7] != 0)
    return npy_bad("unsupported format version");
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_bytes) return npy_bad("file ends inside the header length");
  const std::size_t header_len =
      major == 1 ? (std::size_t{bytes[8]} | (std::size_t{bytes[9]} << 8))
                 : static_cast<std::size_t>(detail::read_le32(bytes.data() + 8));
  const std::size_t start = 8 + len_bytes;
  if (header_len > npy_max_header_bytes || start + header_len > bytes.size())
    return npy_bad("header length " + std::to_string(header_len) + " runs past the end");
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + start), header_len);
  bool fortran = false;
  if (auto st = detail::npy_header_parser(text).parse_dict(out.descr, fortran, out.shape); !st)
    return st;
  const std::string& d = out.descr;
  const bool ok_descr = d.size() == 3 && (d[0] == '<' || d[0] == '>' || d[0] == '|') &&
                        (d[1] == 'i' || d[1] == 'u' || d[1] == 'f' || d[1] == 'b') &&
                        (d[2] == '1' || d[2] == '2' || d[2] == '4' || d[2] == '8') &&
                        !(d[1] == 'f' && d[2] == '1') && !(d[1] == 'b' && d[2] != '1');
  if (!ok_descr)
    return npy_bad("unsupported dtype descr '" + detail::printable(d) +
                   "': expected an integer, bool or float array");
  const std::size_t item = static_cast<std::size_t>(d[2] - '0');
  std::uint64_t n = 1;
  for (std::int64_t e : out.shape) {
    const auto ue = static_cast<std::uint64_t>(e);
    if (ue != 0 && n > (std::uint64_t{1} << 40) / ue) return npy_bad("shape product overflows");
    n *= ue;
  }
  const std::size_t data = start + header_len;
  if (bytes.size() - data != n * item)
    return npy_bad("data size mismatch: shape and dtype need " + std::to_string(n * item) +
                   " bytes after the header, the file has " + std::to_string(bytes.size() - data));
  out.values.resize(static_cast<std::size_t>(n));
  const bool big = d[0] == '>';
  for (std::size_t i = 0; i < out.values.size(); ++i) {
    std::uint64_t u = 0;
    for (std::size_t b = 0; b < item; ++b) {
      const std::size_t at = big ? item - 1 - b : b;
      u |= std::uint64_t{bytes[data + i * item + at]} << (8 * b);
    }
    double v = 0.0;
    if (d[1] == 'u' || d[1] == 'b') {
      v = static_cast<double>(u);
    } else if (d[1] == 'i') {
      const std::uint64_t sign = std::uint64_t{1} << (8 * item - 1);
      const std::int64_t sv = (u & sign) != 0 && item < 8
                                  ? static_cast<std::int64_t>(u | ~((sign << 1) - 1))
                                  : static_cast<std::int64_t>(u);
      v = static_cast<double>(sv);
    } else if (item == 2) {
      v = to_float(half_bits{static_cast<std::uint16_t>(u)});
    } else if (item == 4) {
      float f;
      const auto w = static_cast<std::uint32_t>(u);
      std::memcpy(&f, &w, 4);
      v = f;
    } else {
      std::memcpy(&v, &u, 8);
    }
    out.values[i] = v;
  }
  return status::success();
}

/// @brief Reads a numeric .npy file whole (see npy_numeric); files above `max_bytes` are
///        refused rather than read.
[[nodiscard]] inline status read_npy_numeric(const std::string& path, npy_numeric& out,
                                             std::size_t max_bytes = std::size_t{1} << 33) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return status::make(status_code::invalid_argument, "cannot open '" + path + "'");
  f.seekg(0, std::ios::end);
  const std::streamoff end = f.tellg();
  if (end < 0 || static_cast<std::size_t>(end) > max_bytes)
    return status::make(
        status_code::invalid_argument,
        "'" + path + "' is unreadable or larger than " + std::to_string(max_bytes) + " bytes");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(end));
  f.seekg(0, std::ios::beg);
  if (!bytes.empty() &&
      !f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())))
    return status::make(status_code::invalid_argument, "cannot read '" + path + "'");
  if (auto s = parse_npy_numeric(bytes, out); !s)
    return status::make(s.code, path + ": " + s.message);
  return status::success();
}

/// @brief Writes a float32 C-order .npy (format 1.0), e.g. for tests and tool output.
[[nodiscard]] inline status write_npy(const std::string& path, std::span<const float> values,
                                      std::span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 0) return status::make(status_code::invalid_shape, "write_npy: negative extent");
    n *= d;
  }
  if (static_cast<std::size_t>(n) != values.size())
    return status::make(status_code::invalid_shape,
                        "write_npy: values.size() does not match shape");
  std::string hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    hdr += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) hdr += ", ";
  }
  hdr += "), }";
  while ((10 + hdr.size() + 1) % 64 != 0) hdr += ' ';
  hdr += '\n';
  if (hdr.size() > 65535)
    return status::make(status_code::invalid_shape, "write_npy: header too long");
  std::ofstream f(path, std::ios::binary);
  if (!f) return status::make(status_code::invalid_argument, "cannot create '" + path + "'");
  const unsigned char pre[10] = {0x93,
                                 'N',
                                 'U',
                                 'M',
                                 'P',
                                 'Y',
                                 1,
                                 0,
                                 static_cast<unsigned char>(hdr.size() & 0xFF),
                                 static_cast<unsigned char>(hdr.size() >> 8)};
  f.write(reinterpret_cast<const char*>(pre), 10);
  f.write(hdr.data(), static_cast<std::streamsize>(hdr.size()));
  for (float v : values) {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    const unsigned char b[4] = {static_cast<unsigned char>(u), static_cast<unsigned char>(u >> 8),
                                static_cast<unsigned char>(u >> 16),
                                static_cast<unsigned char>(u >> 24)};
    f.write(reinterpret_cast<const char*>(b), 4);
  }
  if (!f) return status::make(status_code::invalid_argument, "write to '" + path + "' failed");
  return status::success();
}

}  // namespace moeroute::io
