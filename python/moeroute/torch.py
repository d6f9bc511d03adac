# SPDX-License-Identifier: Apache-2.0
"""moeroute for PyTorch: routing, permute and combine as autograd operations whose backward
passes are the library's (gating_backward, permute_backward, combine_backward), and a Router
module that drops in for a Megatron- or HF-style router.

    router = moeroute.torch.Router(hidden_size=512, config="mixtral", num_experts=8, top_k=2)
    out = router(hidden_states)                     # [..., hidden] -> routing of the tokens
    x_buf = moeroute.torch.permute(x, out)          # [max_rows, hidden] expert buffer
    y = moeroute.torch.combine(experts(x_buf), out, x=x)
    loss = task(y) + out.aux_loss + out.z_loss

On torch >= 2.4 the three operations are registered as custom operators (moeroute::route,
moeroute::permute, moeroute::combine) with fake implementations, so torch.compile traces
them; on older torch they are plain autograd functions. An eager call that records no graph
(inference) runs the implementation directly, with neither wrapper. float64 tensors are
computed in float32 (the library's widest element type) and their results cast back."""

from typing import NamedTuple, Optional, Union

import numpy as np
import torch

from . import _arrays, _core
from . import stages as _st
from ._core import Config

__all__ = ["RouterOutput", "route", "permute", "combine", "Router", "with_overrides", "custom_ops"]

#: True when route / permute / combine are registered torch custom operators.
custom_ops = hasattr(torch, "library") and hasattr(torch.library, "custom_op")

_config_cache: dict = {}


def _config_of(text: str) -> Config:
    c = _config_cache.get(text)
    if c is None:
        c = Config(text)
        _config_cache[text] = c
    return c


def _text_of(config: Config) -> str:
    return config.__getstate__()


def _detached(t: torch.Tensor) -> torch.Tensor:
    """t without its autograd history: t itself when it has none (detach() makes a new
    tensor object, a microsecond of a decode call)."""
    return t.detach() if t.requires_grad else t


def _compute(t: torch.Tensor) -> torch.Tensor:
    """The tensor the library reads: contiguous, float64 narrowed to float32."""
    t = t.contiguous()
    return t.float() if t.dtype == torch.float64 else t


def _threads() -> int:
    return torch.get_num_threads()


# --- the three operations on tensors (shared by the custom-op and autograd paths) ----------

class _Wrapped(dict):
    """A stage's outputs as tensors, each wrapped (zero-copy) when it is read: only the ones
    route returns pay for it."""

    def __getitem__(self, name):
        a = dict.__getitem__(self, name)
        return torch.from_numpy(a) if type(a) is np.ndarray else a


def _numpy_view(t):
    """A zero-copy numpy view of a CPU tensor numpy can hold (None stays None), else None.
    The stages take numpy arrays through the buffer protocol with fewer hand-overs than
    DLPack, and numpy allocates their outputs faster than torch: half the fixed cost of a
    small call (performance.md, "The Python package")."""
    if t is None or not t.is_cpu or t.dtype == torch.bfloat16:
        return None
    return _detached(t).numpy()


def _route_host(logits, x, bias, valid, replay_ids, token_count, cfg, kind, block_size,
                replay_ratio, into=None):
    """_route_impl's outputs from the one-call host route (numpy views in), each output
    wrapped once: a small batch's cost is the objects a call makes (performance.md, "The
    Python package"). The weight tensor keeps the call's buffer and loss array
    (`_moeroute_host`), so that route(out=) can write the same tensors again. With `into`
    (such a triple) the outputs are written there: True, or False when its buffer was made for
    another layout, replay or logits dtype."""
    _st._tokens_of(x, "logits")
    key = (kind, block_size, replay_ids is not None, logits.dtype)
    if into is not None and into[2] != key:
        return False
    if replay_ids is not None:
        replay_ids = _arrays.as_int32(replay_ids, "replay_ids")
    try:  # with `into`: written in place, the losses into the loss tensors' array
        r = _core.route_host(cfg, x, bias, _arrays.as_mask(valid), kind, block_size, False,
                             replay_ids, float(replay_ratio), _threads(), token_count,
                             *(() if into is None else into[:2]))
    except _core.Error as e:
        raise _core.Error(_st._named_count(str(e))) from None
    if into is not None:
        return True
    g, d, lay, lo = r
    f = torch.from_numpy
    # the losses: 0-d views of one array the weight tensor keeps (each its own tensor storage,
    # as a custom operator's outputs must be)
    losses = np.array([lo[n][0] for n in _st.LOSSES],
                      dtype=np.float64 if logits.dtype == torch.float64 else np.float32)
    empty = np.zeros(0, dtype=np.int64)
    weight = f(d["weight"])
    weight._moeroute_host = (d["weight"].base, losses, key)
    return (weight, f(losses[0, ...]), f(losses[1, ...]), f(losses[2, ...]),
            f(g["ids"]), f(g["gates"]), f(d["expert"]), f(d["slot"]), f(d["fate"]),
            f(lay["row_token"]), f(lay["assignment_row"]), f(lay["num_rows"]),
            f(lay["offsets"]), f(d["load"]), f(d["requested"]), f(g["aux_count"]),
            f(g["valid_tokens"]), f(g["seq_count"] if "seq_count" in g else empty),
            f(g["seq_tokens"] if "seq_tokens" in g else empty.copy()), f(d["totals"]),
            f(g["replay_replaced"] if "replay_replaced" in g else np.zeros(1, np.int64)))


