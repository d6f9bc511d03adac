// SPDX-License-Identifier: Apache-2.0
// moeroute._core.reference_route: the CPU reference (the oracle every backend is compared
// with) on float32 logits, so the Python tests compare the package's results with it as the
// C++ tests do. Not part of the package's API: the reference is plain loops, for checking.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <span>
#include <type_traits>
#include <vector>

#include <moeroute/reference.hpp>

#include "arrays.hpp"
#include "module.hpp"

namespace moeroute::python {

namespace {

template <class T>
py::array_t<T> numpy_of(const std::vector<T>& v, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

/// A dispatch_output as numpy arrays by name: expert, slot, weight, fate [T, k]; the per-expert
/// counts; totals [8] (dispatch_totals_fields).
py::dict dispatch_dict(const reference::dispatch_output& d, py::ssize_t T, py::ssize_t k,
                       py::ssize_t E) {
  std::vector<std::uint8_t> fates(d.fates.size());
  for (std::size_t i = 0; i < fates.size(); ++i) fates[i] = static_cast<std::uint8_t>(d.fates[i]);
  const py::ssize_t ET = d.total_experts;
  const dispatch_totals tot = d.totals();
  return py::dict(
      py::arg("expert") = numpy_of(d.expert, {T, k}), py::arg("slot") = numpy_of(d.slot, {T, k}),
      py::arg("weight") = numpy_of(d.weight, {T, k}), py::arg("fate") = numpy_of(fates, {T, k}),
      py::arg("requested") = numpy_of(d.requested, {E}), py::arg("kept") = numpy_of(d.kept, {E}),
      py::arg("rerouted") = numpy_of(d.rerouted, {E}),
      py::arg("dropped") = numpy_of(d.dropped, {E}),
      py::arg("received") = numpy_of(d.received, {ET}), py::arg("load") = numpy_of(d.load, {ET}),
      py::arg("totals") = std::vector<std::int64_t>{tot.capacity, tot.fallback_capacity, tot.kept,
                                                    tot.rerouted, tot.dropped, tot.masked,
                                                    tot.reroute_rounds, tot.invalid_tokens});
}

}  // namespace

void bind_reference(py::module_& m) {
  m.def(
      "reference_route",
      [](const routing_config& cfg, py::dict arrays) {
        call_arrays a("reference_route", std::move(arrays));
        const array_view lg = a.view("logits", {-1, cfg.num_experts}, {elem::f32}, false);
        const std::int64_t T = lg.shape[0];
        const std::int32_t E = cfg.num_experts, k = cfg.top_k;
        const auto* logits = static_cast<const float*>(lg.data);
        const float* bias = a.in<float>({"bias", {E}, elem::f32}, false);
        const std::uint8_t* valid = a.in<std::uint8_t>({"valid", {T}, elem::u8}, false);
        reference::routing_result r;
        try {
          r = reference::route<float>(
              cfg, std::span<const float>(logits, static_cast<std::size_t>(T * E)), T,
              bias ? std::span<const float>(bias, static_cast<std::size_t>(E))
                   : std::span<const float>(),
              valid ? std::span<const std::uint8_t>(valid, static_cast<std::size_t>(T))
                    : std::span<const std::uint8_t>());
        } catch (const error& e) {
          throw binding_error(std::string("reference_route: ") + e.what());
        }
        const auto& g = r.gating;
        py::dict out = dispatch_dict(r.dispatch, T, k, E);
        out["ids"] = numpy_of(g.ids, {T, k});
        out["gates"] = numpy_of(g.gates, {T, k});
        out["logsumexp"] = numpy_of(g.logsumexp, {T});
        out["aux_loss"] = r.losses.aux.value;
        out["sequence_aux_loss"] = r.losses.sequence_aux;
        out["z_loss"] = r.losses.z.value;
        return out;
      },
      py::arg("config"), py::arg("arrays"));

  // reference::dispatch of a routing chosen elsewhere (reference::routing_from_ids): the
  // oracle of a backend's dispatch given the backend's own gating, so the property tests
  // compare dispatch exactly even where gates differ from the reference's by their rounding.
  m.def(
      "reference_dispatch",
      [](const routing_config& cfg, py::dict arrays) {
        call_arrays a("reference_dispatch", std::move(arrays));
        const std::int32_t k = cfg.top_k, E = cfg.num_experts, R = cfg.reroute_candidates();
        const array_view ids = a.view("ids", {-1, k}, {elem::i32}, false);
        const std::int64_t T = ids.shape[0];
        const auto span_of = [&](const char* name, elem type, const extents& shape, auto* tag) {
          using V = std::remove_pointer_t<decltype(tag)>;
          const V* p = a.in<V>({name, shape, type}, false);
          std::size_t n = 1;
          for (auto d : shape) n *= static_cast<std::size_t>(d);
          return p ? std::span<const V>(p, n) : std::span<const V>();
        };
        reference::given_routing r;
        r.ids = span_of("ids", elem::i32, {T, k}, static_cast<std::int32_t*>(nullptr));
        r.gates = span_of("gates", elem::f32, {T, k}, static_cast<float*>(nullptr));
        if (R > 0)
          r.reroute_ids =
              span_of("reroute_ids", elem::i32, {T, R}, static_cast<std::int32_t*>(nullptr));
        r.token_priority = span_of("token_priority", elem::f32, {T}, static_cast<float*>(nullptr));
        r.second_skipped =
            span_of("second_skipped", elem::u8, {T}, static_cast<std::uint8_t*>(nullptr));
        r.valid = span_of("valid", elem::u8, {T}, static_cast<std::uint8_t*>(nullptr));
        reference::dispatch_output d;
        try {
          d = reference::dispatch(cfg, reference::routing_from_ids(cfg, r));
        } catch (const error& e) {
          throw binding_error(std::string("reference_dispatch: ") + e.what());
        }
        return dispatch_dict(d, T, k, E);
      },
      py::arg("config"), py::arg("arrays"));
}

}  // namespace moeroute::python
