# SPDX-License-Identifier: Apache-2.0
"""The routing stages on numpy arrays or torch tensors, one function per C++ operation
(docs/api.md): gating, dispatch, layout, permute, combine, losses and their backward passes.
Each allocates its outputs in the caller's framework from the shapes the C++ side lists for
the config and calls the C++ stage; no routing is computed here. Results are plain objects
of arrays, and one stage's result is the next stage's input, as in C++."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence

import numpy as np

from . import _arrays
from . import _core
from ._core import Config


class _Arrays:
    """Named arrays of one stage, readable as attributes (result.ids, result.weight); a name
    that is a Python keyword takes a trailing underscore (laid.nonlocal_)."""

    def __init__(self, arrays: Dict[str, Any]):
        self.arrays = arrays

    def __getattr__(self, name):
        arrays = self.__dict__.get("arrays", {})
        if name in arrays:
            return arrays[name]
        if name.endswith("_") and name[:-1] in arrays:
            return arrays[name[:-1]]
        raise AttributeError(f"{type(self).__name__} has no array '{name}'")

    def __repr__(self):
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self.arrays.items())
        return f"{type(self).__name__}({shapes})"


class Gated(_Arrays):
    """gating's outputs: ids, gates [T, k] (best first), logsumexp [T], the loss sums
    (aux_score_sum, aux_count [E], valid_tokens, z_sum_squares, nonfinite [1], the seq_*
    sums with loss.sequence_length), and reroute_ids / token_priority / second_skipped /
    aux_scores / aux_count_ids where the config or the call asks for them."""

    def __init__(self, arrays, tokens: int):
        super().__init__(arrays)
        self.tokens = tokens

    @classmethod
    def from_ids(cls, ids, config: Config, *, gates=None, reroute_ids=None, token_priority=None,
                 second_skipped=None) -> "Gated":
        """An engine's own top-k as the input of dispatch, layout, permute and combine (C++:
        reference::routing_from_ids, dispatch_params::gated): ids [T, k] in any integer dtype
        (torch.topk's int64 is converted once), gates [T, k] (None: 1.0 each, for a layout
        only: the combine weights are then 1). What the config reads besides: reroute_ids
        [T, R] for next_choice, token_priority [T] for batch_prioritized, second_skipped [T]
        for NLLB's random policy. dispatch checks every id (in [0, E), distinct per token)
        and names the first bad one."""
        if len(ids.shape) != 2 or int(ids.shape[1]) != config.top_k:
            raise _core.Error(f"Gated.from_ids: ids has shape {tuple(ids.shape)}, expected "
                              f"[T, top_k = {config.top_k}]")
        T = int(ids.shape[0])
        arrays = {"ids": _arrays.as_int32(ids, "ids")}
        if gates is None:
            gates = _arrays.empty_like_framework(ids, (T, config.top_k), "float32")
            gates[...] = 1.0
        elif _arrays.dtype_name(gates) != "float32":
            gates = gates.float() if _arrays.is_torch(gates) else np.asarray(gates, np.float32)
        arrays["gates"] = gates
        for name, value in (("reroute_ids", reroute_ids), ("token_priority", token_priority),
                            ("second_skipped", second_skipped)):
            if value is not None:
                arrays[name] = _arrays.as_int32(value, name) if name == "reroute_ids" else value
        return cls(arrays, T)


def totals_dict(totals) -> Dict[str, int]:
    """A dispatch's totals array [8] int64 by field name (a host read of a device array)."""
    values = totals.cpu().tolist() if _arrays.is_torch(totals) else totals.tolist()
    return dict(zip(_core.totals_fields, (int(v) for v in values)))


class Dispatched(_Arrays):
    """dispatch's outputs: expert, slot, weight, fate [T, k]; requested, kept, rerouted,
    dropped [E]; received, load [total_experts]; totals [8] (see totals_dict)."""

    def totals_dict(self) -> Dict[str, int]:
        """The batch totals by name (capacity, kept, rerouted, dropped, ...): a host read."""
        return totals_dict(self.arrays["totals"])