def _route_impl(logits, bias, valid, replay_ids, config: str, kind: str, block_size: int,
                replay_ratio: float, token_count=None, into=None):
    """route's outputs; with token_count ([1] int64 on the logits' device) `valid` already
    masks rows [n, T) (route made it) and dispatch takes the count (C of n tokens).
    into: an earlier host call's (buffer, losses, key) to write again (route(out=)): True
    when written, False when this call cannot take that path."""
    cfg = _config_of(config)
    x = _compute(_detached(logits))
    bias = None if bias is None else bias.detach().float().contiguous()
    inputs = (x, bias, valid, replay_ids, token_count)
    views = []
    for t in inputs:  # (a loop, not a comprehension and all(): a fifth of a decode call)
        v = None if t is None else _numpy_view(t)
        if v is None and t is not None:
            break
        views.append(v)
    else:  # every input a host array numpy holds: the stages on numpy views
        inputs = views
        if not _core.emulated:
            return _route_host(logits, *views, cfg, kind, block_size, replay_ratio, into)
    if into is not None:
        return False
    x, bias, valid, replay_ids, token_count = inputs
    r = _st.route(x, cfg, bias=bias, valid=valid, kind=kind, block_size=block_size,
                  replay_ids=replay_ids, replay_ratio=replay_ratio, token_count=token_count,
                  threads=_threads())
    g, d, lay = _Wrapped(r.gated.arrays), _Wrapped(r.dispatched.arrays), _Wrapped(r.laid.arrays)
    loss_dtype = logits.dtype if logits.dtype in (torch.float32, torch.float64) else torch.float32
    def empty():  # a fresh one each time: a custom operator's outputs may not alias
        return logits.new_zeros((0,), dtype=torch.int64)

    if isinstance(r.losses["aux_loss"], np.ndarray):  # host: each loss a 0-d tensor at once
        aux, seq, z = (torch.tensor(float(r.losses[n][0]), dtype=loss_dtype) for n in _st.LOSSES)
    else:
        aux, seq, z = (r.losses[n].to(loss_dtype).reshape(()) for n in _st.LOSSES)
    return (d["weight"], aux, seq, z,
            g["ids"], g["gates"], d["expert"], d["slot"], d["fate"], lay["row_token"],
            lay["assignment_row"], lay["num_rows"], lay["offsets"], d["load"], d["requested"],
            g["aux_count"],
            g["valid_tokens"], g["seq_count"] if "seq_count" in g else empty(),
            g["seq_tokens"] if "seq_tokens" in g else empty(),
            d["totals"],
            g["replay_replaced"] if "replay_replaced" in g else
            logits.new_zeros((1,), dtype=torch.int64))


def _route_backward_impl(logits, valid, ids, fate, aux_count, valid_tokens, seq_count,
                         seq_tokens, grad_weight, grad_aux, grad_seq, grad_z, config: str):
    """dL/dlogits from dL/dweight and the three loss gradients (0-d tensors)."""
    cfg = _config_of(config)
    x = _compute(_detached(logits))
    arrays = {"ids": ids, "aux_count": aux_count, "valid_tokens": valid_tokens}
    if cfg["loss.sequence_length"] > 0:
        arrays.update(seq_count=seq_count, seq_tokens=seq_tokens)
    gated = _st.Gated(arrays, int(x.shape[0]))
    dispatched = _st.Dispatched({"fate": fate})
    gw = None if grad_weight is None else grad_weight.float().contiguous()
    if x.device.type == "cpu":
        grad = _st.gating_backward(x, gated, dispatched, cfg, grad_weight=gw,
                                   routing=1.0 if gw is not None else 0.0,
                                   aux=float(grad_aux), sequence_aux=float(grad_seq),
                                   z=float(grad_z), valid=valid, threads=_threads())
    else:
        # A device backward reads the loss gradients on the device (no host sync): the
        # routing term, then each loss term with weight 1 scaled by its gradient tensor —
        # only the terms the config has (a zero coefficient: the library skips the term).
        grad = _st.gating_backward(x, gated, dispatched, cfg, grad_weight=gw,
                                   routing=1.0 if gw is not None else 0.0, aux=0.0,
                                   sequence_aux=0.0, z=0.0, valid=valid)
        aux_on = cfg["loss.aux_coefficient"] != 0.0
        terms = (("aux", grad_aux, aux_on),
                 ("sequence_aux", grad_seq, aux_on and cfg["loss.sequence_length"] > 0),
                 ("z", grad_z, cfg["loss.z_coefficient"] != 0.0))
        for term, g, present in terms:
            if not present:
                continue
            unit = {"aux": 0.0, "sequence_aux": 0.0, "z": 0.0, term: 1.0}
            grad += g * _st.gating_backward(x, gated, dispatched, cfg, routing=0.0, valid=valid,
                                            **unit)
    return grad.to(logits.dtype)


def _host_arrays(*tensors):
    """The host call's arrays, or None when a tensor is on a device (or the build is the
    emulated one): each CPU tensor as its numpy view where numpy holds its dtype, else as
    itself (bf16, taken through DLPack); None stays None."""
    if _core.emulated:
        return None
    out = []
    for t in tensors:  # (a loop, not any() and a comprehension: half this call's cost)
        if t is None:
            out.append(None)
        elif not t.is_cpu:
            return None
        elif t.dtype == torch.bfloat16:
            out.append(t)
        else:
            out.append(_detached(t).numpy())
    return out


def _empty_like(a, shape):
    """An uninitialised host array of a's dtype: numpy's for a numpy array, else torch's."""
    if isinstance(a, np.ndarray):
        return np.empty(shape, dtype=a.dtype)
    return torch.empty(shape, dtype=a.dtype)


