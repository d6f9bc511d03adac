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
as transformers 4.4x and 4.5x write them; DeepseekV3MoE and DeepseekV2MoE (a gate holding
the router weight, shared experts); SwitchTransformersSparseMLP and NllbMoeSparseMLP (a
router classifier and a ModuleDict of experts; their router tuples returned as transformers
does). Checked with transformers 4.46.3 on Debian's torch 1.13 and 4.57.6 on torch 2.5.1
(python/tests/test_hf.py). transformers 5.x blocks that fuse their experts into one module
(Mixtral, Qwen, OLMoE, DeepSeek in 5.x) are routed through their gate, their own experts
computing; 5.x's Switch and NLLB blocks are reported, not routed (checked: 5.25.0).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
import types
from typing import Callable, Dict, Iterable, Iterator, List, Optional

import numpy as np
import torch

from . import _core
from . import torch as mt
from .hf_config import from_hf

#: sparse MoE block classes patch() routes, by class name: a gate Linear and a ModuleList of
#: experts (GATE_BLOCKS), or a router module with a classifier Linear and a ModuleDict of
#: experts (ROUTER_BLOCKS: Switch Transformers, NLLB-MoE)
GATE_BLOCKS = ("MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock",
               "OlmoeSparseMoeBlock")
#: DeepSeek's blocks: a gate module holding the router weight [E, d] (and V3's
#: e_score_correction_bias) that returns (ids, weights), a ModuleList of experts, shared experts
DEEPSEEK_BLOCKS = ("DeepseekV3MoE", "DeepseekV2MoE", "DeepseekV2Moe")  # 5.x spells V2's so
ROUTER_BLOCKS = ("SwitchTransformersSparseMLP", "NllbMoeSparseMLP")
BLOCKS = GATE_BLOCKS + DEEPSEEK_BLOCKS + ROUTER_BLOCKS

_KEPT, _DROPPED = 0, 2  # RouterOutput.fate values


def moe_blocks(model: torch.nn.Module) -> List[tuple]:
    """(name, module) of every sparse MoE block in `model`, in module order."""
    return [(n, m) for n, m in model.named_modules()
            if type(m).__name__ in BLOCKS]


def _gate_of(block) -> torch.nn.Module:
    """The module whose output is the block's router logits."""
    return block.router.classifier if type(block).__name__ in ROUTER_BLOCKS else block.gate


def _experts_of(block) -> list:
    ex = block.experts
    return list(ex.values()) if isinstance(ex, torch.nn.ModuleDict) else list(ex)


def _config(block, rows: int = 0):
    """The block's Config for this forward: its training mode (NLLB's eval capacity, noise) and,
    for Switch, capacity counted per batch row of `rows` tokens."""
    return block._moeroute["make"](bool(block.training), rows)


def _route(block, router_logits, cfg, valid=None, bias=None):
    state = block._moeroute
    replay = state.pop("replay_ids", None)
    out = mt.route(router_logits, cfg.__getstate__(), bias=bias, valid=valid, layout="compact",
                   replay_ids=replay,
                   replay_ratio=state["replay_ratio"] if replay is not None else 0.0)
    state["last"] = out
    return out


def _expert_outputs(block, rows, out, scale=None, every=True):
    """Each expert on its rows of the buffer (segment e of out.offsets), in expert order; the
    padding rows past the last segment stay 0. `scale` maps an expert's output (NLLB's token
    dropout). `every`: call an expert with no rows too (on zero rows), as Mixtral's, Qwen's,
    OLMoE's and NLLB's blocks do, so its parameters get a zero gradient rather than none
    (optimizers treat the two differently); Switch's and DeepSeek's blocks skip it."""
    d = rows.shape[-1]
    offsets = out.offsets.tolist()  # host read: the expert loop runs on the host
    parts = []
    for e, expert in enumerate(_experts_of(block)):
        a, b = offsets[e], offsets[e + 1]
        if b > a or every:
            o = expert(rows[a:b])
            parts.append(scale(o) if scale is not None else o)
    if offsets[-1] < rows.shape[0]:
        parts.append(rows.new_zeros((rows.shape[0] - offsets[-1], d)))
    return torch.cat(parts) if parts else torch.zeros_like(rows)


