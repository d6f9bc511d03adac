// SPDX-License-Identifier: Apache-2.0
// moeroute._core: the C++ library's stages for Python. The package's Python code (moeroute/)
// allocates outputs in the caller's framework and calls these, except route_host, which
// carves a host batch's outputs from one numpy buffer of its own (the fixed cost of a small
// batch); nothing here implements routing of its own.
#include "module.hpp"

#include <pybind11/stl.h>

#include <moeroute/cpu/isa.hpp>
#include <moeroute/status.hpp>

#include "arrays.hpp"
#include "launch.hpp"
#include "ops.hpp"

namespace moeroute::python {

void bind_ops(py::module_& m) {
  const auto cfg = py::arg("config"), arrays = py::arg("arrays");
  const auto threads = py::arg("threads") = 0;
  const auto stream = py::arg("stream") = py::none();
  m.def("gating", &gating, cfg, arrays, py::arg("replay_ratio") = 0.0f, threads, stream);
  m.def("dispatch", &dispatch, cfg, arrays, threads, stream);
  m.def(
      "layout",
      [](const routing_config& c, py::dict a, const std::string& kind, std::int64_t block_size,
         std::int32_t local_experts, int t, stream_arg s) {
        layout(c, std::move(a), parse_layout_kind(kind), block_size, local_experts, t, s);
      },
      cfg, arrays, py::arg("layout"), py::arg("block_size"), py::arg("local_experts") = 0, threads,
      stream);
  m.def(
      "route_host",
      [](const routing_config& c, py::object logits, py::object bias, py::object valid,
         const std::string& kind, std::int64_t block_size, bool per_token_aux,
         py::object replay_ids, float replay_ratio, int t, py::object token_count, py::object into,
         py::object into_losses) {
        return route_host(c, std::move(logits), std::move(bias), std::move(valid),
                          parse_layout_kind(kind), block_size, per_token_aux, std::move(replay_ids),
                          replay_ratio, t, std::move(token_count), std::move(into),
                          std::move(into_losses));
      },
      cfg, py::arg("logits"), py::arg("bias") = py::none(), py::arg("valid") = py::none(),
      py::arg("layout") = "padded", py::arg("block_size") = 1, py::arg("per_token_aux") = false,
      py::arg("replay_ids") = py::none(), py::arg("replay_ratio") = 0.0f, threads,
      py::arg("token_count") = py::none(), py::arg("into") = py::none(),
      py::arg("into_losses") = py::none());
  m.def("permute", &permute, cfg, arrays, threads, stream);
  m.def("combine", &combine, cfg, arrays, threads, stream);
  m.def("losses", &losses, cfg, arrays, py::arg("tokens"), threads, stream);
  m.def(
      "gating_backward",
      [](const routing_config& c, py::dict a, double routing, double aux, double sequence_aux,
         double z, bool accumulate, int t, stream_arg s) {
        gating_backward(c, std::move(a), gating_backward_weights{routing, aux, sequence_aux, z},
                        accumulate, t, s);
      },
      cfg, arrays, py::arg("routing"), py::arg("aux"), py::arg("sequence_aux"), py::arg("z"),
      py::arg("accumulate"), threads, stream);
  m.def("combine_backward", &combine_backward, cfg, arrays, threads, stream);
  m.def("permute_backward", &permute_backward, cfg, arrays, py::arg("accumulate"), threads, stream);
  m.def("expert_bias_update", &expert_bias_update, cfg, arrays, stream);
  m.def("token_mask", &token_mask, arrays, stream);
}

void init_module(py::module_& m) {
  m.doc() = "moeroute's C++ stages (used through the moeroute package)";
  // moeroute.Error (a ValueError) for bad arguments and for every failed library status. Local
  // to the module, as Config is, so the test module _core_emulated can be loaded beside it.
  static PyObject* error = nullptr;
  error = py::register_local_exception<binding_error>(m, "Error", PyExc_ValueError).ptr();
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const moeroute::error& e) {
      PyErr_SetString(error, e.what());
    }
  });
  bind_config(m);
  bind_ops(m);
  bind_plan(m);
  bind_reference(m);
#if defined(_OPENMP)
  m.attr("openmp") = true;
#else
  m.attr("openmp") = false;
#endif
  // the vector level this build's CPU code is compiled for (cpu/isa.hpp): _core_avx2 says avx2
  m.attr("isa") = std::string(cpu::isa_name(cpu::compiled_isa()));
  m.attr("cuda") = has_cuda();
  m.attr("emulated") = host_arrays_on_device();
}

}  // namespace moeroute::python