class Laid(_Arrays):
    """layout's outputs: offsets, rows_used (per segment), row_token [max_rows] (-1 padding),
    assignment_row [T, k] (-1 none), num_rows [1], block_expert (compact), nonlocal (with an
    expert map). `max_rows` is the size the buffers were allocated for."""

    def __init__(self, arrays, kind: str, block_size: int, max_rows: int):
        super().__init__(arrays)
        self.kind = kind
        self.block_size = block_size
        self.max_rows = max_rows


def _tokens_of(x, what: str) -> int:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise _core.Error(f"{what}: expected a numpy array or a torch tensor, got "
                          f"{type(x).__name__}")
    if len(x.shape) != 2:
        raise _core.Error(f"{what}: must be 2-D [tokens, ...], got shape {tuple(x.shape)}")
    return int(x.shape[0])


def gating(logits, config: Config, *, bias=None, valid=None, per_token_aux: bool = False,
           replay_ids=None, replay_ratio: float = 0.0, threads: int = 0) -> Gated:
    """Top-k ids and gates of router logits [T, E] (float32, float16 or bfloat16), their
    logsumexp and the loss sums. `bias` [E] float32: the expert bias (gating.expert_bias);
    `valid` [T] bool / uint8: padding mask; `per_token_aux`: also aux_scores [T, E] and
    aux_count_ids [T, c] for a caller's own aux loss.

    Routing replay (docs/replay.md): `replay_ids` [T, k] (int32, int64 or int16; -1 = the
    router chooses) forces each slot's expert, the gates recomputed from `logits`;
    `replay_ratio` in [0, 1] keeps a replayed expert only if its score is at least that
    fraction of the weakest score of the router's own top-k. The result then also has
    replay_replaced [1] (slots the filter gave back) and replay_invalid [1] (CUDA: bad ids
    taken as -1; the CPU raises moeroute.Error instead)."""
    T = _tokens_of(logits, "logits")
    replayed = replay_ids is not None
    specs = _core.gating_outputs(config, T, per_token_aux, replayed)
    out = _arrays.allocate(logits, specs, T == 0)
    cuda = _arrays.on_cuda(logits) or _core.emulated
    args = dict(out, logits=logits, bias=bias, valid=_arrays.as_mask(valid),
                workspace=_arrays.workspace(logits, _core.gating_workspace_bytes(config, T, cuda)))
    if replayed:
        args["replay_ids"] = _arrays.as_int32(replay_ids, "replay_ids")
    _core.gating(config, args, float(replay_ratio), threads, _arrays.stream_of(logits))
    return Gated(out, T)


def _count_of(token_count, like, tokens: int):
    """token_count as the [1] int64 array the C++ side reads, in `like`'s framework and on its
    device: a Python int is checked against [0, tokens] and written into one; an array (0-d or
    [1], int64; a torch tensor on like's device) is taken as it is, its value never read here
    (on a device it stays there)."""
    if isinstance(token_count, (int, np.integer)) and not isinstance(token_count, bool):
        n = int(token_count)
        if not 0 <= n <= tokens:
            raise _core.Error(f"token_count = {n}: must be in [0, tokens = {tokens}]")
        out = _arrays.empty_like_framework(like, (1,), "int64")
        out[0] = n
        return out
    if (not hasattr(token_count, "shape") or not hasattr(token_count, "dtype")
            or tuple(token_count.shape) not in ((), (1,))
            or _arrays.dtype_name(token_count) != "int64"):
        got = (f"{_arrays.dtype_name(token_count)} of shape {tuple(token_count.shape)}"
               if hasattr(token_count, "shape") and hasattr(token_count, "dtype")
               else type(token_count).__name__)
        raise _core.Error(f"token_count: expected an int or a [1] int64 array, got {got}")
    if _arrays.is_torch(like) and _arrays.is_torch(token_count) and \
            token_count.device != like.device:
        raise _core.Error(f"token_count: on {token_count.device}, the logits on {like.device}: "
                          "pass it on the logits' device")
    return token_count.reshape(1)


def _named_count(message: str) -> str:
    """A C++ message's count (token_mask's *d_count, dispatch's *d_token_count) by the name the
    Python call took it under."""
    return message.replace("*d_token_count", "token_count").replace("*d_count", "token_count")


