# SPDX-License-Identifier: Apache-2.0
"""moeroute inside HuggingFace transformers models (docs/python.md, "HuggingFace models").

    import moeroute.hf
    moeroute.hf.patch(model)                              # every sparse MoE block routed by moeroute
    moeroute.hf.patch(model, capacity_factor=1.25, drop_policy="residual")   # train with drops
    with moeroute.hf.record(model, "logits.npy"):         # router logits for the planner
        model(**batch)

`patch` replaces the routing of each sparse MoE block with moeroute's — the family's exact
routing by default (Config.from_hf: the patched model's outputs equal the unpatched model's),
the block's own gate and experts, permute -> each expert on its rows -> combine, gradients
through moeroute's backward. Options train with a capacity factor and a drop policy, replay a
rollout's expert choice (docs/replay.md), and keep moeroute's aux / z-loss of each block
(`losses(model)`). `unpatch` restores the model. A block of an unknown kind is reported, never
skipped silently.

Blocks handled: MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock (with its shared expert),
Qwen3MoeSparseMoeBlock and OlmoeSparseMoeBlock — a gate Linear and a ModuleList of experts,
as transformers 4.4x and 4.5x write them. Checked with transformers 4.46.3 on Debian's torch
1.13 (python/tests/test_hf.py). Not yet: DeepseekV3MoE, SwitchTransformersSparseMLP,
NllbMoeSparseMLP (patch raises naming them; record works for every family whose gate is a
module).
"""

from __future__ import annotations

import contextlib
import types
from typing import Dict, Iterator, List, Optional

import numpy as np
import torch

from . import _core
from . import torch as mt
from .hf_config import from_hf

#: sparse MoE block classes patch() routes, by class name
BLOCKS = ("MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock",
          "OlmoeSparseMoeBlock")
#: MoE blocks of known families that patch() does not route yet
NOT_YET = ("DeepseekV3MoE", "DeepseekV2MoE", "SwitchTransformersSparseMLP", "NllbMoeSparseMLP")


def moe_blocks(model: torch.nn.Module) -> List[tuple]:
    """(name, module) of every sparse MoE block in `model`, in module order."""
    return [(n, m) for n, m in model.named_modules()
            if type(m).__name__ in BLOCKS or type(m).__name__ in NOT_YET]


