# SPDX-License-Identifier: Apache-2.0
"""moeroute.torch.route(out=): an earlier RouterOutput written again in place (a decode loop's
layer keeps its own) equals a fresh route of the same inputs in every field, bit for bit,
and keeps its tensors (the same objects and storage); outputs of another config, batch or
path are refused or copied into, never written under another layout."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import moeroute  # noqa: E402
import moeroute.torch as mt  # noqa: E402
from moeroute import Config, Error  # noqa: E402
from conftest import logits_grid  # noqa: E402

TENSORS = mt.RouterOutput._fields[:21]


def assert_same(got, want):
    for name in TENSORS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name
    assert got.config_text == want.config_text and got.token_shape == want.token_shape


CONFIGS = {
    "megatron_padded": (Config.megatron(64, 2, capacity_factor=1.25), {}),
    "mixtral_compact": (Config.mixtral(8, 2), {}),
    "deepseek_bias": (Config.deepseek_v3(64, 8, 8, 4), {"bias": True}),
    "switch": (Config.switch_transformers(8, 4), {}),
    "sequence_aux": (Config.deepseek_v3(64, 8, 8, 4).with_sequence_aux(1), {"bias": True}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("T", [1, 37])
@pytest.mark.parametrize("extra", ["plain", "valid", "token_count", "replay"])
def test_out_equals_a_fresh_route(name, T, extra, monkeypatch):
    cfg, opts = CONFIGS[name]
    copies = []  # route(out=)'s fallback: a fresh routing copied in (not expected here)
    impl = mt._route_impl

    def counted(*args, into=None, **kw):
        if into is None:
            copies.append(1)
        return impl(*args, into=into, **kw)

    monkeypatch.setattr(mt, "_route_impl", counted)
    E, k = cfg.num_experts, cfg.top_k
    kw = {}
    if opts.get("bias"):
        kw["bias"] = torch.linspace(-0.5, 0.5, E)
    rng = np.random.default_rng(T)
    if extra == "valid":
        kw["valid"] = torch.from_numpy(rng.integers(0, 2, T).astype(bool))
    elif extra == "token_count":
        kw["token_count"] = max(1, T // 2)
    elif extra == "replay":
        ids = np.stack([rng.permutation(E)[:k] for _ in range(T)])  # distinct per token
        ids[rng.random((T, k)) < 0.3] = -1  # some slots left to the router
        kw["replay_ids"] = torch.from_numpy(ids.astype(np.int64))
    with torch.no_grad():
        first = torch.from_numpy(logits_grid(T, E, seed=1))
        r = mt.route(first, cfg, **kw)
        ptrs = [getattr(r, n).data_ptr() for n in TENSORS]
        objs = [getattr(r, n) for n in TENSORS]
        for step in range(2, 5):  # decode steps: new logits each, the same output
            logits = torch.from_numpy(logits_grid(T, E, seed=step))
            copies.clear()
            got = mt.route(logits, cfg, out=r, **kw)
            assert got is r and copies == ([1] if moeroute._core.emulated else [])
            assert_same(r, mt.route(logits, cfg, **kw))
        assert [getattr(r, n).data_ptr() for n in TENSORS] == ptrs
        assert all(getattr(r, n) is o for n, o in zip(TENSORS, objs))


def test_out_keeps_the_loss_dtype_of_float64_logits():
    cfg = Config.megatron(16, 2, capacity_factor=1.0)
    with torch.no_grad():
        x = torch.from_numpy(logits_grid(9, 16, seed=3)).double()
        r = mt.route(x, cfg)
        assert r.aux_loss.dtype == torch.float64
        y = torch.from_numpy(logits_grid(9, 16, seed=4)).double()
        assert_same(mt.route(y, cfg, out=r), mt.route(y, cfg))


def test_a_routing_made_elsewhere_is_copied_into():
    # a RouterOutput the host path did not carve (here: cloned tensors) has no buffer to
    # write: the routing is computed and copied into its tensors
    cfg = Config.mixtral(8, 2)
    with torch.no_grad():
        x = torch.from_numpy(logits_grid(12, 8, seed=5))
        r0 = mt.route(x, cfg)
        r = mt.RouterOutput(*(t.clone() for t in r0[:21]), r0.config_text, r0.token_shape)
        ptr = r.weight.data_ptr()
        y = torch.from_numpy(logits_grid(12, 8, seed=6))
        assert mt.route(y, cfg, out=r) is r
        assert_same(r, mt.route(y, cfg))
        assert r.weight.data_ptr() == ptr


def test_another_layout_of_the_same_config_is_not_written_in_place():
    # the same config text and batch, another layout: the buffer's plan differs, so the
    # routing is copied in only where every field's shape agrees, else refused (padded: 8
    # experts x 8 slots; compact: 16 x 2 rows)
    cfg = Config.megatron(8, 2, capacity_factor=2.0)
    with torch.no_grad():
        x = torch.from_numpy(logits_grid(16, 8, seed=7))
        padded = mt.route(x, cfg, layout="padded")
        with pytest.raises(Error, match="out: row_token"):
            mt.route(x, cfg, layout="compact", out=padded)


def test_bad_out_is_named():
    cfg = Config.mixtral(8, 2)
    with torch.no_grad():
        x = torch.from_numpy(logits_grid(12, 8, seed=8))
        r = mt.route(x, cfg)
        with pytest.raises(Error, match="out: a routing of another config or batch"):
            mt.route(torch.from_numpy(logits_grid(13, 8, seed=8)), cfg, out=r)
        with pytest.raises(Error, match="out: a routing of another config or batch"):
            mt.route(x, Config.mixtral(8, 1), out=r)
        with pytest.raises(Error, match="out: a RouterOutput"):
            mt.route(x, cfg, out=tuple(r))
    g = x.clone().requires_grad_()
    with pytest.raises(Error, match="out= writes without autograd"):
        mt.route(g, cfg, out=r)
    trained = mt.route(g, cfg)  # its ids and fate are saved for its backward pass
    with torch.no_grad(), pytest.raises(Error, match="out: a routing recorded for autograd"):
        mt.route(x, cfg, out=trained)
