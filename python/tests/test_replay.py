# SPDX-License-Identifier: Apache-2.0
"""Routing replay from Python (docs/replay.md): replay_ids in gating / route and in
moeroute.torch (the gradient of the replayed weights against torch autograd of the same
formula), the score filter, RoutingRecord, and moeroute.agreement against a numpy count."""

import numpy as np
import pytest

import moeroute
from moeroute import _core, stages
from conftest import logits_grid

try:
    import torch

    import moeroute.torch as mt
except ImportError:  # pragma: no cover - torch is part of the test environment
    torch = None

PRESETS = ["mixtral", "qwen_moe", "deepseek_v3", "megatron", "switch_transformers", "olmoe",
           "deepspeed_topk", "nllb_moe"]


def preset(name, E=16, k=2):
    info = {p["name"]: p for p in _core.presets()}[name]
    return moeroute.Config.preset(name, E, info["top_k"] if info["fixed_k"] else k)


def bias_for(cfg):
    E = cfg.num_experts
    return (np.arange(E, dtype=np.float32) % 5) * 0.05 - 0.1 if cfg["gating.expert_bias"] else None


@pytest.mark.parametrize("name", PRESETS)
def test_replaying_own_ids_is_the_identity(name):
    cfg = preset(name)
    x = logits_grid(96, cfg.num_experts, seed=3)
    bias = bias_for(cfg)
    own = moeroute.route(x, cfg, bias=bias)
    for ids in (own.gated.ids, own.gated.ids.astype(np.int64)):
        again = moeroute.route(x, cfg, bias=bias, replay_ids=ids, replay_ratio=0.5)
        for part in ("gated", "dispatched"):
            for key, v in getattr(own, part).arrays.items():
                np.testing.assert_array_equal(getattr(again, part).arrays[key], v,
                                              err_msg=f"{name} {part}.{key}")
        assert int(again.gated.replay_replaced[0]) == 0
        for key, v in own.losses.items():
            np.testing.assert_array_equal(again.losses[key], v)


def test_a_minus_one_slot_and_the_filter_by_hand():
    cfg = moeroute.Config.preset("qwen_moe", 4, 2)
    cfg["gating.renorm"] = "before_drop"
    x = np.array([[3.0, 1.0, 2.0, 0.0]], dtype=np.float32)
    g = moeroute.gating(x, cfg, replay_ids=np.array([[1, -1]]))
    np.testing.assert_array_equal(g.ids, [[1, 0]])
    e1, e3 = np.exp(1.0), np.exp(3.0)
    np.testing.assert_allclose(g.gates, [[e1 / (e1 + e3), e3 / (e1 + e3)]], rtol=1e-6)
    # own top-2: 0, 2 (weakest 2); p3 / p2 = e^-2 = 0.135, p1 / p2 = e^-1 = 0.368
    r = np.array([[3, 1]], dtype=np.int32)
    g = moeroute.gating(x, cfg, replay_ids=r, replay_ratio=0.3)
    np.testing.assert_array_equal(g.ids, [[0, 1]])
    assert int(g.replay_replaced[0]) == 1
    g = moeroute.gating(x, cfg, replay_ids=r, replay_ratio=0.5)
    np.testing.assert_array_equal(g.ids, [[0, 2]])
    assert int(g.replay_replaced[0]) == 2


def test_bad_replay_input_raises_naming_it():
    cfg = moeroute.Config.preset("qwen_moe", 8, 2)
    x = logits_grid(2, 8, seed=1)
    with pytest.raises(moeroute.Error, match=r"replay.d_ids\[3\] = 8"):
        moeroute.gating(x, cfg, replay_ids=np.array([[0, 1], [2, 8]]))
    with pytest.raises(moeroute.Error, match="repeats slot 0 of token 1"):
        moeroute.gating(x, cfg, replay_ids=np.array([[0, 1], [2, 2]]))
    with pytest.raises(moeroute.Error, match="replay_ids"):
        moeroute.gating(x, cfg, replay_ids=np.array([[0, 1, 2], [2, 3, 4]]))
    with pytest.raises(moeroute.Error, match="min_score_ratio"):
        moeroute.gating(x, cfg, replay_ids=np.array([[0, 1], [2, 3]]), replay_ratio=1.5)
    with pytest.raises(moeroute.Error, match="expected integer expert ids"):
        moeroute.gating(x, cfg, replay_ids=np.zeros((2, 2), dtype=np.float32))


