# SPDX-License-Identifier: Apache-2.0
"""moeroute: Mixture-of-Experts routing (top-k gating, capacity dispatch, drop policies,
combine, the aux and z losses and their backward passes) from the C++ library's headers.

    import moeroute
    cfg = moeroute.Config.preset("megatron", 64, 2)
    cfg["capacity.factor"] = 1.25
    r = moeroute.route(logits, cfg)          # numpy or torch, [T, E]
    r.dispatched.totals_dict()["dropped"]

moeroute.torch holds the autograd functions and a Router module; docs/python.md has more."""

from . import _extension

_core = _extension.load()  # the extension built for this CPU's vector level, as moeroute._core
from ._core import Config, Error, presets  # noqa: E402
from .hf_config import from_hf as _from_hf
from ._core import openmp as _openmp
from .planning import plan, plan_frames
from .replay import RoutingRecord, agreement
from .stages import (Dispatched, Gated, Laid, Routing, combine, combine_backward, dispatch,
                     expert_bias_update, gating, gating_backward, layout, losses, permute,
                     permute_backward, route, token_mask)

Config.from_hf = staticmethod(_from_hf)  # Config.from_hf(model.config): see hf_config.py

__version__ = "0.2.0"
has_openmp = bool(_openmp)
isa = _core.isa  # the vector level the loaded extension is built for: baseline, avx2, avx512
Config.__module__ = Error.__module__ = "moeroute"  # pickles name moeroute.Config, any level

__all__ = [
    "Config", "Error", "presets", "plan", "plan_frames", "Gated", "Dispatched", "Laid", "Routing",
    "gating", "dispatch", "layout", "permute", "combine", "losses", "gating_backward",
    "combine_backward", "permute_backward", "expert_bias_update", "route", "token_mask",
    "RoutingRecord",
    "agreement", "isa",
]
