// SPDX-License-Identifier: Apache-2.0
// The test binaries' entry into Catch2, whose implementation is compiled once
// (catch_runner.cpp): a main calls run_catch after its own setup, without parsing catch.hpp.
#pragma once

namespace moeroute::test {

/// Runs the registered test cases under the command line; returns Catch2's exit code.
int run_catch(int argc, char** argv);

}  // namespace moeroute::test
