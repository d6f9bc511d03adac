# SPDX-License-Identifier: Apache-2.0
"""moeroute.torch.Router follows the module and its config (issue 40's two Router bugs):
train() / eval() set the config's training flag — the eval capacity factor, training-only
noise — and a change to Router.config takes effect at the next forward (the noise offset can
advance per step). Each test is the failing session from the issue, turned into assertions."""

import pytest

import moeroute

torch = pytest.importorskip("torch")
import moeroute.torch as mt  # noqa: E402


def test_eval_uses_the_eval_capacity_factor():
    cfg = moeroute.Config.deepspeed_top2(8, 1.0, 4)
    cfg["capacity.eval_factor"] = 2.0
    torch.manual_seed(0)
    r = mt.Router(64, cfg)
    x = torch.randn(256, 64)
    assert r(x).totals_dict()["capacity"] == 64
    r.eval()
    assert r(x).totals_dict()["capacity"] == 128
    eval_cfg = cfg.copy()
    eval_cfg["training"] = False
    want = mt.route(torch.nn.functional.linear(x, r.weight), eval_cfg)
    got = r(x)
    assert got.totals_dict() == want.totals_dict()
    assert torch.equal(got.ids, want.ids) and torch.equal(got.weight, want.weight)
    r.train()
    assert r(x).totals_dict()["capacity"] == 64


def test_training_only_noise_is_off_in_eval_and_follows_the_offset():
    cfg = moeroute.Config.preset("mixtral", 8, 2)
    cfg["gating.noise.kind"] = "gaussian"
    cfg["gating.noise.scale"] = 3.0
    torch.manual_seed(1)
    r = mt.Router(32, cfg)
    x = torch.randn(128, 32)
    logits = torch.nn.functional.linear(x, r.weight)
    clean = cfg.copy()
    clean["gating.noise.kind"] = "none"
    no_noise = mt.route(logits, clean)
    noisy = r(x)
    assert not torch.equal(noisy.ids, no_noise.ids)  # scale 3 moves many choices
    r.eval()
    assert torch.equal(r(x).ids, no_noise.ids)
    r.train()
    assert torch.equal(r(x).ids, noisy.ids)  # same offset: the same draw
    r.config["gating.noise.offset"] = 1  # the next step's noise
    assert not torch.equal(r(x).ids, noisy.ids)


def test_a_config_change_takes_effect_at_the_next_forward():
    cfg = moeroute.Config.preset("mixtral", 8, 2)
    cfg["loss.aux_coefficient"] = 0.01
    torch.manual_seed(2)
    r = mt.Router(32, cfg)
    x = torch.randn(64, 32)
    before = float(r(x).aux_loss)
    r.config["loss.aux_coefficient"] = 1.0
    after = float(r(x).aux_loss)
    assert after == pytest.approx(before * 100.0, rel=1e-6)
    r.config["capacity.mode"] = "factor"
    r.config["capacity.factor"] = 0.5
    assert r(x).totals_dict()["capacity"] == 8  # 0.5 * 64 * 2 / 8


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch < 2 has no torch.compile")
def test_compiled_router_follows_its_mode_and_the_last_eager_config():
    # dynamo cannot read a Config: a compiled call routes with the text the last eager call
    # (or the constructor) read for its mode; train() / eval() and that text are guarded
    cfg = moeroute.Config.deepspeed_top2(8, 1.0, 4)
    cfg["capacity.eval_factor"] = 2.0
    r = moeroute.torch.Router(64, cfg)
    x = torch.randn(256, 64)
    compiled = torch.compile(r, fullgraph=True)
    assert compiled(x).totals_dict()["capacity"] == 64
    r.eval()
    assert compiled(x).totals_dict()["capacity"] == 128
    r.train()
    r.config["capacity.factor"] = 0.5
    assert r(x).totals_dict()["capacity"] == 32  # eager: read now
    assert compiled(x).totals_dict()["capacity"] == 32  # then compiled: the eager call's text