def token_mask(token_count, tokens: int, *, valid=None):
    """The [tokens] uint8 padding mask of a batch whose first n rows are real:
    mask[t] = t < n and valid[t] (valid: [T] bool / uint8, optional). `token_count` is n: an
    int, or a [1] int64 array — on a device it is read there, never on the host (an engine's
    CUDA graph captured once for the largest batch, the count written before each replay; the
    device clamps n to [0, T], the CPU raises outside it). route(token_count=) applies it; pass
    it as valid= to gating, dispatch and the backward passes of a batch routed stage by stage."""
    T = int(tokens)
    like = token_count if hasattr(token_count, "shape") else np.empty(0)
    count = _count_of(token_count, like, T)
    mask = _arrays.empty_like_framework(count, (T,), "uint8")
    try:
        _core.token_mask(dict(token_count=count, valid=_arrays.as_mask(valid), mask=mask),
                         _arrays.stream_of(count))
    except _core.Error as e:
        raise _core.Error(_named_count(str(e))) from None
    return mask


def dispatch(gated: Gated, config: Config, *, valid=None, token_count=None,
             threads: int = 0) -> Dispatched:
    """Capacity assignment: each (token, choice) kept, rerouted or dropped, its slot and
    combine weight, and the per-expert counts. `token_count` (an int or a [1] int64 array,
    optional): only the first n rows are real — C is the capacity of n tokens and the result
    that of dispatching those n alone; rows [n, T) must be masked in `valid` too (token_mask)."""
    like = gated.ids
    T = gated.tokens
    out = _arrays.allocate(like, _core.dispatch_outputs(config, T), T == 0)
    args = dict(gated.arrays)
    cuda = _arrays.on_cuda(like) or _core.emulated
    if token_count is not None:
        args["token_count"] = _count_of(token_count, like, T)
    args.update(out, valid=_arrays.as_mask(valid),
                workspace=_arrays.workspace(like, _core.dispatch_workspace_bytes(config, T, cuda)))
    try:
        _core.dispatch(config, args, threads, _arrays.stream_of(like))
    except _core.Error as e:
        raise _core.Error(_named_count(_python_indices(str(e), config))) from None
    return Dispatched(out)


_FLAT = re.compile(r"gated\.d_(ids|gates|reroute_ids)\[(\d+)\]")


def _python_indices(message: str, config: Config) -> str:
    """A C++ message's flat element of a [T, width] array (gated.d_ids[13]) as the Python
    array's [t, j] (ids[6, 1])."""
    def as_2d(m):
        width = config.reroute_candidates if m.group(1) == "reroute_ids" else config.top_k
        t, j = divmod(int(m.group(2)), max(width, 1))
        return f"{m.group(1)}[{t}, {j}]"
    return _FLAT.sub(as_2d, message)


def layout(dispatched: Dispatched, config: Config, *, kind: str = "padded", block_size: int = 1,
           expert_map=None, local_experts: Optional[int] = None, threads: int = 0) -> Laid:
    """The expert buffer's rows: padded (E x C, a capacity needed) or compact (segments
    aligned to block_size). `expert_map` [total_experts] int32: a local-expert view (compact)
    of `local_experts` experts (its entries >= 0; counted from the map when not given, a host
    read of a device map)."""
    like = dispatched.expert
    T = int(like.shape[0])
    local = 0
    if expert_map is not None:
        if local_experts is None:
            m = expert_map.tolist() if not _arrays.is_torch(expert_map) else \
                expert_map.cpu().tolist()
            local_experts = sum(1 for v in m if v >= 0)
        local = int(local_experts)
    specs = _core.layout_outputs(config, T, kind, block_size, local)
    out = _arrays.allocate(like, specs, T == 0)
    args = dict(dispatched.arrays)
    args.update(out, expert_map=expert_map)
    _core.layout(config, args, kind, block_size, local, threads, _arrays.stream_of(like))
    max_rows = dict((n, s) for n, s, _ in specs)["row_token"][0]
    return Laid(out, kind, block_size, max_rows)


def permute(x, laid: Laid, config: Config, *, out=None, threads: int = 0):
    """Hidden states x [T, d] gathered into the expert buffer [max_rows, d]: padding rows are
    0. The stage writes the rows in use (laid.num_rows, read on the device); the rows past them
    stay as the buffer had them: zero in the fresh buffer this returns, or what `out` (a
    buffer reused across steps, zeroed once) held."""
    if out is None:
        out = _arrays.empty_like_framework(x, (laid.max_rows, int(x.shape[1])),
                                           _arrays.dtype_name(x))
        if _arrays.on_cuda(x):  # reading num_rows would synchronise: zero all of it
            out[...] = 0
        else:  # the stage writes every row below num_rows (padding rows as 0): zero the rest
            out[int(laid.num_rows[0]):] = 0
    _core.permute(config, dict(x=x, row_token=laid.row_token, num_rows=laid.num_rows, out=out),
                  threads, _arrays.stream_of(x))
    return out


