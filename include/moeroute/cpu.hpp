// SPDX-License-Identifier: Apache-2.0
// The whole CPU backend: every operation of the CUDA launchers (gating, dispatch, layout,
// permute, combine, losses, their backward passes, the expert-bias update) on host memory,
// with the same params structs, the reference's results, and a cpu::executor (OpenMP, serial
// or the engine's own parallel-for) where a launcher takes its stream.
#pragma once

#include <moeroute/cpu/combine.hpp>
#include <moeroute/cpu/combine_backward.hpp>
#include <moeroute/cpu/dispatch.hpp>
#include <moeroute/cpu/expert_bias_update.hpp>
#include <moeroute/cpu/gating.hpp>
#include <moeroute/cpu/gating_backward.hpp>
#include <moeroute/cpu/layout.hpp>
#include <moeroute/cpu/losses.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/cpu/permute.hpp>
#include <moeroute/cpu/permute_backward.hpp>
#include <moeroute/cpu/record.hpp>
#include <moeroute/cpu/router.hpp>
#include <moeroute/cpu/token_mask.hpp>
#include <moeroute/layout_rows.hpp>
