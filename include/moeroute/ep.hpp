// SPDX-License-Identifier: Apache-2.0
// Expert parallelism on the host: placement, options, the three phases (layout, plan,
// dispatch / combine) and both backward passes, over any ep::transport. The in-process
// loopback transport is included; MPI is opt-in (<moeroute/ep/mpi.hpp>, target moeroute::ep_mpi).
#pragma once

#include <moeroute/ep/combine.hpp>
#include <moeroute/ep/combine_backward.hpp>
#include <moeroute/ep/dispatch.hpp>
#include <moeroute/ep/dispatch_backward.hpp>
#include <moeroute/ep/local_dispatch.hpp>
#include <moeroute/ep/loopback.hpp>
#include <moeroute/ep/options.hpp>
#include <moeroute/ep/placement.hpp>
#include <moeroute/ep/plan.hpp>
#include <moeroute/ep/transport.hpp>