def _permute_impl(x, row_token, num_rows, config: str):
    cfg = _config_of(config)
    xc = _compute(_detached(x))
    host = _host_arrays(xc, row_token, num_rows)
    if host is not None:
        # on the host: the buffer allocated and its tail zeroed here (numpy where it holds the
        # dtype), the call made with no stage object (each costs more than a decode step)
        xn, rt, nr = host
        rows, n = int(rt.shape[0]), int(nr[0])
        out = _empty_like(xn, (rows, int(xn.shape[1])))
        if isinstance(out, np.ndarray):
            out[n:] = 0
        else:
            out.narrow(0, n, rows - n).zero_()
        _core.permute(cfg, dict(x=xn, row_token=rt, num_rows=nr, out=out), _threads(), None)
        y = torch.from_numpy(out) if isinstance(out, np.ndarray) else out
    else:
        lay = _st.Laid({"row_token": row_token, "num_rows": num_rows}, "", 1,
                       int(row_token.shape[0]))
        y = _st.permute(xc, lay, cfg, threads=_threads())
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _permute_backward_impl(grad_buf, assignment_row, config: str, dtype):
    cfg = _config_of(config)
    lay = _st.Laid({"assignment_row": assignment_row}, "", 1, 0)
    return _st.permute_backward(_compute(grad_buf), lay, cfg, threads=_threads()).to(dtype)


def _combine_impl(expert_out, weight, x, assignment_row, fate, config: str):
    cfg = _config_of(config)
    eo = _compute(_detached(expert_out))
    w = _detached(weight).float().contiguous()
    xr = None if x is None else _compute(_detached(x)).to(eo.dtype)
    host = _host_arrays(eo, w, assignment_row, fate, xr)
    if host is not None:  # (as _permute_impl)
        eon, wn, ar, fn, xn = host
        out = _empty_like(eon, (int(wn.shape[0]), int(eon.shape[1])))
        _core.combine(cfg, dict(expert_out=eon, assignment_row=ar, weight=wn, fate=fn, x=xn,
                                y=out), _threads(), None)
        y = torch.from_numpy(out) if isinstance(out, np.ndarray) else out
    else:
        lay = _st.Laid({"assignment_row": assignment_row}, "", 1, int(eo.shape[0]))
        d = _st.Dispatched({"weight": w, "fate": fate})
        y = _st.combine(eo, lay, d, cfg, x=xr, threads=_threads())
    return y if y.dtype == expert_out.dtype else y.to(expert_out.dtype)


def _combine_backward_impl(dy, expert_out, weight, row_token, assignment_row, fate,
                           config: str, want_x: bool):
    cfg = _config_of(config)
    eo = _compute(_detached(expert_out))
    lay = _st.Laid({"row_token": row_token, "assignment_row": assignment_row}, "", 1,
                   int(eo.shape[0]))
    d = _st.Dispatched({"weight": weight.detach().float().contiguous(), "fate": fate})
    g_out, g_w, g_x = _st.combine_backward(_compute(dy).to(eo.dtype), eo, lay, d, cfg,
                                           grad_x=want_x, threads=_threads())
    return (g_out.to(expert_out.dtype), g_w.to(weight.dtype),
            None if g_x is None else g_x)


# --- autograd functions (every torch) ---------------------------------------------------------


class _RouteFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, bias, valid, replay_ids, config, kind, block_size, replay_ratio,
                token_count):
        outs = _route_impl(logits, bias, valid, replay_ids, config, kind, block_size,
                           replay_ratio, token_count)
        (_, _, _, _, ids, _, _, _, fate, _, _, _, _, _, _, aux_count, valid_tokens, seq_count,
         seq_tokens, _, _) = outs
        ctx.config = config
        ctx.has_valid = valid is not None
        saved = [logits, ids, fate, aux_count, valid_tokens, seq_count, seq_tokens]
        ctx.save_for_backward(*(saved + ([valid] if valid is not None else [])))
        ctx.mark_non_differentiable(*outs[4:])
        # Without this, autograd hands backward a tensor of zeros for every output that got
        # no gradient — the 17 integer outputs too (~1 MB at T = 16384, E = 64, k = 2):
        # backward takes None for those and for an unused weight or loss.
        ctx.set_materialize_grads(False)
        return outs

    @staticmethod
    def backward(ctx, grad_weight, grad_aux, grad_seq, grad_z, *_):
        logits, ids, fate, aux_count, valid_tokens, seq_count, seq_tokens, *rest = \
            ctx.saved_tensors
        valid = rest[0] if ctx.has_valid else None
        zero = torch.zeros((), dtype=torch.float64)
        grad = _route_backward_impl(
            logits, valid, ids, fate, aux_count, valid_tokens, seq_count, seq_tokens, grad_weight,
            zero if grad_aux is None else grad_aux, zero if grad_seq is None else grad_seq,
            zero if grad_z is None else grad_z, ctx.config)
        return grad, None, None, None, None, None, None, None, None


class _PermuteFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, row_token, num_rows, assignment_row, config):
        ctx.config = config
        ctx.dtype = x.dtype
        ctx.save_for_backward(assignment_row)
        return _permute_impl(x, row_token, num_rows, config)

    @staticmethod
    def backward(ctx, grad_buf):
        (assignment_row,) = ctx.saved_tensors
        return (_permute_backward_impl(grad_buf, assignment_row, ctx.config, ctx.dtype), None,
                None, None, None)


class _CombineFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_out, weight, x, row_token, assignment_row, fate, config):
        ctx.config = config
        ctx.x_dtype = None if x is None else x.dtype
        ctx.save_for_backward(expert_out, weight, row_token, assignment_row, fate)
        return _combine_impl(expert_out, weight, x, assignment_row, fate, config)

    @staticmethod
    def backward(ctx, dy):
        expert_out, weight, row_token, assignment_row, fate = ctx.saved_tensors
        want_x = ctx.x_dtype is not None and ctx.needs_input_grad[2]
        g_out, g_w, g_x = _combine_backward_impl(dy, expert_out, weight, row_token,
                                                 assignment_row, fate, ctx.config, want_x)
        return (g_out, g_w, None if g_x is None else g_x.to(ctx.x_dtype), None, None, None, None)


