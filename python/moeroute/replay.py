# SPDX-License-Identifier: Apache-2.0
"""Routing replay for RL on MoE models (docs/replay.md).

The rollout engine and the trainer choose experts independently, and small numeric
differences flip a share of the choices; replay forces the trainer to the rollout's selection
while the weights are recomputed from the trainer's own logits (`route(..., replay_ids=...)`,
`moeroute.torch.Router.forward(..., replay_ids=...)`). This module holds the other two parts:

* `RoutingRecord`: every layer's chosen experts in the layouts engines exchange — vLLM's
  [tokens, layers, k] or Megatron's per-layer [tokens, k] — int16 where E <= 32767, written in
  place (a static buffer: no allocation per call) and saved as .npy.
* `agreement`: how often two routers disagree on the same tokens (a bf16 rollout and an fp32
  trainer, or two checkpoints), per layer — the measure `moeroute-capacity --agree` prints.
"""

from __future__ import annotations

from typing import Any, Dict, Union

import numpy as np

from . import _arrays
from . import _core
from ._core import Config

LAYOUTS = ("tokens_layers_k", "layers_tokens_k")


class RoutingRecord:
    """The expert ids a routing chose, for `layers` layers of up to `tokens` tokens.

    layout "tokens_layers_k" is vLLM's routed_experts [tokens, layers, k]; "layers_tokens_k"
    stacks Megatron's per-layer [tokens, k]. The buffer is allocated once (numpy, or a torch
    tensor on `device` for a CUDA graph to record into) and filled with -1 (not recorded,
    which replay reads as "the router chooses")."""

    def __init__(self, tokens: int, layers: int, top_k: int, num_experts: int, *,
                 layout: str = "tokens_layers_k", dtype: str = "auto", device=None):
        if layout not in LAYOUTS:
            raise _core.Error(f"RoutingRecord: layout '{layout}' is not one of {LAYOUTS}")
        if tokens < 0 or layers < 1 or top_k < 1 or num_experts < 1:
            raise _core.Error("RoutingRecord: tokens >= 0, layers >= 1, top_k >= 1, "
                              "num_experts >= 1")
        if dtype == "auto":
            dtype = "int16" if num_experts <= 32767 else "int32"
        if dtype not in ("int16", "int32"):
            raise _core.Error(f"RoutingRecord: dtype '{dtype}' is not int16, int32 or auto")
        if dtype == "int16" and num_experts > 32767:
            raise _core.Error(f"RoutingRecord: int16 holds expert ids up to 32767; "
                              f"num_experts = {num_experts}")
        self.tokens, self.layers, self.top_k = int(tokens), int(layers), int(top_k)
        self.num_experts, self.layout = int(num_experts), layout
        shape = (tokens, layers, top_k) if layout == LAYOUTS[0] else (layers, tokens, top_k)
        if device is None:
            self.ids = np.full(shape, -1, dtype=dtype)
        else:
            import torch

            self.ids = torch.full(shape, -1, dtype=getattr(torch, dtype), device=device)

    def _slot(self, layer: int, first_token: int, count: int):
        if not 0 <= layer < self.layers:
            raise _core.Error(f"RoutingRecord: layer = {layer}: must be in [0, {self.layers})")
        if first_token < 0 or first_token + count > self.tokens:
            raise _core.Error(f"RoutingRecord: first_token + tokens = {first_token} + {count} "
                              f"exceeds the record's {self.tokens} tokens")
        rows = slice(first_token, first_token + count)
        return (rows, layer) if self.layout == LAYOUTS[0] else (layer, rows)

    def record(self, layer: int, ids, first_token: int = 0) -> None:
        """Writes a routing's ids [T, k] (Gated.ids, RouterOutput.ids) as layer `layer`, rows
        [first_token, first_token + T), in place."""
        if tuple(ids.shape[1:]) != (self.top_k,) or len(ids.shape) != 2:
            raise _core.Error(f"RoutingRecord.record: ids has shape {tuple(ids.shape)}, "
                              f"expected [T, {self.top_k}]")
        view = self.ids[self._slot(layer, first_token, int(ids.shape[0]))]
        if _arrays.is_torch(self.ids):
            view.copy_(ids.to(self.ids.dtype))
        else:
            view[...] = np.asarray(ids.cpu() if _arrays.is_torch(ids) else ids)

    def replay_ids(self, layer: int, first_token: int = 0, tokens: int = -1):
        """Layer `layer`'s recorded ids of rows [first_token, first_token + tokens) as [T, k]
        (a view; route() converts it to int32 once)."""
        count = self.tokens - first_token if tokens < 0 else tokens
        return self.ids[self._slot(layer, first_token, count)]

    def save(self, path: str) -> None:
        """The record as .npy (np.load gives it back, the layout's shape and dtype)."""
        data = self.ids.cpu().numpy() if _arrays.is_torch(self.ids) else self.ids
        np.save(path, data)

    @classmethod
    def load(cls, path: str, num_experts: int, *, layout: str = "tokens_layers_k"):
        """A record saved by save() (or written by an engine in that layout)."""
        data = np.load(path)
        if data.ndim != 3 or data.dtype not in (np.int16, np.int32):
            raise _core.Error(f"RoutingRecord.load: {path}: expected int16 / int32 [.., .., k]")
        tokens, layers = (data.shape[0], data.shape[1]) if layout == LAYOUTS[0] else \
            (data.shape[1], data.shape[0])
        r = cls(tokens, layers, data.shape[2], num_experts, layout=layout,
                dtype=str(data.dtype))
        r.ids[...] = data
        return r


def agreement(a, b, config: Union[Config, str], *, top_k: int = 0, tie_margin: float = 0.02,
              threads: int = 0) -> Dict[str, Any]:
    """How often two routers disagree: router logits `a` and `b` for the same tokens
    ([layers, N, E] or [N, E], float32 / float16, numpy or CPU torch), routed with one config
    (a Config, or a preset name with `top_k`). Per layer: tokens / slots whose experts differ,
    the mean gate mass moved (half the L1 distance of the two gate vectors), and how many
    token flips sit on a near-tie (A's weakest chosen logit within `tie_margin` of its
    strongest unchosen one); and the share of tokens that differ in at least one layer.
    The same numbers as `moeroute-capacity --agree A.npy B.npy`."""
    def prepared(x):
        if _arrays.is_torch(x):
            x = x.detach().cpu()
            x = x.float() if str(x.dtype) in ("torch.bfloat16", "torch.float64") else x
        else:
            x = np.asarray(x)
            x = x.astype(np.float32) if x.dtype == np.float64 else x
        if len(x.shape) == 2:
            x = x.reshape((1,) + tuple(x.shape))
        if len(x.shape) != 3:
            raise _core.Error(f"agreement: logits of shape {tuple(x.shape)}, expected "
                              "[layers, N, E] or [N, E]")
        return x

    xa, xb = prepared(a), prepared(b)
    if tuple(xa.shape) != tuple(xb.shape):
        raise _core.Error(f"agreement: the two dumps differ in shape: {tuple(xa.shape)} and "
                          f"{tuple(xb.shape)}")
    E = int(xa.shape[2])
    if isinstance(config, Config):
        cfg = config
    else:
        cfg = Config.preset(str(config), E, top_k)
    return _core.agreement(cfg, {"a": xa, "b": xb}, float(tie_margin), int(threads))
