# SPDX-License-Identifier: Apache-2.0
"""A batch padded to a fixed number of rows with its real token count (route(token_count=n),
the engines' CUDA-graph pattern): the first n rows route exactly as route(logits[:n]) does —
ids, gates, slots, weights, rows, counts, capacity and losses — and rows [n, T) are masked.
On numpy (the one-call host route and the stages one by one), through moeroute.torch
(forward, backward, an int or a tensor count, the Router), and through the CUDA launchers on
the CPU emulation (the count read on the "device")."""

import numpy as np
import pytest

import moeroute
from moeroute import _core, stages
from conftest import cuda_usable, logits_grid

T = 48


def configs():
    meg = _core.Config.megatron(16, 2, capacity_factor=1.0)
    meg["loss.aux_coefficient"] = 1e-2
    meg["loss.z_coefficient"] = 1e-3
    ds = _core.Config.deepspeed_top2(16, 0.75, 2)
    ds["dispatch.dropped"] = "residual"
    nxt = _core.Config.megatron(16, 2, capacity_factor=0.75)
    nxt["dispatch.dropped"] = "next_choice"
    return [("megatron", meg), ("deepspeed_top2", ds), ("deepseek_v3", _core.Config.deepseek_v3(
        16, 4, 4, 2)), ("mixtral_dropless", _core.Config.mixtral(16, 2)), ("next_choice", nxt)]


CONFIGS = configs()
IDS = [n for n, _ in CONFIGS]


def bias_for(cfg):
    return ((np.arange(cfg.num_experts) % 3) * 0.25).astype(np.float32) \
        if cfg["gating.expert_bias"] else None


def as_np(a):
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)


def require_first_n(counted, alone, n, k):
    """counted (T rows, count n) against alone (route of the first n rows)."""
    g, d, lay = counted.gated, counted.dispatched, counted.laid
    for name in ("ids", "gates"):
        np.testing.assert_array_equal(as_np(g.arrays[name])[:n], as_np(alone.gated.arrays[name]),
                                      err_msg=name)
    for name in ("expert", "slot", "weight", "fate"):
        np.testing.assert_array_equal(as_np(d.arrays[name])[:n],
                                      as_np(alone.dispatched.arrays[name]), err_msg=name)
    assert (as_np(d.fate)[n:] == 3).all(), "padding rows are masked"
    assert (as_np(d.expert)[n:] == -1).all() and (as_np(d.weight)[n:] == 0).all()
    for name in ("requested", "kept", "rerouted", "dropped", "load"):
        np.testing.assert_array_equal(as_np(d.arrays[name]), as_np(alone.dispatched.arrays[name]),
                                      err_msg=name)
    got, want = stages.totals_dict(d.totals), stages.totals_dict(alone.dispatched.totals)
    masked = got.pop("masked") - want.pop("masked")
    assert masked == (T - n) * k and got == want
    np.testing.assert_array_equal(as_np(lay.num_rows), as_np(alone.laid.num_rows))
    np.testing.assert_array_equal(as_np(lay.offsets), as_np(alone.laid.offsets))
    np.testing.assert_array_equal(as_np(lay.assignment_row)[:n],
                                  as_np(alone.laid.assignment_row))
    assert (as_np(lay.assignment_row)[n:] == -1).all()
    np.testing.assert_array_equal(as_np(g.valid_tokens), as_np(alone.gated.valid_tokens))
    for name in ("aux_loss", "sequence_aux_loss", "z_loss"):
        np.testing.assert_array_equal(as_np(counted.losses[name]), as_np(alone.losses[name]),
                                      err_msg=name)


@pytest.mark.parametrize("name,cfg", CONFIGS, ids=IDS)
@pytest.mark.parametrize("masked", [False, True])
def test_host_route_routes_the_first_n_as_alone(name, cfg, masked):
    x = logits_grid(T, cfg.num_experts, seed=len(name))
    valid = (np.arange(T) % 7 != 2).astype(np.uint8) if masked else None
    bias = bias_for(cfg)
    for n in (1, 13, T - 1, T):
        alone = moeroute.route(x[:n].copy(), cfg, bias=bias,
                               valid=None if valid is None else valid[:n].copy())
        for count in (n, np.array([n], dtype=np.int64), np.array(n, dtype=np.int64)):
            got = moeroute.route(x, cfg, bias=bias, valid=valid, token_count=count)
            require_first_n(got, alone, n, cfg.top_k)
    empty = moeroute.route(x, cfg, bias=bias, valid=valid, token_count=0)
    totals = empty.dispatched.totals_dict()
    assert totals["kept"] + totals["dropped"] + totals["rerouted"] == 0
    assert totals["masked"] == T * cfg.top_k and int(empty.gated.valid_tokens[0]) == 0
    assert (empty.laid.assignment_row == -1).all()  # (a padded layout keeps its E x C rows)