def _patched_forward(self, hidden_states: torch.Tensor):
    """The block's forward with moeroute's routing (replaces the class's forward per module)."""
    state = self._moeroute
    batch, seq, d = hidden_states.shape
    if self.training and getattr(self, "jitter_noise", 0) > 0:  # Mixtral's input jitter
        hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(
            1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
    h = hidden_states.reshape(-1, d)
    router_logits = self.gate(h)
    cfg = state["config"]
    cfg["training"] = bool(self.training)
    replay = state.pop("replay_ids", None)
    out = mt.route(router_logits, cfg.__getstate__(), layout="compact", replay_ids=replay,
                   replay_ratio=state["replay_ratio"] if replay is not None else 0.0)
    state["last"] = out
    rows = mt.permute(h, out)
    offsets = out.offsets.tolist()  # host read: the expert loop runs on the host
    parts = []
    for e, expert in enumerate(self.experts):
        a, b = offsets[e], offsets[e + 1]
        if b > a:
            parts.append(expert(rows[a:b]))
    if offsets[-1] < rows.shape[0]:
        parts.append(rows.new_zeros((rows.shape[0] - offsets[-1], d)))
    expert_out = torch.cat(parts) if parts else torch.zeros_like(rows)
    y = mt.combine(expert_out.to(h.dtype), out, x=h if cfg["dispatch.dropped"] == "residual"
                   else None)
    y = y.reshape(-1, d).to(hidden_states.dtype)
    if getattr(self, "shared_expert", None) is not None:  # Qwen2-MoE
        y = y + torch.sigmoid(self.shared_expert_gate(h)) * self.shared_expert(h)
    return y.reshape(batch, seq, d), router_logits


def patch(model: torch.nn.Module, config=None, *, capacity_factor: Optional[float] = None,
          drop_policy: Optional[str] = None, aux_loss_coeff: Optional[float] = None,
          z_loss_coeff: Optional[float] = None, replay_ratio: float = 0.0) -> List[str]:
    """Routes every sparse MoE block of `model` with moeroute. config: a Config for all blocks
    (default: Config.from_hf(model.config), the family's exact routing); capacity_factor (a
    number sets capacity.mode = factor), drop_policy, aux_loss_coeff, z_loss_coeff override it.
    Returns the names of the patched blocks. Raises moeroute.Error when the model has no MoE
    block patch() knows, or a block of a family it does not route yet (named)."""
    cfg = mt.with_overrides(from_hf(model.config) if config is None else config,
                            capacity_factor, drop_policy, aux_loss_coeff, z_loss_coeff)
    blocks = moe_blocks(model)
    unknown = [f"{n} ({type(m).__name__})" for n, m in blocks if type(m).__name__ in NOT_YET]
    if unknown:
        raise _core.Error("moeroute.hf.patch: these MoE blocks are not routed by moeroute yet: " +
                          ", ".join(unknown))
    if not blocks:
        raise _core.Error(f"moeroute.hf.patch: {type(model).__name__} has no sparse MoE block "
                          f"(known: {', '.join(BLOCKS)})")
    names = []
    for name, block in blocks:
        if getattr(block, "_moeroute", None) is not None:
            continue  # already patched
        if not isinstance(block.experts, torch.nn.ModuleList) or \
                not isinstance(block.gate, torch.nn.Linear):
            raise _core.Error(f"moeroute.hf.patch: {name} ({type(block).__name__}) keeps its "
                              "experts fused or its gate as a router module (transformers 5.x "
                              "layout), which patch() does not route yet; transformers 4.4x / "
                              "4.5x blocks (a gate Linear, a ModuleList of experts) it does")
        E = len(block.experts)
        if E != cfg.num_experts:
            raise _core.Error(f"moeroute.hf.patch: {name} has {E} experts, the config "
                              f"{cfg.num_experts}")
        block._moeroute = {"config": cfg.copy(), "replay_ratio": float(replay_ratio)}
        block.forward = types.MethodType(_patched_forward, block)
        names.append(name)
    return names


def unpatch(model: torch.nn.Module) -> int:
    """Restores every patched block's own forward; returns how many were patched."""
    n = 0
    for _, block in moe_blocks(model):
        if getattr(block, "_moeroute", None) is not None:
            del block.forward  # the instance attribute: the class's forward again
            block._moeroute = None
            n += 1
    return n


def replay(model: torch.nn.Module, ids_per_layer) -> None:
    """Routing replay (docs/replay.md) for the next forward: ids_per_layer[i] [tokens, k] for
    the i-th patched block (a RoutingRecord's replay_ids(i), or vLLM's routed_experts[:, i]).
    Each block uses its ids once."""
    blocks = [b for _, b in moe_blocks(model) if getattr(b, "_moeroute", None) is not None]
    if len(ids_per_layer) != len(blocks):
        raise _core.Error(f"moeroute.hf.replay: {len(ids_per_layer)} layers of ids for "
                          f"{len(blocks)} patched blocks")
    for b, ids in zip(blocks, ids_per_layer):
        b._moeroute["replay_ids"] = torch.as_tensor(ids)


def outputs(model: torch.nn.Module) -> Dict[str, mt.RouterOutput]:
    """The last RouterOutput of every patched block, by block name (ids, fates, drops)."""
    return {n: b._moeroute["last"] for n, b in moe_blocks(model)
            if getattr(b, "_moeroute", None) is not None and "last" in b._moeroute}


def losses(model: torch.nn.Module) -> torch.Tensor:
    """moeroute's aux + sequence aux + z-loss of the last forward, summed over the patched
    blocks (coefficients included; differentiable)."""
    total = None
    for out in outputs(model).values():
        term = out.aux_loss + out.sequence_aux_loss + out.z_loss
        total = term if total is None else total + term
    if total is None:
        raise _core.Error("moeroute.hf.losses: no patched block has run a forward")
    return total


@contextlib.contextmanager
def record(model: torch.nn.Module, path: str, *, dtype=np.float16,
           group_ids: Optional[str] = None) -> Iterator[Dict[str, list]]:
    """Records the router logits of every MoE block (patched or not) while the context is
    open, and writes them at exit as the .npy `moeroute-capacity --npy` reads: [layers,
    tokens, E], float16 by default, tokens in arrival order. `group_ids`: also write each
    token's forward-call index ([tokens] float64, the planner's --group-ids: one request per
    call). Then:  moeroute-capacity --npy PATH --batch-tokens 4096 --preset <family>."""
    blocks = moe_blocks(model)
    if not blocks:
        raise _core.Error(f"moeroute.hf.record: {type(model).__name__} has no MoE block")
    chunks: Dict[str, list] = {n: [] for n, _ in blocks}
    calls: list = []
    handles = []

    def hook(name):
        def save(_module, _inputs, output):
            logits = output.detach().reshape(-1, output.shape[-1]).float().cpu().numpy()
            chunks[name].append(logits.astype(dtype))
            if name == blocks[0][0]:
                calls.append(logits.shape[0])
        return save

    for name, block in blocks:
        handles.append(block.gate.register_forward_hook(hook(name)))
    try:
        yield chunks
    finally:
        for h in handles:
            h.remove()
    layers = [np.concatenate(c) if c else np.zeros((0, 0), dtype) for c in chunks.values()]
    if not layers or layers[0].size == 0:
        raise _core.Error("moeroute.hf.record: no forward ran inside the context")
    np.save(path, np.stack(layers))
    if group_ids is not None:
        np.save(group_ids, np.repeat(np.arange(len(calls), dtype=np.float64), calls))
