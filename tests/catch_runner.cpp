// SPDX-License-Identifier: Apache-2.0
// Catch2's implementation, compiled once for every test binary (it is most of a test build's
// fixed cost). No main here: tests/main.cpp is the CPU binaries' main, cuda/main.cpp and
// emulation/main.cpp the GPU test binaries'; each calls run_catch.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_runner.hpp"

int moeroute::test::run_catch(int argc, char** argv) { return Catch::Session().run(argc, argv); }
