// SPDX-License-Identifier: Apache-2.0
// The extension's entry point, compiled once per module: moeroute._core, and in test builds
// moeroute._core_emulated (MOEROUTE_PYTHON_MODULE names it).
#include "module.hpp"

#ifndef MOEROUTE_PYTHON_MODULE
#define MOEROUTE_PYTHON_MODULE _core
#endif

PYBIND11_MODULE(MOEROUTE_PYTHON_MODULE, m) { moeroute::python::init_module(m); }