# --- torch custom operators (torch >= 2.4) ----------------------------------------------------

if custom_ops:
    from typing import List, Tuple

    from torch import Tensor

    # the schema needs a fixed-length tuple: route's 21 outputs (RouterOutput's tensor fields)
    _RouteOutputs = Tuple[(Tensor,) * 21]

    @torch.library.custom_op("moeroute::route", mutates_args=())
    def _route_op(logits: Tensor, bias: Optional[Tensor], valid: Optional[Tensor],
                  replay_ids: Optional[Tensor], config: str, kind: str, block_size: int,
                  replay_ratio: float, token_count: Optional[Tensor]) -> _RouteOutputs:
        return _route_impl(logits, bias, valid, replay_ids, config, kind, block_size,
                           replay_ratio, token_count)

    @_route_op.register_fake
    def _(logits, bias, valid, replay_ids, config, kind, block_size, replay_ratio, token_count):
        cfg = _config_of(config)
        T = logits.shape[0]
        g = {n: (s, d) for n, s, d in _core.gating_outputs(cfg, T, False)}
        d = {n: (s, dt) for n, s, dt in _core.dispatch_outputs(cfg, T)}
        lay = {n: (s, dt) for n, s, dt in _core.layout_outputs(cfg, T, kind, block_size, 0)}
        loss_dtype = logits.dtype if logits.dtype in (torch.float32, torch.float64) \
            else torch.float32

        def new(spec):
            shape, dtype = spec
            return logits.new_empty(shape, dtype=getattr(torch, dtype))

        scalar = logits.new_empty((), dtype=loss_dtype)
        empty = logits.new_empty((0,), dtype=torch.int64)
        return (new(d["weight"]), scalar, scalar.clone(), scalar.clone(), new(g["ids"]),
                new(g["gates"]), new(d["expert"]), new(d["slot"]), new(d["fate"]),
                new(lay["row_token"]), new(lay["assignment_row"]), new(lay["num_rows"]),
                new(lay["offsets"]), new(d["load"]), new(d["requested"]), new(g["aux_count"]),
                new(g["valid_tokens"]),
                new(g["seq_count"]) if "seq_count" in g else empty,
                new(g["seq_tokens"]) if "seq_tokens" in g else empty.clone(), new(d["totals"]),
                logits.new_empty((1,), dtype=torch.int64))

    @torch.library.custom_op("moeroute::route_backward", mutates_args=())
    def _route_backward_op(logits: Tensor, valid: Optional[Tensor], ids: Tensor, fate: Tensor,
                           aux_count: Tensor, valid_tokens: Tensor, seq_count: Tensor,
                           seq_tokens: Tensor, grad_weight: Optional[Tensor], grad_aux: Tensor,
                           grad_seq: Tensor, grad_z: Tensor, config: str) -> Tensor:
        return _route_backward_impl(logits, valid, ids, fate, aux_count, valid_tokens, seq_count,
                                    seq_tokens, grad_weight, grad_aux, grad_seq, grad_z, config)

    @_route_backward_op.register_fake
    def _(logits, valid, ids, fate, aux_count, valid_tokens, seq_count, seq_tokens, grad_weight,
          grad_aux, grad_seq, grad_z, config):
        return torch.empty_like(logits)

    def _route_setup(ctx, inputs, output):
        logits, _, valid, _, config, _, _, _, _ = inputs
        ctx.config = config
        ctx.save_for_backward(logits, valid if valid is not None else logits.new_empty(0),
                              output[4], output[8], output[15], output[16], output[17],
                              output[18])
        ctx.has_valid = valid is not None
        ctx.set_materialize_grads(False)  # (as _RouteFn.forward: no zeros for unused outputs)

    def _route_grad(ctx, grad_weight, grad_aux, grad_seq, grad_z, *_):
        logits, valid, ids, fate, aux_count, valid_tokens, seq_count, seq_tokens = \
            ctx.saved_tensors
        zero = logits.new_zeros(())
        grad = _route_backward_op(logits, valid if ctx.has_valid else None, ids, fate, aux_count,
                                  valid_tokens, seq_count, seq_tokens, grad_weight,
                                  zero if grad_aux is None else grad_aux,
                                  zero if grad_seq is None else grad_seq,
                                  zero if grad_z is None else grad_z, ctx.config)
        return grad, None, None, None, None, None, None, None, None

    _route_op.register_autograd(_route_grad, setup_context=_route_setup)

    @torch.library.custom_op("moeroute::permute", mutates_args=())
    def _permute_op(x: Tensor, row_token: Tensor, num_rows: Tensor, assignment_row: Tensor,
                    config: str) -> Tensor:
        return _permute_impl(x, row_token, num_rows, config)

    @_permute_op.register_fake
    def _(x, row_token, num_rows, assignment_row, config):
        return x.new_empty((row_token.shape[0], x.shape[1]))

    @torch.library.custom_op("moeroute::permute_backward", mutates_args=())
    def _permute_backward_op(grad_buf: Tensor, assignment_row: Tensor, config: str,
                             like: Tensor) -> Tensor:
        return _permute_backward_impl(grad_buf, assignment_row, config, like.dtype)

    @_permute_backward_op.register_fake
    def _(grad_buf, assignment_row, config, like):
        return like.new_empty((assignment_row.shape[0], grad_buf.shape[1]))

    def _permute_setup(ctx, inputs, output):
        x, _, _, assignment_row, config = inputs
        ctx.config = config
        ctx.save_for_backward(assignment_row, x.new_empty(0))

    def _permute_grad(ctx, grad_buf):
        assignment_row, like = ctx.saved_tensors
        return (_permute_backward_op(grad_buf, assignment_row, ctx.config, like), None, None,
                None, None)

    _permute_op.register_autograd(_permute_grad, setup_context=_permute_setup)

    @torch.library.custom_op("moeroute::combine", mutates_args=())
    def _combine_op(expert_out: Tensor, weight: Tensor, x: Optional[Tensor], row_token: Tensor,
                    assignment_row: Tensor, fate: Tensor, config: str) -> Tensor:
        return _combine_impl(expert_out, weight, x, assignment_row, fate, config)

    @_combine_op.register_fake
    def _(expert_out, weight, x, row_token, assignment_row, fate, config):
        return expert_out.new_empty((weight.shape[0], expert_out.shape[1]))

    @torch.library.custom_op("moeroute::combine_backward", mutates_args=())
    def _combine_backward_op(dy: Tensor, expert_out: Tensor, weight: Tensor, row_token: Tensor,
                             assignment_row: Tensor, fate: Tensor, config: str,
                             want_x: bool) -> List[Tensor]:
        g_out, g_w, g_x = _combine_backward_impl(dy, expert_out, weight, row_token,
                                                 assignment_row, fate, config, want_x)
        return [g_out, g_w, g_x if g_x is not None else dy.new_empty(0)]

    @_combine_backward_op.register_fake
    def _(dy, expert_out, weight, row_token, assignment_row, fate, config, want_x):
        return [torch.empty_like(expert_out), torch.empty_like(weight),
                torch.empty_like(dy) if want_x else dy.new_empty(0)]

    def _combine_setup(ctx, inputs, output):
        expert_out, weight, x, row_token, assignment_row, fate, config = inputs
        ctx.config = config
        ctx.has_x = x is not None
        ctx.save_for_backward(expert_out, weight, row_token, assignment_row, fate)

    def _combine_grad(ctx, dy):
        expert_out, weight, row_token, assignment_row, fate = ctx.saved_tensors
        want_x = ctx.has_x and ctx.needs_input_grad[2]
        g_out, g_w, g_x = _combine_backward_op(dy, expert_out, weight, row_token, assignment_row,
                                               fate, ctx.config, want_x)
        return g_out, g_w, (g_x if want_x else None), None, None, None, None

    _combine_op.register_autograd(_combine_grad, setup_context=_combine_setup)