def _forward_gate(self, hidden_states: torch.Tensor):
    """Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE: (y, router_logits) as the block returns them."""
    batch, seq, d = hidden_states.shape
    if self.training and getattr(self, "jitter_noise", 0) > 0:  # Mixtral's input jitter
        hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(
            1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
    h = hidden_states.reshape(-1, d)
    router_logits = self.gate(h)
    cfg = _config(self)
    out = _route(self, router_logits, cfg)
    expert_out = _expert_outputs(self, mt.permute(h, out), out)
    y = mt.combine(expert_out.to(h.dtype), out, x=h if cfg["dispatch.dropped"] == "residual"
                   else None)
    y = y.reshape(-1, d).to(hidden_states.dtype)
    if getattr(self, "shared_expert", None) is not None:  # Qwen2-MoE
        y = y + torch.sigmoid(self.shared_expert_gate(h)) * self.shared_expert(h)
    return y.reshape(batch, seq, d), router_logits


def _forward_switch(self, hidden_states: torch.Tensor):
    """SwitchTransformersSparseMLP: (y, (router_logits, expert_index)) as transformers
    returns them. The router runs in its router_dtype (jitter on its input in training); the
    capacity counts per batch row. A dropped token: transformers before 4.52 outputs
    router_prob * x (its hidden state passed through, then scaled like every token), 4.52 and
    later 0 — the config's drop policy (residual / zero_weight, Config.from_hf) says which;
    moeroute routes it as dropped and the prob * x term is added here, in torch, with its
    gradient."""
    batch, seq, d = hidden_states.shape
    router = self.router
    x = hidden_states.to(router.dtype)
    if self.training and router.jitter_noise > 0:
        x = x * torch.empty_like(x).uniform_(1.0 - router.jitter_noise, 1.0 + router.jitter_noise)
    router._cast_classifier()
    router_logits = router.classifier(x)
    cfg = _config(self, seq)
    scaled_pass = cfg["dispatch.dropped"] == "residual"
    if scaled_pass:
        cfg = cfg.copy()
        cfg["dispatch.dropped"] = "zero_weight"  # the same drops; the pass-through added below
    h = hidden_states.reshape(-1, d)
    out = _route(self, router_logits.reshape(-1, router_logits.shape[-1]), cfg)
    expert_out = _expert_outputs(self, mt.permute(h, out), out, every=False)
    y = mt.combine(expert_out.to(h.dtype), out)
    fate = out.fate[:, 0].long()
    if scaled_pass:
        prob = torch.softmax(router_logits, dim=-1, dtype=router.dtype).max(dim=-1).values
        prob = prob.to(hidden_states.dtype).reshape(-1, 1)
        y = y + torch.where((fate == _DROPPED).unsqueeze(1), prob * h, torch.zeros_like(h))
    expert_index = torch.where(fate == _KEPT, out.ids[:, 0].long(), torch.zeros_like(fate))
    return (y.reshape(batch, seq, d).to(hidden_states.dtype),
            (router_logits, expert_index.reshape(batch, seq)))


def _forward_nllb(self, hidden_states: torch.Tensor, padding_mask=False):
    """NllbMoeSparseMLP: (y, (router_probs, top_1_expert_index)) as transformers returns them:
    router_probs the [T, E] combine weights (0 where nothing is routed), the top-1 index 0 for
    a token whose first choice was dropped. Padding tokens (the attention mask the layer
    passes, unless router_ignore_padding_tokens) are routed nowhere; the experts' outputs are
    scaled by 1 - moe_token_dropout in eval and dropped out in training, as the block does."""
    batch, seq, d = hidden_states.shape
    router = self.router
    h = hidden_states.reshape(-1, d)
    T = h.shape[0]
    router._cast_classifier()
    router_logits = router.classifier(h.to(router.dtype))
    valid = None
    if padding_mask is not None and padding_mask is not False and \
            not router.router_ignore_padding_tokens:
        pm = padding_mask
        if pm.dim() == 4:  # the layer's additive attention mask: its last query row
            pm = pm[:, :, -1, :].reshape(-1)[-T:]
        valid = ~pm.bool()
    out = _route(self, router_logits, _config(self), valid=valid)
    p = self.moe_token_dropout
    scale = None
    if p > 0:
        scale = self.token_dropout if self.training else (lambda o: o * (1 - p))
    expert_out = _expert_outputs(self, mt.permute(h, out), out, scale)
    y = mt.combine(expert_out.to(h.dtype), out)
    ids = out.ids.long()
    router_probs = torch.zeros(T, router_logits.shape[-1], dtype=out.weight.dtype,
                               device=h.device).scatter(1, ids, out.weight)
    fate = out.fate[:, 0].long()
    top1 = torch.where(fate == _KEPT, ids[:, 0], torch.zeros_like(fate))
    return y.reshape(batch, seq, d).to(hidden_states.dtype), (router_probs, top1)


def _forward_deepseek(self, hidden_states: torch.Tensor):
    """DeepseekV3MoE / DeepseekV2MoE: the routed experts' sum plus the shared experts, as the
    block returns it (no router logits: the gate returns ids and weights). The router logits
    are the gate's float32 product, V3's e_score_correction_bias is the expert bias; an expert
    with no tokens is skipped, as the block does."""
    shape, d = hidden_states.shape, hidden_states.shape[-1]
    h = hidden_states.reshape(-1, d)
    gate = self.gate
    router_logits = torch.nn.functional.linear(h.float(), gate.weight.float())
    cfg = _config(self)
    bias = getattr(gate, "e_score_correction_bias", None) if cfg["gating.expert_bias"] else None
    out = _route(self, router_logits, cfg, bias=bias)
    expert_out = _expert_outputs(self, mt.permute(h, out), out, every=False)
    y = mt.combine(expert_out.to(h.dtype), out).reshape(shape).to(hidden_states.dtype)
    if getattr(self, "shared_experts", None) is not None:
        y = y + self.shared_experts(hidden_states)
    return y


_FORWARDS = {"SwitchTransformersSparseMLP": _forward_switch, "NllbMoeSparseMLP": _forward_nllb,
             "DeepseekV3MoE": _forward_deepseek, "DeepseekV2MoE": _forward_deepseek}


def _fused(block) -> bool:
    """transformers 5.x: the experts are one module holding [E, ...] weight tensors and taking
    (hidden, top_k_index, top_k_weights); the gate returns (logits, weights, index)."""
    ex = getattr(block, "experts", None)
    return ex is not None and not isinstance(ex, (torch.nn.ModuleList, torch.nn.ModuleDict)) \
        and hasattr(ex, "gate_up_proj") and hasattr(getattr(block, "gate", None), "weight")


def _gate_forward_fused(block, gate, hidden_states):
    """A transformers 5.x gate routed by moeroute: the family's own router logits (its gate's
    forward, so dtype and layout are the family's), then moeroute's choice, capacity and
    weights as (logits, weights [T, k], index [T, k]). The block's own experts (eager, batched
    or grouped) then do the compute. An assignment that holds no row keeps its chosen expert
    with weight 0, not the index-E sentinel 5.x's expert implementations accept: the grouped
    one leaves sentinel rows unwritten and multiplies them by the zero weight, which turns
    their garbage into NaN and a huge weight gradient (seen on CPU, transformers 5.25)."""
    router_logits = type(gate).forward(gate, hidden_states)[0]
    cfg = _config(block)
    bias = getattr(gate, "e_score_correction_bias", None) if cfg["gating.expert_bias"] else None
    out = _route(block, router_logits.reshape(-1, router_logits.shape[-1]), cfg, bias=bias)
    index = torch.where(out.expert >= 0, out.expert, out.ids).long()
    return router_logits, out.weight, index


def _residual_hook(block, inputs, output):
    """drop_policy residual on a 5.x block: a valid token with nothing kept gets its x."""
    out = block._moeroute.get("last")
    if out is None or _config(block)["dispatch.dropped"] != "residual":
        return output
    x = inputs[0]
    held = (out.fate == 0) | (out.fate == 1)
    none = (~held.any(dim=1)) & (out.fate != 3).any(dim=1)
    return output + torch.where(none.reshape(x.shape[:-1] + (1,)), x, torch.zeros_like(x))


def _config_maker(model, config, overrides):
    """(training, rows) -> Config: the given config with its training flag, or the family's
    own (Config.from_hf for that mode and row length), each with the overrides, made once."""
    cache = {}

    def make(training: bool, rows: int):
        key = (training, rows if config is None else 0)
        if key not in cache:
            c = from_hf(model.config, training=training, row_tokens=rows) if config is None \
                else config.copy()
            c = mt.with_overrides(c, *overrides)
            c["training"] = training
            cache[key] = c
        return cache[key]

    return make


def patch(model: torch.nn.Module, config=None, *, capacity_factor: Optional[float] = None,
          drop_policy: Optional[str] = None, aux_loss_coeff: Optional[float] = None,
          z_loss_coeff: Optional[float] = None, replay_ratio: float = 0.0) -> List[str]:
    """Routes every sparse MoE block of `model` with moeroute. config: a Config for all blocks
    (default: Config.from_hf(model.config), the family's exact routing, made for the block's
    train / eval mode at each forward); capacity_factor (a number sets capacity.mode = factor),
    drop_policy, aux_loss_coeff, z_loss_coeff override it. Returns the names of the patched
    blocks. Raises moeroute.Error when the model has no MoE block patch() knows, or a block in
    a layout it does not route (named: transformers 5.x's fused experts)."""
    overrides = (capacity_factor, drop_policy, aux_loss_coeff, z_loss_coeff)
    make = _config_maker(model, config, overrides)
    cfg = make(True, 0)  # checks the config and the overrides now
    blocks = moe_blocks(model)
    if not blocks:
        raise _core.Error(f"moeroute.hf.patch: {type(model).__name__} has no sparse MoE block "
                          f"(known: {', '.join(BLOCKS)})")
    names = []
    for name, block in blocks:
        if getattr(block, "_moeroute", None) is not None:
            continue  # already patched
        kind = type(block).__name__
        if _fused(block):  # transformers 5.x: route through the gate, compute in its experts
            E = int(block.experts.gate_up_proj.shape[0])
            if E != cfg.num_experts:
                raise _core.Error(f"moeroute.hf.patch: {name} has {E} experts, the config "
                                  f"{cfg.num_experts}")
            block._moeroute = {"make": make, "replay_ratio": float(replay_ratio),
                               "hook": block.register_forward_hook(_residual_hook)}
            block.gate.forward = types.MethodType(
                lambda gate, hs, block=block: _gate_forward_fused(block, gate, hs), block.gate)
            names.append(name)
            continue
        if kind in ROUTER_BLOCKS and type(block.experts) is not torch.nn.ModuleDict:
            raise _core.Error(f"moeroute.hf.patch: {name} ({kind}) is transformers 5.x's "
                              "(experts with their own forward, a router returning masks), "
                              "which patch() does not route yet; transformers 4.x's it does")
        experts_ok = isinstance(block.experts, torch.nn.ModuleDict if kind in ROUTER_BLOCKS
                                else torch.nn.ModuleList)
        if kind in DEEPSEEK_BLOCKS:
            gate_ok = isinstance(getattr(getattr(block, "gate", None), "weight", None),
                                 torch.nn.Parameter)
        else:
            gate_ok = isinstance(getattr(getattr(block, "router", None), "classifier", None)
                                 if kind in ROUTER_BLOCKS else getattr(block, "gate", None),
                                 torch.nn.Linear)
        if not experts_ok or not gate_ok:
            raise _core.Error(f"moeroute.hf.patch: {name} ({kind}) keeps its experts fused or its "
                              "gate as a router module (transformers 5.x layout), which patch() "
                              "does not route yet; transformers 4.4x / 4.5x blocks (a gate Linear "
                              "and a ModuleList of experts, or Switch / NLLB's router classifier "
                              "and ModuleDict) it does")
        E = len(block.experts)
        if E != cfg.num_experts:
            raise _core.Error(f"moeroute.hf.patch: {name} has {E} experts, the config "
                              f"{cfg.num_experts}")
        block._moeroute = {"make": make, "replay_ratio": float(replay_ratio)}
        block.forward = types.MethodType(_FORWARDS.get(kind, _forward_gate), block)
        names.append(name)
    return names


def unpatch(model: torch.nn.Module) -> int:
    """Restores every patched block's own forward; returns how many were patched."""
    n = 0
    for _, block in moe_blocks(model):
        state = getattr(block, "_moeroute", None)
        if state is not None:
            if "hook" in state:  # a 5.x block: its gate was patched
                state["hook"].remove()
                del block.gate.forward
            else:
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
           group_ids: Optional[str] = None) -> Iterator[Dict[str, int]]:
    """Records the router logits of every MoE block (patched or not) while the context is
    open, and writes them at exit as the .npy `moeroute-capacity --npy` reads: [layers,
    tokens, E], float16 by default, tokens in arrival order. Each forward's logits are
    appended to a per-layer file beside `path` as they arrive and assembled through a memory
    map at exit, so a long recording holds one batch in memory, not the dump. `group_ids`: also
    write each token's forward-call index ([tokens] float64, the planner's --group-ids: one
    request per call). Yields {"tokens": recorded so far, "calls": forwards}. Then:
    moeroute-capacity --npy PATH --batch-tokens 4096 --preset <family>."""
    blocks = moe_blocks(model)
    if not blocks:
        raise _core.Error(f"moeroute.hf.record: {type(model).__name__} has no MoE block")
    directory = os.path.dirname(os.path.abspath(path))
    scratch = tempfile.mkdtemp(prefix=".moeroute-record-", dir=directory)
    files = [open(os.path.join(scratch, f"layer{i}.bin"), "wb") for i in range(len(blocks))]
    rows = [0] * len(blocks)
    experts = [0] * len(blocks)
    calls: list = []
    info = {"tokens": 0, "calls": 0}
    handles = []

    def hook(i):
        def save(module, inputs, output):
            if isinstance(output, tuple):
                first = output[0]
                if first.is_floating_point() and first.shape[-1] == module.weight.shape[0]:
                    output = first  # transformers 5.x: (logits, weights, index)
                else:  # DeepSeek's 4.x gate returns (ids, weights): its float32 logits
                    x = inputs[0].detach()
                    output = torch.nn.functional.linear(x.reshape(-1, x.shape[-1]).float(),
                                                        module.weight.detach().float())
            logits = output.detach().reshape(-1, output.shape[-1]).float().cpu().numpy()
            files[i].write(np.ascontiguousarray(logits.astype(dtype)).tobytes())
            rows[i] += logits.shape[0]
            experts[i] = logits.shape[1]
            if i == 0:
                calls.append(logits.shape[0])
                info["tokens"] += logits.shape[0]
                info["calls"] += 1
        return save

    try:
        for i, (_, block) in enumerate(blocks):
            handles.append(_gate_of(block).register_forward_hook(hook(i)))
        try:
            yield info
        finally:
            for h in handles:
                h.remove()
            for f in files:
                f.close()
        if rows[0] == 0:
            raise _core.Error("moeroute.hf.record: no forward ran inside the context")
        if len(set(rows)) != 1 or len(set(experts)) != 1:
            raise _core.Error(f"moeroute.hf.record: the layers saw {rows} tokens of {experts} "
                              "experts: every MoE layer must route every token")
        out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype,
                                        shape=(len(blocks), rows[0], experts[0]))
        for i, f in enumerate(files):
            src = np.memmap(f.name, dtype=dtype, mode="r", shape=(rows[0], experts[0]))
            for a in range(0, rows[0], 1 << 16):  # bounded copies
                out[i, a:a + (1 << 16)] = src[a:a + (1 << 16)]
            del src
        out.flush()
        del out
        if group_ids is not None:
            np.save(group_ids, np.repeat(np.arange(len(calls), dtype=np.float64), calls))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def record_batches(model: torch.nn.Module, batches: Iterable, path: str, *, dtype=np.float16,
                   group_ids: Optional[str] = None, progress: bool = True,
                   forward: Optional[Callable] = None) -> tuple:
    """Runs the model on every batch (model(**batch) for a dict, else model(batch); or
    forward(model, batch)) without gradients, records the router logits as record() does and
    shows a progress line on stderr. Returns the dump's shape (layers, tokens, E)."""
    total = len(batches) if hasattr(batches, "__len__") else None
    run = forward or (lambda m, b: m(**b) if isinstance(b, dict) else m(b))
    start = time.monotonic()
    with torch.no_grad(), record(model, path, dtype=dtype, group_ids=group_ids) as info:
        for n, batch in enumerate(batches, 1):
            run(model, batch)
            if progress:
                rate = info["tokens"] / max(time.monotonic() - start, 1e-9)
                of = f"/{total}" if total is not None else ""
                print(f"\rmoeroute.hf.record: batch {n}{of}, {info['tokens']} tokens "
                      f"({rate:.0f} tokens/s)", end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr)
    return tuple(np.load(path, mmap_mode="r").shape)