@pytest.mark.parametrize("name,cfg", CONFIGS, ids=IDS)
def test_stages_one_by_one_equal_the_one_call_route(name, cfg):
    x = logits_grid(T, cfg.num_experts, seed=3)
    bias = bias_for(cfg)
    n = 29
    mask = moeroute.token_mask(n, T)
    np.testing.assert_array_equal(mask, (np.arange(T) < n).astype(np.uint8))
    g = stages.gating(x, cfg, bias=bias, valid=mask)
    d = stages.dispatch(g, cfg, valid=mask, token_count=n)
    fused = moeroute.route(x, cfg, bias=bias, token_count=n)
    for name_, v in d.arrays.items():
        np.testing.assert_array_equal(v, fused.dispatched.arrays[name_], err_msg=name_)
    for name_ in ("ids", "gates", "valid_tokens"):
        np.testing.assert_array_equal(g.arrays[name_], fused.gated.arrays[name_])


def test_token_mask_with_valid_and_bad_counts():
    valid = np.arange(T) % 5 != 0
    for n in (0, 17, T):
        want = ((np.arange(T) < n) & valid).astype(np.uint8)
        np.testing.assert_array_equal(moeroute.token_mask(n, T, valid=valid), want)
        np.testing.assert_array_equal(
            moeroute.token_mask(np.array([n], dtype=np.int64), T, valid=valid), want)
    cfg = _core.Config.megatron(16, 2, capacity_factor=1.0)
    x = logits_grid(T, 16, seed=1)
    for bad in (-1, T + 1):  # an int: checked before anything runs
        with pytest.raises(moeroute.Error, match=rf"token_count = {bad}: must be in \[0, tokens"):
            moeroute.route(x, cfg, token_count=bad)
        with pytest.raises(moeroute.Error, match=r"token_count = .*must be in \[0, tokens"):
            moeroute.token_mask(np.array([bad], dtype=np.int64), T)  # read by the C++ side
    for bad in (np.array([3], dtype=np.int32), np.array([1, 2], dtype=np.int64), "3", 2.0):
        with pytest.raises(moeroute.Error, match="token_count: expected an int or a \\[1\\] int64"):
            moeroute.route(x, cfg, token_count=bad)
    # dispatch alone checks an array count on the host too (its C++ message, renamed)
    g = stages.gating(x, cfg)
    with pytest.raises(moeroute.Error, match="token_count = 49"):
        stages.dispatch(g, cfg, token_count=np.array([T + 1], dtype=np.int64))
    groups = _core.Config.megatron(16, 2, capacity_factor=1.0)
    groups["capacity.group_tokens"] = 16
    with pytest.raises(moeroute.Error, match="capacity groups need the token count on the host"):
        moeroute.route(x, groups, token_count=5)


def test_torch_route_forward_and_backward_equal_the_first_n_alone():
    torch = pytest.importorskip("torch")
    import moeroute.torch as mt

    name, cfg = CONFIGS[0]
    x = torch.from_numpy(logits_grid(T, cfg.num_experts, seed=11))
    n = 19
    for count in (n, torch.tensor([n]), torch.tensor(n)):
        lg = x.clone().requires_grad_(True)
        out = mt.route(lg, cfg, token_count=count)
        (out.weight.square().sum() + out.aux_loss + out.z_loss).backward()
        head = x[:n].clone().requires_grad_(True)
        alone = mt.route(head, cfg)
        (alone.weight.square().sum() + alone.aux_loss + alone.z_loss).backward()
        for field in ("weight", "ids", "expert", "slot", "assignment_row"):
            torch.testing.assert_close(getattr(out, field)[:n], getattr(alone, field),
                                       rtol=0, atol=0, msg=field)
        assert (out.fate[n:] == 3).all() and (out.weight[n:] == 0).all()
        torch.testing.assert_close(out.aux_loss, alone.aux_loss, rtol=0, atol=0)
        torch.testing.assert_close(out.z_loss, alone.z_loss, rtol=0, atol=0)
        torch.testing.assert_close(lg.grad[:n], head.grad, rtol=0, atol=0)
        assert (lg.grad[n:] == 0).all(), "padding rows get no gradient"
        with torch.no_grad():  # the eager inference path
            inf = mt.route(x, cfg, token_count=count)
        torch.testing.assert_close(inf.weight, out.weight.detach(), rtol=0, atol=0)
    # with a mask as well: both apply
    valid = torch.arange(T) % 4 != 1
    both = mt.route(x, cfg, valid=valid, token_count=n)
    assert int(both.valid_tokens[0]) == int(valid[:n].sum())
    router = mt.Router(8, str(cfg), num_experts=cfg.num_experts, top_k=cfg.top_k)
    h = torch.randn(T, 8)
    r = router(h, token_count=n)
    torch.testing.assert_close(r.weight[:n], router(h[:n]).weight, rtol=0, atol=0)
    with pytest.raises(moeroute.Error, match="token_count: expected an int or a \\[1\\] int64"):
        mt.route(x, cfg, token_count=torch.tensor([n], dtype=torch.int32))
    with pytest.raises(moeroute.Error, match="token_count: on meta, the logits on cpu"):
        mt.route(x, cfg, token_count=torch.tensor([n], device="meta"))
    with pytest.raises(moeroute.Error, match=r"token_count = 49: must be in \[0, tokens = 48\]"):
        mt.route(x, cfg, token_count=T + 1)
    with pytest.raises(moeroute.Error, match="token_count = 49"):  # a tensor: read by dispatch
        mt.route(x, cfg, token_count=torch.tensor([T + 1]))


