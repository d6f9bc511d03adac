// SPDX-License-Identifier: Apache-2.0
// The one Catch2 main for the CPU test binaries.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
