// SPDX-License-Identifier: Apache-2.0
// moeroute._cpu: the x86 vector level of the running CPU, which moeroute/_extension.py reads
// to load the extension built for it. Compiled for the baseline, so it runs on every CPU.
#include <pybind11/pybind11.h>

#include <string>

#include <moeroute/cpu/isa.hpp>

PYBIND11_MODULE(_cpu, m) {
  m.doc() = "the running CPU's vector level (include/moeroute/cpu/isa.hpp)";
  m.def(
      "host_isa", [] { return std::string(moeroute::cpu::isa_name(moeroute::cpu::host_isa())); },
      "the highest level this CPU runs: 'baseline', 'avx2' or 'avx512'");
  m.attr("levels") = pybind11::make_tuple("baseline", "avx2", "avx512");
}