def test_torch_custom_op_under_compile_keeps_the_count_a_tensor():
    torch = pytest.importorskip("torch")
    import moeroute.torch as mt

    if not mt.custom_ops:
        pytest.skip(f"torch.library.custom_op needs torch >= 2.4 (installed: {torch.__version__})")
    text = str(CONFIGS[0][1])
    x = torch.from_numpy(logits_grid(T, 16, seed=5))
    count = torch.tensor([21])

    def step(lg, c):
        out = mt.route(lg, text, token_count=c)
        return out.weight.square().sum() + out.aux_loss

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    for n in (21, 7, T):  # one graph, the count a tensor input: no recompilation per n
        count.fill_(n)
        lg, lc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        eager, got = step(lg, count), compiled(lc, count)
        eager.backward()
        got.backward()
        torch.testing.assert_close(got, eager)
        torch.testing.assert_close(lc.grad, lg.grad)


@pytest.mark.skipif(not cuda_usable(), reason="no CUDA device, or moeroute built without CUDA")
def test_one_cuda_graph_serves_every_count():
    """The engines' pattern: buffers and one graph captured for the largest batch, the count
    written in place before each replay; each replay equals the eager route of those n."""
    import torch
    import moeroute.torch as mt

    text = str(CONFIGS[0][1])
    logits = torch.from_numpy(logits_grid(T, 16, seed=9)).cuda()
    count = torch.tensor([T], device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(2):  # warm-up outside the capture (allocations, lazy init)
            mt.route(logits, text, token_count=count)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        captured = mt.route(logits, text, token_count=count)
    for n in (T, 17, 1, 0):
        count.fill_(n)
        graph.replay()
        torch.cuda.synchronize()
        assert (captured.fate[n:] == 3).all()
        if n == 0:
            continue
        with torch.no_grad():
            alone = mt.route(logits[:n], text)
        for field in ("ids", "weight", "expert", "slot", "assignment_row"):
            torch.testing.assert_close(getattr(captured, field)[:n], getattr(alone, field),
                                       rtol=0, atol=0, msg=field)
        torch.testing.assert_close(captured.aux_loss, alone.aux_loss, rtol=0, atol=0)


emu = None
try:
    import moeroute._core_emulated as emu  # noqa: E402  (the CMake build tree's test module)
except ImportError:
    pass


@pytest.mark.skipif(emu is None, reason="the emulated test module is built in the CMake build "
                                        "tree when the CUDA toolkit is found, never by pip")
@pytest.mark.parametrize("name,cfg", CONFIGS, ids=IDS)
def test_cuda_launchers_read_the_count_on_the_device(name, cfg, monkeypatch):
    x = logits_grid(T, cfg.num_experts, seed=len(name) + 1)
    bias = bias_for(cfg)
    for n in (0, 1, 30, T):
        cpu = moeroute.route(x, cfg, bias=bias, token_count=n)
        with monkeypatch.context() as m:
            m.setattr(stages, "_core", emu)
            dev = stages.route(x, emu.Config(cfg.__getstate__()), bias=bias,
                               token_count=np.array([n], dtype=np.int64))
            # the device clamps a count outside [0, T] (the host refuses it)
            clamped = stages.route(x, emu.Config(cfg.__getstate__()), bias=bias,
                                   token_count=np.array([T + 9 if n == T else -4 if n == 0
                                                         else n], dtype=np.int64))
        for got in (dev, clamped):
            for part in ("gated", "dispatched", "laid"):
                a, b = getattr(cpu, part).arrays, getattr(got, part).arrays
                for key, v in a.items():
                    if key not in b:
                        continue
                    if np.issubdtype(v.dtype, np.floating):
                        np.testing.assert_allclose(b[key], v, rtol=1e-5, atol=1e-6,
                                                   err_msg=f"{part}.{key}, n = {n}")
                    else:
                        np.testing.assert_array_equal(b[key], v, err_msg=f"{part}.{key}, n = {n}")