# --- the public API ---------------------------------------------------------------------------


class RouterOutput(NamedTuple):
    """What route() and Router return. weight and the three losses carry gradients back to
    the logits; the rest are integer routing data."""

    weight: torch.Tensor              #: [T, k] combine weights (0 for dropped)
    aux_loss: torch.Tensor            #: 0-d, coefficient included
    sequence_aux_loss: torch.Tensor   #: 0-d (0 without loss.sequence_length)
    z_loss: torch.Tensor              #: 0-d, coefficient included
    ids: torch.Tensor                 #: [T, k] int32 chosen experts, best first
    gates: torch.Tensor               #: [T, k] pre-drop gates (no gradient: use weight)
    expert: torch.Tensor              #: [T, k] int32 final expert (-1 none)
    slot: torch.Tensor                #: [T, k] int32 slot there (-1 none)
    fate: torch.Tensor                #: [T, k] uint8 kept 0 / rerouted 1 / dropped 2 / masked 3
    row_token: torch.Tensor           #: [max_rows] int32 token of each buffer row (-1 padding)
    assignment_row: torch.Tensor      #: [T, k] int64 buffer row of each assignment (-1 none)
    num_rows: torch.Tensor            #: [1] int64 rows in use
    offsets: torch.Tensor             #: [ET + 1] int64 first row of each expert
    load: torch.Tensor                #: [ET] int64 rows held per expert
    requested: torch.Tensor           #: [E] int64 assignments choosing each expert, pre-drop
    aux_count: torch.Tensor           #: [E] int64 aux-loss counts
    valid_tokens: torch.Tensor        #: [1] int64
    seq_count: torch.Tensor           #: [S, E] int64 (empty without sequences)
    seq_tokens: torch.Tensor          #: [S] int64 (empty without sequences)
    totals: torch.Tensor              #: [8] int64 capacity, fallback_capacity, kept, ...
    replay_replaced: torch.Tensor     #: [1] int64 replayed slots the score filter gave back
    config_text: str                  #: the routing's config as name=value text
    token_shape: tuple = ()           #: the logits' leading dims (combine's output: [*, d])

    @property
    def config(self) -> Config:
        """The routing's Config."""
        return _config_of(self.config_text)

    def totals_dict(self):
        """The batch totals by name (a host read)."""
        return _st.totals_dict(self.totals)

    @property
    def row_expert(self) -> torch.Tensor:
        """[max_rows] int64 the expert each buffer row belongs to (its segment of offsets;
        padding rows inside a segment included), -1 past the last segment: what grouped
        expert modules (HF 5.x) take beside the permuted rows."""
        rows = torch.arange(self.row_token.shape[0], device=self.offsets.device,
                            dtype=torch.int64)
        e = torch.searchsorted(self.offsets.to(torch.int64), rows, right=True) - 1
        return torch.where(e < self.offsets.shape[0] - 1, e, torch.full_like(e, -1))

    @property
    def tokens_per_expert(self) -> torch.Tensor:
        """[ET] rows each expert holds (Megatron's tokens_per_expert)."""
        return self.load


def _as_config(config: Union[Config, str], num_experts: int = 0, top_k: int = 0) -> Config:
    """A Config as given, from its name=value text (str(config)), or a preset by name."""
    if isinstance(config, Config):
        return config
    if "=" in config or config == "":
        return _config_of(config)
    return Config.preset(config, num_experts, top_k)


def _constant_result(fn):
    """Under torch.compile, fn runs at trace time and its result is a constant: what it
    computes depends on the config only, never on tensor data."""
    mark = getattr(getattr(torch, "compiler", None), "assume_constant_result", None)
    return mark(fn) if mark is not None else fn


_prepared_cache: dict = {}


