# SPDX-License-Identifier: Apache-2.0
"""Capacity planning on router logits in memory: the planner behind `moeroute-capacity
--batch-tokens` (docs/capacity-tuning.md) called on an array. The logits are cut into the
batches you run, each batch is routed under every (factor, priority, drop policy), and the
result says how much each choice drops per batch, what it costs in buffer memory, and the
smallest factor that keeps a quantile of the per-batch overflow under a target."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Union

import numpy as np

from . import _arrays
from . import _core
from ._core import Config

DEFAULT_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, "dropless")


def _config(config: Union[Config, str], num_experts: int, top_k: int) -> Config:
    if isinstance(config, Config):
        if config.num_experts != num_experts:
            raise _core.Error(f"plan: logits have {num_experts} experts, the config "
                              f"{config.num_experts}")
        return config
    return Config.preset(str(config), num_experts, top_k)


def _preset_hidden(config) -> int:
    if isinstance(config, str):
        for p in _core.presets():
            if p["name"] == config:
                return int(p["hidden"])
    return 4096


def plan(logits, config: Union[Config, str], *, batch_tokens: int,
         factors: Sequence[Union[float, str]] = DEFAULT_FACTORS,
         priorities: Sequence[str] = ("preset",), policies: Sequence[str] = ("preset",),
         top_k: int = 0, batching: str = "consecutive", seed: int = 0, group_ids=None,
         bias=None, expert_ranks: Optional[Sequence[int]] = None, target_drop: float = 0.01,
         quantile: float = 0.99, cold_share: float = 0.25, hidden: Optional[int] = None,
         buffer_dtype: str = "bf16", block_size: int = 16, threads: int = 0) -> Dict[str, Any]:
    """Plans capacity on router logits [layers, N, E] or [N, E] (float32 / float16, numpy or a
    CPU torch tensor).

    config: a Config (E must match) or a preset name (with `top_k`, 0 = the preset's).
    factors: capacity factors and/or "dropless"; priorities / policies: names of
    dispatch.prio / dispatch.dropped values, or "preset" for the config's own.
    batching: "consecutive" (as served), "shuffled" (seeded), "grouped" (by group_ids [N]).
    bias: the expert bias [E] or [layers, E] of a biased router. expert_ranks: [E] the EP
    rank holding each expert (adds per-rank drop rates).
    target_drop / quantile: the recommendation's goal (quantile of per-batch overflow).

    Returns plain data: {"batches", "batch_tokens", "tokens_left_out", "nonfinite_logits",
    "cells": [...], "experts": [...], "recommendations": [...] (per layer, then the model
    with layer None), "gating_seconds", "dispatch_seconds"}. plan_frames() turns it into
    pandas DataFrames."""
    if _arrays.is_torch(logits):
        logits = logits.detach()
    if len(logits.shape) == 2:
        logits = logits.reshape((1,) + tuple(logits.shape))
    if len(logits.shape) != 3:
        raise _core.Error(f"plan: logits: shape {tuple(logits.shape)}, expected [layers, N, E] "
                          "or [N, E]")
    cfg = _config(config, int(logits.shape[2]), top_k)
    arrays = {"logits": logits}
    if group_ids is not None:
        arrays["group_ids"] = np.ascontiguousarray(np.asarray(group_ids, dtype=np.float64))
    if bias is not None:
        b = np.asarray(bias.cpu() if _arrays.is_torch(bias) else bias, dtype=np.float32)
        arrays["bias"] = np.ascontiguousarray(b.reshape((1, -1)) if b.ndim == 1 else b)
    return _core.plan(cfg, arrays, list(factors), [str(p) for p in priorities],
                      [str(p) for p in policies], int(batch_tokens), batching, int(seed),
                      float(target_drop), float(quantile), float(cold_share),
                      int(hidden) if hidden else _preset_hidden(config), buffer_dtype,
                      int(block_size), [int(r) for r in (expert_ranks or [])], int(threads))


def plan_frames(result: Dict[str, Any]):
    """(cells, recommendations, experts) of a plan() result as pandas DataFrames, the
    distributions flattened into columns (drop_rate_p99, ...). Needs pandas."""
    try:
        import pandas as pd
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plan_frames needs pandas (Debian: python3-pandas)") from e

    def flat(row):
        out = {}
        for k, v in row.items():
            if isinstance(v, dict):
                out.update({f"{k}_{s}": x for s, x in v.items()})
            elif k != "rank_drop_rate":
                out[k] = v
        for r, d in enumerate(row.get("rank_drop_rate", [])):
            out.update({f"rank{r}_drop_rate_{s}": x for s, x in d.items()})
        return out

    cells = pd.DataFrame([flat(c) for c in result["cells"]])
    recs = pd.DataFrame(result["recommendations"])
    experts = pd.DataFrame([{k: v for k, v in e.items()
                             if k not in ("share", "first_quarter", "last_quarter")}
                            for e in result["experts"]])
    return cells, recs, experts
