// SPDX-License-Identifier: Apache-2.0
// The first phase of expert parallelism was called "layout" before 0.3: it is
// ep::local_dispatch now (moeroute/ep/local_dispatch.hpp, which keeps the old names,
// deprecated). This header stays for includes written then.
#pragma once

#include <moeroute/ep/local_dispatch.hpp>