@_constant_result
def _prepared(config, num_experts: int, layout: str):
    """(config text, layout kind) of a routing call; kept for a config given as text or a name
    (immutable, where a Config object may change between calls)."""
    key = (config, num_experts, layout) if isinstance(config, str) else None
    got = _prepared_cache.get(key) if key is not None else None
    if got is None:
        cfg = _as_config(config, num_experts)
        got = (_text_of(cfg), _st.layout_kind_for(cfg, layout))
        if key is not None:
            _prepared_cache[key] = got
    return got


@_constant_result
def _router_text(config: Config, training: bool) -> str:
    """The text a Router routes with: its config as it is now, with `training` set from the
    module's mode (train() / eval()). Read on every eager call, so a change to Router.config
    takes effect at the next forward; under torch.compile it is a trace-time constant."""
    cfg = config.copy()
    cfg["training"] = bool(training)
    return _text_of(cfg)


def _find_is_compiling():
    """torch's is_compiling (torch >= 2.0), else a function returning False. Found once, at
    import (a lookup per call cost a decode call 2 us), so a traced call never sets it."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return compiler.is_compiling
    dynamo = getattr(torch, "_dynamo", None)  # (only here: on torch 2.x reading it imports it)
    if dynamo is not None and hasattr(dynamo, "is_compiling"):
        return dynamo.is_compiling
    return lambda: False  # no torch.compile on this torch


_is_compiling = _find_is_compiling()


def _compiling() -> bool:
    """True while torch.compile traces (torch >= 2.0); False on older torch."""
    return bool(_is_compiling())


def _eager_inference(*tensors) -> bool:
    """True when a call records no graph and is not being traced: no input needs a gradient
    (or grad mode is off) and torch.compile is not compiling. Such a call runs the
    implementation directly, with no custom operator's dispatch or autograd.Function around
    it (each costs more than a small batch's routing; performance.md, "The Python package");
    the outputs are the same."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return False
    return not _compiling()


@_constant_result
def _residual(text: str) -> bool:
    return _config_of(text)["dispatch.dropped"] == "residual"


def route(logits: torch.Tensor, config: Union[Config, str], *, bias=None, valid=None,
          layout: str = "auto", block_size: int = 1, replay_ids=None,
          replay_ratio: float = 0.0, token_count=None,
          out: Optional[RouterOutput] = None) -> RouterOutput:
    """Routes router logits [..., E] (float32 / float16 / bfloat16 / float64) under `config`
    (a Config, its text str(config), or a preset name): gating, capacity dispatch, the
    expert-buffer layout and the losses, differentiable through weight and the losses.
    layout: "padded", "compact" or "auto" (padded when the capacity is bounded). Under
    torch.compile pass the config as text or a name (a Config object is not a constant there);
    Router does.

    Routing replay (docs/replay.md): replay_ids [..., k] (any integer dtype; -1 = the router
    chooses) forces each slot's expert — a rollout engine's recorded choice — while weight is
    recomputed from these logits, so the gradient still reaches the router; replay_ratio in
    [0, 1] gives back replayed experts scoring below that fraction of the router's weakest own
    top-k score (counted in replay_replaced).

    token_count (an int, or a [1] int64 tensor on the logits' device): only the first n of the
    T token rows are real, the rest padding — an engine's batch padded to a fixed size. Every
    output keeps the shape of T rows; the first n route exactly as route(logits[:n]) would
    (C of n tokens, the losses over them), rows [n, T) are masked (weight 0, fate 3). A
    tensor count is never read on the host: one CUDA graph captured for the largest batch
    serves every n, the count written before each replay (docs/python.md).

    out: an earlier RouterOutput of this config and logits shape to write again (inference,
    e.g. a decode loop's layer): its tensors are overwritten and it is returned, with no new
    tensor made — a host batch writes the buffer the earlier call carved them from (at T = 1
    a third of a fresh call's cost), any other is computed and copied in."""
    text, kind = _prepared(config, int(logits.shape[-1]), layout)
    flat = logits if logits.dim() == 2 else logits.reshape(-1, logits.shape[-1])
    shape = tuple(logits.shape[:-1])
    if valid is not None:
        valid = valid.reshape(-1)
        valid = valid.view(torch.uint8) if valid.dtype == torch.bool else valid
    count = None
    if token_count is not None:
        # the padding rows out of every stage (and of the backward pass, which reads valid):
        # torch's own ops, so a traced or captured call keeps the count on the device
        count = _st._count_of(token_count, flat, int(flat.shape[0]))
        real = torch.arange(flat.shape[0], device=flat.device) < count
        valid = (real if valid is None else real & (valid != 0)).to(torch.uint8)
    if replay_ids is not None:
        replay_ids = replay_ids.reshape(flat.shape[0], -1)
        if replay_ids.dtype != torch.int32:
            replay_ids = replay_ids.to(torch.int32)
        replay_ids = replay_ids.contiguous()
    ratio = float(replay_ratio)
    if out is not None:
        return _route_into(out, flat, bias, valid, replay_ids, text, kind, int(block_size),
                           ratio, count, shape)
    if _eager_inference(flat):
        return RouterOutput(*_route_impl(flat, bias, valid, replay_ids, text, kind,
                                         int(block_size), ratio, count), text, shape)
    if custom_ops:
        outs = _route_op(flat, bias, valid, replay_ids, text, kind, int(block_size), ratio,
                         count)
        # Only weight and the losses carry gradients: the pre-drop gates are routing data
        # here (a custom operator cannot mark an output non-differentiable, so detach them).
        return RouterOutput(*outs[:4], *(t.detach() for t in outs[4:]), text, shape)
    return RouterOutput(*_RouteFn.apply(flat, bias, valid, replay_ids, text, kind,
                                        int(block_size), ratio, count), text, shape)


def _route_into(out, flat, bias, valid, replay_ids, text, kind, block_size, ratio, count,
                shape) -> RouterOutput:
    """route(out=): the routing written into out's tensors (see route)."""
    _no_autograd("route", flat, bias)
    if _compiling():
        raise _core.Error("moeroute.torch.route: out= is for eager inference; under "
                          "torch.compile leave it unset")
    if not isinstance(out, RouterOutput):
        raise _core.Error(f"moeroute.torch.route: out: a RouterOutput, not {type(out).__name__}")
    if out.weight.requires_grad:  # its tensors may be saved for a backward pass not yet run
        raise _core.Error("moeroute.torch.route: out: a routing recorded for autograd; out= "
                          "takes one made without it (inference, or under torch.no_grad())")
    if out.config_text != text or out.token_shape != shape:
        raise _core.Error(f"moeroute.torch.route: out: a routing of another config or batch "
                          f"(token shape {out.token_shape}, logits here {shape})")
    host = getattr(out.weight, "_moeroute_host", None)
    if host is not None and _route_impl(flat, bias, valid, replay_ids, text, kind, block_size,
                                        ratio, count, into=host):
        return out
    # not an earlier host call's buffer (a device routing, another layout or replay): the
    # routing computed as usual and copied in, every field's shape and dtype checked first
    new = _route_impl(flat, bias, valid, replay_ids, text, kind, block_size, ratio, count)
    for name, dst, src in zip(RouterOutput._fields, out, new):
        if dst.shape != src.shape or dst.dtype != src.dtype or dst.device != src.device:
            raise _core.Error(f"moeroute.torch.route: out: {name} is {tuple(dst.shape)} "
                              f"{dst.dtype} on {dst.device}, this routing's "
                              f"{tuple(src.shape)} {src.dtype} on {src.device}")
    for dst, src in zip(out, new):
        dst.copy_(src)
    return out


def _no_autograd(op: str, *tensors) -> None:
    """out= writes a caller's buffer outside autograd, as torch's own out= variants do."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise _core.Error(f"moeroute.torch.{op}: out= writes without autograd (inference, or "
                          "under torch.no_grad()); for a differentiable call leave out= unset")


def permute(x: torch.Tensor, routing: RouterOutput, *,
            out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Hidden states x [..., d] (T tokens) into the expert buffer [max_rows, d]: the rows of
    expert e start at routing.offsets[e]; padding rows are 0. Differentiable in x.

    out: a [max_rows, d] buffer of x's dtype reused across calls (inference): no allocation;
    rows below routing.num_rows are written (padding rows as 0), the rest keep what they held
    (zero it once)."""
    flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if out is not None:
        _no_autograd("permute", x)
        lay = _st.Laid({"row_token": routing.row_token, "num_rows": routing.num_rows}, "", 1,
                       int(routing.row_token.shape[0]))
        return _st.permute(_compute(flat), lay, _config_of(routing.config_text), out=out,
                           threads=_threads())
    if _eager_inference(flat):
        return _permute_impl(flat, routing.row_token, routing.num_rows, routing.config_text)
    args = (flat, routing.row_token, routing.num_rows, routing.assignment_row,
            routing.config_text)
    return _permute_op(*args) if custom_ops else _PermuteFn.apply(*args)


def combine(expert_out: torch.Tensor, routing: RouterOutput, *, x: Optional[torch.Tensor] = None,
            out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y [..., d] = sum of each token's expert rows times its weight (+ x for the dropped
    assignments under drop_policy residual, which needs x). The leading dims are the routed
    logits' (routing.token_shape), whether or not x is passed. Differentiable in expert_out,
    routing.weight (so the router learns) and x.

    out: a [T, d] buffer of expert_out's dtype reused across calls (inference): every row is
    written, no allocation; returned in the routed logits' leading dims."""
    xf = None if x is None or not _residual(routing.config_text) else \
        x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if out is not None:
        _no_autograd("combine", expert_out, routing.weight, x)
        eo = _compute(expert_out)
        lay = _st.Laid({"assignment_row": routing.assignment_row}, "", 1, int(eo.shape[0]))
        d = _st.Dispatched({"weight": routing.weight.float().contiguous(),
                            "fate": routing.fate})
        y = _st.combine(eo, lay, d, _config_of(routing.config_text),
                        x=None if xf is None else _compute(xf), out=out.view(-1, out.shape[-1]),
                        threads=_threads())
        return y.view(*routing.token_shape, y.shape[-1]) if routing.token_shape else y
    if _eager_inference(expert_out, routing.weight, xf):
        y = _combine_impl(expert_out, routing.weight, xf, routing.assignment_row, routing.fate,
                          routing.config_text)
        return y.reshape(*routing.token_shape, y.shape[-1]) if routing.token_shape else y
    args = (expert_out, routing.weight, xf, routing.row_token, routing.assignment_row,
            routing.fate, routing.config_text)
    y = _combine_op(*args) if custom_ops else _CombineFn.apply(*args)
    return y.reshape(*routing.token_shape, y.shape[-1]) if routing.token_shape else y


def with_overrides(config: Config, capacity_factor: Optional[float] = None,
                   drop_policy: Optional[str] = None, aux_loss_coeff: Optional[float] = None,
                   z_loss_coeff: Optional[float] = None) -> Config:
    """A validated copy of `config` with the options Router and moeroute.hf.patch take: a
    capacity factor (sets capacity.mode = factor), a drop policy, the loss coefficients; None
    keeps the config's."""
    cfg = config.copy()
    if capacity_factor is not None:
        cfg["capacity.mode"] = "factor"
        cfg["capacity.factor"] = float(capacity_factor)
    if drop_policy is not None:
        cfg["dispatch.dropped"] = drop_policy
    if aux_loss_coeff is not None:
        cfg["loss.aux_coefficient"] = float(aux_loss_coeff)
    if z_loss_coeff is not None:
        cfg["loss.z_coefficient"] = float(z_loss_coeff)
    cfg.validate()
    return cfg


class Router(torch.nn.Module):
    """A top-k router: logits = hidden @ weight.T ([E, hidden], as Megatron's TopKRouter and
    HF's gate Linear hold it), routed by moeroute under a config or preset name.

    Arguments override the config: capacity_factor (None keeps the config's; a number sets
    capacity.mode = factor), drop_policy (dispatch.dropped), aux_loss_coeff,
    z_loss_coeff. router_bias: a learned [E] bias of the logits (the gate Linear's bias, as
    HF Switch / NLLB's router_bias). expert_bias: a [E] buffer for bias-selected routing (DeepSeek-V3), kept
    balanced by update_expert_bias(). forward() returns a RouterOutput; route_logits()
    routes logits an engine computed itself.

    The routing follows the module: train() / eval() set the config's training flag (the eval
    capacity factor, NLLB's eval rule, training-only noise), and `config` is read at every
    call, so `router.config["gating.noise.offset"] = step` takes effect at the next forward
    (under torch.compile the config is read by the last eager call: run one after changing
    it). Routing replay (docs/replay.md): pass the
    rollout's recorded ids as forward(..., replay_ids=...); replay_ratio is the score
    filter (0: every replayed expert kept)."""

    def __init__(self, hidden_size: int, config: Union[Config, str] = "megatron", *,
                 num_experts: int = 0, top_k: int = 0, capacity_factor: Optional[float] = None,
                 drop_policy: Optional[str] = None, aux_loss_coeff: Optional[float] = None,
                 z_loss_coeff: Optional[float] = None, layout: str = "auto",
                 block_size: int = 1, replay_ratio: float = 0.0, router_bias: bool = False,
                 dtype: Optional[torch.dtype] = None, device=None):
        super().__init__()
        cfg = with_overrides(_as_config(config, num_experts, top_k), capacity_factor,
                             drop_policy, aux_loss_coeff, z_loss_coeff)
        self.config = cfg
        self.layout = layout
        self.block_size = int(block_size)
        if not 0.0 <= float(replay_ratio) <= 1.0:
            raise _core.Error(f"replay_ratio = {replay_ratio}: must be in [0, 1]")
        self.replay_ratio = float(replay_ratio)
        E = cfg.num_experts
        self.weight = torch.nn.Parameter(torch.empty(E, hidden_size, dtype=dtype, device=device))
        torch.nn.init.normal_(self.weight, std=hidden_size ** -0.5)
        # the router Linear's own bias (HF Switch / NLLB router_bias), added to the logits;
        # unlike expert_bias it is learned by the gradient and changes the gates
        self.bias = (torch.nn.Parameter(torch.zeros(E, dtype=dtype, device=device))
                     if router_bias else None)
        if cfg["gating.expert_bias"]:
            self.register_buffer("expert_bias", torch.zeros(E, dtype=torch.float32, device=device))
        else:
            self.expert_bias = None
        self.register_buffer("load_since_update", torch.zeros(E, dtype=torch.int64,
                                                              device=device))
        self._seen_micro_batches: set = set()
        # the config text per mode, as of construction or the last eager call: what a call
        # under torch.compile routes with (dynamo cannot read a Config; see _text)
        self._texts = {mode: _router_text(cfg, mode) for mode in (False, True)}

    def _text(self) -> str:
        """The config text of this call: `config` read now with the module's mode, on every
        eager call. Under torch.compile the text the last eager call (or the constructor) read
        for this mode — a constant of the compiled graph, guarded by dynamo: after changing the
        config of a compiled Router, run one eager forward (or construct it anew)."""
        if _compiling():
            return self._texts[self.training]
        text = _router_text(self.config, self.training)
        self._texts[self.training] = text
        return text

    @property
    def num_experts(self) -> int:
        return self.config.num_experts

    @property
    def top_k(self) -> int:
        return self.config.top_k

    def route_logits(self, logits: torch.Tensor, valid=None, micro_batch: Optional[int] = None,
                     replay_ids=None, token_count=None) -> RouterOutput:
        """Routes logits the engine computed. In training with an expert bias, the batch's
        loads join those of the step; a `micro_batch` id already seen since the last
        update_expert_bias (the forward activation checkpointing recomputes) is not counted
        again, as reference::expert_load_accumulator does. token_count: as route's."""
        out = route(logits, self._text(), bias=self.expert_bias,
                    valid=valid, layout=self.layout, block_size=self.block_size,
                    replay_ids=replay_ids,
                    replay_ratio=self.replay_ratio if replay_ids is not None else 0.0,
                    token_count=token_count)
        if micro_batch is not None:
            if micro_batch in self._seen_micro_batches:
                return out
            self._seen_micro_batches.add(micro_batch)
        if self.training and self.expert_bias is not None:
            with torch.no_grad():
                self.load_since_update += out.requested
        return out

    def forward(self, hidden_states: torch.Tensor, valid=None,
                micro_batch: Optional[int] = None, replay_ids=None,
                token_count=None) -> RouterOutput:
        logits = torch.nn.functional.linear(hidden_states.reshape(-1, hidden_states.shape[-1]),
                                            self.weight, self.bias)
        return self.route_logits(logits, valid, micro_batch, replay_ids, token_count)

    @torch.no_grad()
    def update_expert_bias(self) -> None:
        """DeepSeek's aux-loss-free step: moves the expert bias against the load gathered
        since the last update (gating.bias_update.rate), then clears that load."""
        if self.expert_bias is None:
            raise _core.Error("update_expert_bias: the config routes without gating.expert_bias")
        _st.expert_bias_update(self.expert_bias, self.load_since_update, self.config)
        self.load_since_update.zero_()
        self._seen_micro_batches.clear()