def combine(expert_out, laid: Laid, dispatched: Dispatched, config: Config, *, x=None,
            out=None, threads: int = 0):
    """y [T, d] = sum over a token's rows of weight * expert_out[row] (+ x for the dropped
    assignments under drop_policy residual, which needs `x`). `out`: a [T, d] buffer to write
    (every row is written, so a reused buffer needs no zeroing)."""
    T = int(dispatched.weight.shape[0])
    y = out if out is not None else _arrays.empty_like_framework(
        expert_out, (T, int(expert_out.shape[1])), _arrays.dtype_name(expert_out))
    _core.combine(config, dict(expert_out=expert_out, assignment_row=laid.assignment_row,
                               weight=dispatched.weight, fate=dispatched.fate, x=x, y=y), threads,
                  _arrays.stream_of(expert_out))
    return y


LOSSES = ("aux_loss", "sequence_aux_loss", "z_loss")


def losses(gated: Gated, config: Config, *, tokens: Optional[int] = None,
           which: Optional[Sequence[str]] = None, threads: int = 0) -> Dict[str, Any]:
    """aux_loss, sequence_aux_loss and z_loss [1] float64 from gating's sums (or sums added
    over shards, with `tokens` the whole batch's T). `which`: only these losses, and only the
    sums they read are needed (the aux loss alone: aux_score_sum, aux_count, valid_tokens)."""
    names = LOSSES if which is None else tuple(which)
    unknown = [n for n in names if n not in LOSSES]
    if unknown:
        raise _core.Error(f"losses: which: {unknown} (known: {', '.join(LOSSES)})")
    like = gated.valid_tokens
    out = {n: _arrays.zeros_like_framework(like, (1,), "float64") for n in names}
    args = dict(gated.arrays)
    args.update(out)
    _core.losses(config, args, gated.tokens if tokens is None else int(tokens), threads,
                 _arrays.stream_of(like))
    return out


def gating_backward(logits, gated: Gated, dispatched: Optional[Dispatched], config: Config, *,
                    grad_weight=None, routing: float = 1.0, aux: float = 1.0,
                    sequence_aux: float = 1.0, z: float = 1.0, valid=None, out=None,
                    threads: int = 0):
    """dL/dlogits [T, E] float32: the routing term (grad_weight = dL/d dispatch weight,
    through the gates) and dL/d of the aux, sequence-aux and z losses (weights aux,
    sequence_aux, z; 0 skips a term; the config's coefficients apply on top). With `out`,
    the gradient is added into it."""
    T = _tokens_of(logits, "logits")
    accumulate = out is not None
    if out is None:
        out = _arrays.empty_like_framework(logits, (T, config.num_experts), "float32")
    args = dict(gated.arrays)
    if dispatched is not None:
        args["fate"] = dispatched.fate
    args.update(logits=logits, grad_weight=grad_weight, grad_logits=out,
                valid=_arrays.as_mask(valid))
    _core.gating_backward(config, args, routing, aux, sequence_aux, z, accumulate, threads,
                          _arrays.stream_of(logits))
    return out


def combine_backward(dy, expert_out, laid: Laid, dispatched: Dispatched, config: Config, *,
                     grad_x: bool = True, threads: int = 0):
    """(grad_expert_out [rows, d], grad_weight [T, k] float32, grad_x [T, d] or None): the
    gradients of combine. grad_x is the residual pass-through (0 outside drop_policy
    residual); grad_x=False skips it."""
    rows, d = int(expert_out.shape[0]), int(expert_out.shape[1])
    T, k = int(dispatched.weight.shape[0]), config.top_k
    name = _arrays.dtype_name(expert_out)
    g_out = _arrays.empty_like_framework(expert_out, (rows, d), name)
    g_w = _arrays.empty_like_framework(expert_out, (T, k), "float32")
    g_x = _arrays.empty_like_framework(expert_out, (T, d), name) if grad_x else None
    _core.combine_backward(config, dict(expert_out=expert_out, dy=dy, row_token=laid.row_token,
                                        assignment_row=laid.assignment_row,
                                        weight=dispatched.weight, fate=dispatched.fate,
                                        grad_expert_out=g_out, grad_weight=g_w, grad_x=g_x),
                           threads, _arrays.stream_of(expert_out))
    return g_out, g_w, g_x


