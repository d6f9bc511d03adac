// SPDX-License-Identifier: Apache-2.0
// The whole CUDA backend: every launcher (gating, dispatch, layout, permute, combine, losses,
// their backward passes and the expert-bias update), the workspace / row-bound queries and the
// owning device_buffer of examples and tests.
#pragma once

#include <moeroute/cuda/combine.cuh>
#include <moeroute/cuda/combine_backward.cuh>
#include <moeroute/cuda/device_buffer.cuh>
#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/dispatch_workspace.hpp>
#include <moeroute/cuda/expert_bias_update.cuh>
#include <moeroute/cuda/gating.cuh>
#include <moeroute/cuda/gating_backward.cuh>
#include <moeroute/cuda/gating_workspace.hpp>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/cuda/losses.cuh>
#include <moeroute/cuda/permute.cuh>
#include <moeroute/cuda/permute_backward.cuh>
#include <moeroute/cuda/record.cuh>
#include <moeroute/cuda/router.cuh>
#include <moeroute/cuda/token_mask.cuh>
