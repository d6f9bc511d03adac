// SPDX-License-Identifier: Apache-2.0
#include "specs.hpp"

#include <moeroute/shapes.hpp>

namespace moeroute::python {

namespace {
elem elem_of(buffer_type t) {
  switch (t) {
    case buffer_type::f64:
      return elem::f64;
    case buffer_type::i32:
      return elem::i32;
    case buffer_type::i64:
      return elem::i64;
    case buffer_type::u8:
      return elem::u8;
    default:
      return elem::f32;
  }
}

std::vector<spec> specs_of(const std::vector<buffer_shape>& shapes) {
  std::vector<spec> out;
  out.reserve(shapes.size());
  for (const auto& b : shapes)
    out.push_back({std::string(b.name), extents(b.extents), elem_of(b.type)});
  return out;
}
}  // namespace

std::vector<spec> gating_outputs(const routing_config& cfg, std::int64_t T, bool per_token_aux,
                                 bool replay) {
  return specs_of(gating_buffers(cfg, T, {/*logsumexp=*/true, per_token_aux, replay}));
}

std::vector<spec> dispatch_outputs(const routing_config& cfg, std::int64_t T) {
  return specs_of(dispatch_buffers(cfg, T));
}

std::int64_t max_rows_of(const routing_config& cfg, std::int64_t T, layout_kind kind,
                         std::int64_t block_size, std::int32_t local_experts) {
  std::int64_t rows = 0;
  if (auto s = layout_rows(cfg, T, kind, block_size, local_experts, rows); !s)
    throw binding_error(s.message);
  return rows;
}

std::vector<spec> layout_outputs(const routing_config& cfg, std::int64_t T, layout_kind kind,
                                 std::int64_t block_size, std::int32_t local_experts) {
  const std::int64_t rows = max_rows_of(cfg, T, kind, block_size, local_experts);
  return specs_of(layout_buffers(cfg, T, kind, block_size, rows, local_experts));
}

const spec& find_spec(const std::vector<spec>& specs, std::string_view name) {
  for (const auto& s : specs)
    if (s.name == name) return s;
  throw std::logic_error("moeroute binding: no spec named " + std::string(name));
}

bool lists(const std::vector<spec>& specs, std::string_view name) {
  for (const auto& s : specs)
    if (s.name == name) return true;
  return false;
}

}  // namespace moeroute::python