def test_record_and_replay_through_a_routing_record(tmp_path):
    cfg = moeroute.Config.preset("deepseek_v3", 64, 8)
    layers, T = 3, 40
    for layout in ("tokens_layers_k", "layers_tokens_k"):
        rec = moeroute.RoutingRecord(100, layers, 8, 64, layout=layout)
        assert rec.ids.dtype == np.int16
        routed = []
        for layer in range(layers):
            x = logits_grid(T, 64, seed=10 + layer)
            r = moeroute.route(x, cfg, bias=bias_for(cfg))
            rec.record(layer, r.gated.ids, first_token=20)
            routed.append((x, r))
        shape = (100, layers, 8) if layout == "tokens_layers_k" else (layers, 100, 8)
        assert rec.ids.shape == shape
        path = tmp_path / f"{layout}.npy"
        rec.save(str(path))
        back = moeroute.RoutingRecord.load(str(path), 64, layout=layout)
        for layer, (x, r) in enumerate(routed):
            ids = back.replay_ids(layer, 20, T)
            np.testing.assert_array_equal(ids, r.gated.ids)
            again = moeroute.route(x, cfg, bias=bias_for(cfg), replay_ids=ids)
            np.testing.assert_array_equal(again.dispatched.weight, r.dispatched.weight)
        assert (back.replay_ids(0, 0, 20) == -1).all()  # never recorded: the router chooses
    with pytest.raises(moeroute.Error, match="exceeds the record's 100 tokens"):
        rec.record(0, routed[0][1].gated.ids, first_token=80)
    with pytest.raises(moeroute.Error, match="int16 holds expert ids up to 32767"):
        moeroute.RoutingRecord(4, 1, 2, 40000, dtype="int16")


def numpy_agreement(a, b, k, margin):
    """top-k on the logits (Mixtral selection), ties to the lower index."""
    out = []
    for xa, xb in zip(a, b):
        ia = np.argsort(-xa, axis=1, kind="stable")[:, :k]
        ib = np.argsort(-xb, axis=1, kind="stable")[:, :k]
        missing = (~(ia[:, :, None] == ib[:, None, :]).any(axis=2)).sum(axis=1)
        chosen = np.zeros_like(xa, dtype=bool)
        np.put_along_axis(chosen, ia, True, axis=1)
        gap = np.where(chosen, xa, np.inf).min(axis=1) - np.where(chosen, -np.inf, xa).max(axis=1)
        out.append((int((missing > 0).sum()), int(missing.sum()),
                    int(((missing > 0) & (gap < margin)).sum()), missing > 0))
    return out


