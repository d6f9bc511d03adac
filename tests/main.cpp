// SPDX-License-Identifier: Apache-2.0
// The main of the CPU test binaries.
#include "catch_runner.hpp"

int main(int argc, char** argv) { return moeroute::test::run_catch(argc, argv); }
