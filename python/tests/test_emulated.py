# SPDX-License-Identifier: Apache-2.0
"""The binding's CUDA path without a GPU: moeroute._core_emulated is the same extension with
src/launch_cuda.cu compiled against the CPU lock-step emulation (tests/emulation), so every
stage below runs its moeroute::cuda launcher — workspace sized by the CUDA query, params
handed over as __half / __nv_bfloat16, kernels executed thread by thread — on host arrays.
Each result is compared with the CPU backend's (moeroute._core): integers exactly, floats
within the CUDA tolerances. Skipped where the toolkit was not found at build time."""

import numpy as np
import pytest

import moeroute
from moeroute import _core, stages
from conftest import logits_grid

emu = pytest.importorskip("moeroute._core_emulated",
                          reason="the emulated test module is built in the CMake build tree "
                                 "when the CUDA toolkit is found, never by pip")


@pytest.fixture
def emulated(monkeypatch):
    """The stages with the emulated module behind them; configs must be its own Config."""
    monkeypatch.setattr(stages, "_core", emu)
    return lambda cfg: emu.Config(cfg.__getstate__())


CASES = [
    ("megatron_cf1", _core.Config.megatron(16, 2, capacity_factor=1.0)),
    ("deepspeed_top2_residual", _core.Config("num_experts=16 top_k=2")),
    ("deepseek_groups_bias", _core.Config.deepseek_v3(16, 4, 4, 2)),
    ("nllb_bp", _core.Config.nllb_moe(16, expert_capacity=5, batch_prioritized_routing=True)),
]
CASES[1] = ("deepspeed_top2_residual", _core.Config.deepspeed_top2(16, 0.75, 2))
CASES[1][1]["dispatch.dropped"] = "residual"
NEXT = _core.Config.megatron(16, 2, capacity_factor=0.75)
NEXT["dispatch.dropped"] = "next_choice"
CASES.append(("megatron_next_choice", NEXT))


def assert_same(cpu, dev, what):
    for k, v in cpu.arrays.items():
        w = dev.arrays[k]
        if np.issubdtype(v.dtype, np.floating):
            np.testing.assert_allclose(w, v, rtol=1e-5, atol=1e-6, err_msg=f"{what}.{k}")
        else:
            np.testing.assert_array_equal(w, v, err_msg=f"{what}.{k}")


@pytest.mark.parametrize("name,cfg", CASES, ids=[n for n, _ in CASES])
def test_every_stage_through_the_cuda_launchers(name, cfg, emulated):
    T, d = 64, 8
    x = logits_grid(T, cfg.num_experts, seed=len(name))
    bias = (np.arange(cfg.num_experts, dtype=np.float32) % 3) * 0.25 \
        if cfg["gating.expert_bias"] else None
    valid = (np.arange(T) % 9 != 4).astype(np.uint8)
    h = np.random.default_rng(1).standard_normal((T, d)).astype(np.float32)

    stages._core = _core
    cpu = moeroute.route(x, cfg, bias=bias, valid=valid)
    buf = moeroute.permute(h, cpu.laid, cfg)
    y = moeroute.combine(buf * 2, cpu.laid, cpu.dispatched, cfg, x=h)
    gw = np.random.default_rng(2).standard_normal((T, cfg.top_k)).astype(np.float32)
    g = moeroute.gating_backward(x, cpu.gated, cpu.dispatched, cfg, grad_weight=gw, aux=0.5,
                                 z=0.25)
    cb = moeroute.combine_backward(h, buf, cpu.laid, cpu.dispatched, cfg)
    pb = moeroute.permute_backward(buf, cpu.laid, cfg)

    stages._core = emu
    ecfg = emulated(cfg)
    dev = moeroute.route(x, ecfg, bias=bias, valid=valid)
    assert_same(cpu.gated, dev.gated, "gated")
    assert_same(cpu.dispatched, dev.dispatched, "dispatched")
    assert_same(cpu.laid, dev.laid, "laid")
    for k in cpu.losses:
        np.testing.assert_allclose(dev.losses[k], cpu.losses[k], rtol=1e-6, err_msg=k)
    dbuf = moeroute.permute(h, dev.laid, ecfg)
    np.testing.assert_array_equal(dbuf, buf)
    np.testing.assert_allclose(moeroute.combine(dbuf * 2, dev.laid, dev.dispatched, ecfg, x=h), y,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        moeroute.gating_backward(x, dev.gated, dev.dispatched, ecfg, grad_weight=gw, aux=0.5,
                                 z=0.25), g, rtol=1e-5, atol=1e-7)
    for a, b in zip(moeroute.combine_backward(h, dbuf, dev.laid, dev.dispatched, ecfg), cb):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(moeroute.permute_backward(dbuf, dev.laid, ecfg), pb, rtol=1e-6)


def test_half_precision_and_compact_layout(emulated):
    torch = pytest.importorskip("torch")
    cfg = _core.Config.mixtral(8, 2)
    x = torch.from_numpy(logits_grid(48, 8, seed=3))
    for dtype in (torch.float16, torch.bfloat16):
        stages._core = _core
        cpu = moeroute.route(x.to(dtype), cfg, kind="compact", block_size=8)
        h = torch.randn(48, 16).to(dtype)
        buf = moeroute.permute(h, cpu.laid, cfg)
        stages._core = emu
        ecfg = emulated(cfg)
        dev = moeroute.route(x.to(dtype), ecfg, kind="compact", block_size=8)
        for a, b in ((cpu.gated, dev.gated), (cpu.dispatched, dev.dispatched),
                     (cpu.laid, dev.laid)):
            for k, v in a.arrays.items():
                if v.dtype.is_floating_point:
                    torch.testing.assert_close(b.arrays[k], v, rtol=1e-5, atol=1e-6)
                else:
                    assert torch.equal(b.arrays[k], v), k
        assert torch.equal(moeroute.permute(h, dev.laid, ecfg), buf)


def test_device_errors_come_back_as_moeroute_errors(emulated):
    ecfg = emulated(_core.Config.deepspeed_top2(8))
    with pytest.raises(emu.Error, match="logits: shape"):
        moeroute.gating(np.zeros((4, 6), np.float32), ecfg)
    bad = emu.Config("num_experts=4 top_k=5")
    with pytest.raises(emu.Error, match="top_k"):
        moeroute.gating(np.zeros((4, 4), np.float32), bad)
