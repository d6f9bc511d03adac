// SPDX-License-Identifier: Apache-2.0
// The CPU reference backward passes in one include: gating and loss gradients
// (gating_backward.hpp), combine and permute backward (combine_backward.hpp) and the expert-bias
// update of aux-loss-free balancing (bias_update.hpp). See docs/api.md ("Backward passes").
#pragma once

#include <moeroute/reference/bias_update.hpp>
#include <moeroute/reference/combine_backward.hpp>
#include <moeroute/reference/gating_backward.hpp>