def permute_backward(grad_buf, laid: Laid, config: Config, *, out=None, threads: int = 0):
    """dL/dx [T, d]: each token's buffer rows' gradients summed (added into `out` if given)."""
    T = int(laid.assignment_row.shape[0])
    accumulate = out is not None
    if out is None:
        out = _arrays.empty_like_framework(grad_buf, (T, int(grad_buf.shape[1])),
                                           _arrays.dtype_name(grad_buf))
    _core.permute_backward(config, dict(grad_buf=grad_buf, assignment_row=laid.assignment_row,
                                        grad_x=out), accumulate, threads,
                           _arrays.stream_of(grad_buf))
    return out


def expert_bias_update(bias, load, config: Config) -> None:
    """DeepSeek's aux-loss-free balancing: bias [E] float32 updated in place from the loads
    [E] int64 summed over a step (gating.bias_update.rate / recenter)."""
    _core.expert_bias_update(config, dict(bias=bias, load=load), _arrays.stream_of(bias))


@dataclass
class Routing:
    """gating, dispatch, layout and the losses of one batch (what route() returns)."""

    gated: Gated
    dispatched: Dispatched
    laid: Laid
    losses: Dict[str, Any] = field(default_factory=dict)


def layout_kind_for(config: Config, kind: str = "auto") -> str:
    """"auto": padded when the capacity is bounded, else compact (dropless)."""
    if kind != "auto":
        return kind
    return "compact" if config["capacity.mode"] == "unbounded" else "padded"


def route(logits, config: Config, *, bias=None, valid=None, kind: str = "auto",
          block_size: int = 1, per_token_aux: bool = False, replay_ids=None,
          replay_ratio: float = 0.0, token_count=None, threads: int = 0) -> Routing:
    """gating -> dispatch -> layout -> losses on one batch of router logits [T, E]. kind:
    "padded", "compact" or "auto" (padded when the capacity is bounded, else compact).
    replay_ids / replay_ratio: routing replay, as in gating().

    token_count (an int, or a [1] int64 array on the logits' device): only the first n rows
    are real tokens, the rest padding — every buffer keeps the shape of T rows, and the first n
    route exactly as route(logits[:n]) would (C of n tokens, the losses over them); rows
    [n, T) are masked. A device count is read on the device only: one CUDA graph captured for
    the largest batch serves every n (docs/python.md)."""
    kind = layout_kind_for(config, kind)
    count = None
    if token_count is not None:
        T = _tokens_of(logits, "logits")
        count = _count_of(token_count, logits, T)
        valid = token_mask(count, T, valid=valid)
    if not _core.emulated and all(v is None or type(v) is np.ndarray
                                  for v in (logits, bias, valid, replay_ids, count)):
        # host numpy arrays: the four stages in one call, every output carved from one
        # buffer (a small batch's fixed cost: performance.md, "The Python package")
        T = _tokens_of(logits, "logits")
        if replay_ids is not None:
            replay_ids = _arrays.as_int32(replay_ids, "replay_ids")
        try:
            g, d, lay, lo = _core.route_host(config, logits, bias, _arrays.as_mask(valid), kind,
                                             block_size, per_token_aux, replay_ids,
                                             float(replay_ratio), threads, count)
        except _core.Error as e:
            raise _core.Error(_named_count(str(e))) from None
        return Routing(Gated(g, T), Dispatched(d),
                       Laid(lay, kind, block_size, int(lay["row_token"].shape[0])), lo)
    g = gating(logits, config, bias=bias, valid=valid, per_token_aux=per_token_aux,
               replay_ids=replay_ids, replay_ratio=replay_ratio, threads=threads)
    d = dispatch(g, config, valid=valid, token_count=count, threads=threads)
    lay = layout(d, config, kind=kind, block_size=block_size, threads=threads)
    return Routing(g, d, lay, losses(g, config, threads=threads))
