// SPDX-License-Identifier: Apache-2.0
// The launchers name the shared parameter checks (params/checks.hpp) as detail::required,
// detail::require_pointers, ...: one set of checks and messages for every backend.
#pragma once

#include <moeroute/params/checks.hpp>

namespace moeroute::cuda::detail {
using namespace moeroute::param_checks;
}  // namespace moeroute::cuda::detail