def test_agreement_equals_a_numpy_count():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 500, 16)).astype(np.float32)
    b = (a + rng.standard_normal(a.shape).astype(np.float32) * 0.05).astype(np.float32)
    r = moeroute.agreement(a, b, "mixtral", top_k=2, tie_margin=0.1)
    want = numpy_agreement(a, b, 2, 0.1)
    any_layer = np.zeros(500, dtype=bool)
    for layer, (tok, slots, near, differ) in enumerate(want):
        got = r["layers"][layer]
        assert (got["tokens_differ"], got["slots_differ"], got["near_ties"]) == (tok, slots, near)
        assert tok > 0
        any_layer |= differ
    assert r["tokens_differ_any_layer"] == int(any_layer.sum())
    assert moeroute.agreement(a, a, "mixtral", top_k=2)["tokens_differ_any_layer"] == 0
    with pytest.raises(moeroute.Error, match="differ in shape"):
        moeroute.agreement(a, b[:, :10], "mixtral", top_k=2)


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_torch_replay_gradient_equals_autograd_of_the_formula():
    """Qwen-style routing (softmax over all, top-2 of the scores, renormalised): the weights
    of the replayed ids, and their gradient, equal torch autograd of the same formula."""
    cfg = moeroute.Config.preset("qwen_moe", 16, 2)
    cfg["gating.renorm"] = "before_drop"
    cfg["capacity.mode"] = "unbounded"
    x = torch.tensor(logits_grid(32, 16, seed=8), requires_grad=True)
    own = mt.route(x.detach(), cfg)
    rng = np.random.default_rng(0)
    replay = own.ids.clone().to(torch.int64)
    replay[::3, 1] = -1
    flip = torch.tensor(rng.integers(0, 16, 32))
    for t in range(0, 32, 4):  # another expert in slot 0 where it is not already there
        if int(flip[t]) not in replay[t].tolist():
            replay[t, 0] = int(flip[t])
    out = mt.route(x, cfg, replay_ids=replay)
    ids = out.ids.to(torch.int64)
    kept = replay >= 0
    assert torch.equal(ids[kept], replay[kept])
    w = torch.randn(32, 2, dtype=torch.float32)
    (out.weight * w).sum().backward()
    grad = x.grad.clone()

    x2 = x.detach().clone().requires_grad_(True)
    p = torch.softmax(x2, dim=1)
    g = torch.gather(p, 1, ids)
    ref = g / g.sum(dim=1, keepdim=True)
    torch.testing.assert_close(out.weight.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    (ref * w).sum().backward()
    torch.testing.assert_close(grad, x2.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_torch_router_replays_and_counts_the_filter():
    torch.manual_seed(0)
    r = mt.Router(32, "mixtral", num_experts=8, top_k=2, replay_ratio=0.3)
    h = torch.randn(64, 32)
    own = r(h)
    again = r(h, replay_ids=own.ids)
    assert torch.equal(again.ids, own.ids) and torch.equal(again.weight, own.weight)
    assert int(again.replay_replaced[0]) == 0
    other = (own.ids + 3) % 8  # mostly other experts: some fall below 0.3 of the weakest
    other[other[:, 0] == other[:, 1], 1] = (other[other[:, 0] == other[:, 1], 0] + 1) % 8
    moved = r(h, replay_ids=other)
    assert int(moved.replay_replaced[0]) > 0
    with pytest.raises(moeroute.Error, match="replay_ratio"):
        mt.Router(32, "mixtral", num_experts=8, top_k=2, replay_ratio=2.0)


def test_emulated_cuda_launcher_replays_as_the_cpu():
    """The CUDA launcher's replay (on the lock-step emulation) equals the CPU backend's."""
    emu = pytest.importorskip("moeroute._core_emulated",
                              reason="the emulated module is built in the CMake build tree")
    cfg = moeroute.Config.preset("deepseek_v3", 16, 4)
    x = logits_grid(50, 16, seed=2)
    own = moeroute.gating(x, cfg, bias=bias_for(cfg))
    replay = own.ids.copy()
    replay[::2, 0] = -1
    replay[1::4, 3] = (replay[1::4, 3] + 5) % 16
    for row in replay:  # keep each row distinct
        seen = set()
        for j, e in enumerate(row):
            if e in seen:
                row[j] = -1
            seen.add(int(row[j]))
    cpu = moeroute.gating(x, cfg, bias=bias_for(cfg), replay_ids=replay, replay_ratio=0.2)
    saved = stages._core
    stages._core = emu
    try:
        dev = moeroute.gating(x, emu.Config(cfg.__getstate__()), bias=bias_for(cfg),
                              replay_ids=replay, replay_ratio=0.2)
    finally:
        stages._core = saved
    np.testing.assert_array_equal(dev.ids, cpu.ids)
    np.testing.assert_allclose(dev.gates, cpu.gates, rtol=1e-5)
    assert int(dev.replay_replaced[0]) == int(cpu.replay_replaced[0])
    assert int(dev.replay_invalid[0]) == 0
