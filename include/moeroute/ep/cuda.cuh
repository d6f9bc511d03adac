// SPDX-License-Identifier: Apache-2.0
// Expert parallelism on the GPU: the device plan, dispatch, combine and both backward passes
// over any ep::cuda::device_transport, and the one-GPU loopback. NCCL is opt-in
// (<moeroute/ep/nccl.cuh>, target moeroute::ep_nccl).
#pragma once

#include <moeroute/ep/cuda/combine.cuh>
#include <moeroute/ep/cuda/combine_backward.cuh>
#include <moeroute/ep/cuda/dispatch.cuh>
#include <moeroute/ep/cuda/dispatch_backward.cuh>
#include <moeroute/ep/cuda/loopback.cuh>
#include <moeroute/ep/cuda/plan.cuh>
#include <moeroute/ep/cuda/transport.cuh>
