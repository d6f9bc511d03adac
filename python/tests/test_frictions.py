# SPDX-License-Identifier: Apache-2.0
"""The frictions issue 40 met using the package as a new user would, each turned into a test of
the API used the way it failed."""

import numpy as np
import pytest

import moeroute

torch = pytest.importorskip("torch")
import moeroute.torch as mt  # noqa: E402


def test_an_engines_own_top_k_from_torch_topk():
    cfg = moeroute.Config.preset("mixtral", 8, 2)
    cfg["capacity.mode"] = "factor"
    cfg["capacity.factor"] = 1.0
    torch.manual_seed(4)
    x = torch.randn(64, 8)  # no ties: torch.topk and moeroute order the same
    probs = torch.softmax(x, dim=1)
    w, ids = torch.topk(probs, 2, dim=1)  # int64 ids, as every engine has them
    g = moeroute.Gated.from_ids(ids, cfg, gates=w / w.sum(1, keepdim=True))
    d = moeroute.dispatch(g, cfg)
    own = moeroute.route(x, cfg)
    assert torch.equal(torch.as_tensor(d.expert), torch.as_tensor(own.dispatched.expert))
    torch.testing.assert_close(torch.as_tensor(d.weight), torch.as_tensor(own.dispatched.weight))
    # a layout only: no gates needed
    lay = moeroute.layout(moeroute.dispatch(moeroute.Gated.from_ids(ids, cfg), cfg), cfg)
    assert int(lay.num_rows[0]) == int(own.laid.num_rows[0])
    bad = ids.clone()
    bad[3, 1] = bad[3, 0]
    with pytest.raises(moeroute.Error, match="ids"):
        moeroute.dispatch(moeroute.Gated.from_ids(bad, cfg), cfg)
    with pytest.raises(moeroute.Error, match=r"expected \[T, top_k = 2\]"):
        moeroute.Gated.from_ids(ids[:, :1], cfg)


def test_config_values_from_numpy_and_torch_scalars_and_te_names():
    cfg = moeroute.Config.preset("mixtral", 8, 2)
    cfg["capacity.factor"] = np.float32(1.5)
    cfg["loss.aux_coefficient"] = torch.tensor(0.25)
    cfg["capacity.min_capacity"] = np.int64(3)
    assert cfg["capacity.factor"] == 1.5 and cfg["loss.aux_coefficient"] == 0.25
    assert cfg["capacity.min_capacity"] == 3
    cfg["gating.score"] = "sqrtsoftplus"  # TransformerEngine's spelling
    assert cfg["gating.score"] == "sqrt_softplus"
    m = moeroute.Config.megatron(16, 2, scaling_factor=None)  # TE / Megatron: None = no scaling
    assert m["gating.scaling_factor"] == 1.0
    with pytest.raises(moeroute.Error):
        cfg["capacity.factor"] = np.ones(2)


def test_keyword_named_arrays_and_row_experts():
    cfg = moeroute.Config.preset("mixtral", 8, 2)
    x = np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)
    r = moeroute.route(x, cfg)
    lay = moeroute.layout(r.dispatched, cfg, kind="compact", block_size=4,
                          expert_map=np.array([0, 1, 2, 3, -1, -1, -1, -1], dtype=np.int32))
    assert lay.nonlocal_ is lay.arrays["nonlocal"]
    out = mt.route(torch.from_numpy(x), cfg, layout="compact", block_size=4)
    rows = out.row_expert
    assert rows.dtype == torch.int64 and rows.shape == out.row_token.shape
    for e in range(8):
        a, b = int(out.offsets[e]), int(out.offsets[e + 1])
        assert (rows[a:b] == e).all()
    held = out.row_token >= 0
    tok = out.row_token[held].long()
    # every held row's expert is one the token chose
    assert all(int(rows[i]) in out.ids[int(t)].tolist()
               for i, t in zip(held.nonzero().flatten().tolist(), tok.tolist()))


def test_stages_read_tensors_that_require_grad_and_errors_carry_no_traceback():
    cfg = moeroute.Config.preset("mixtral", 8, 2)
    x = torch.randn(16, 8, requires_grad=True)
    g = moeroute.gating(x, cfg)  # the values (moeroute.torch is the differentiable path)
    assert torch.equal(torch.as_tensor(g.ids), torch.as_tensor(moeroute.gating(x.detach(), cfg).ids))
    r = moeroute.route(np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32), cfg)
    h = np.ones((16, 4), np.float32)
    out = np.zeros((int(r.laid.row_token.shape[0]), 4), np.float32)
    out.setflags(write=False)  # numpy cannot hand a read-only array over for writing
    with pytest.raises(moeroute.Error, match="cannot be exported through DLPack") as e:
        moeroute.permute(h, r.laid, cfg, out=out)
    assert "At:" not in str(e.value) and "stages.py" not in str(e.value)


def test_bad_given_ids_are_named_as_python_indices():
    cfg = moeroute.Config.preset("mixtral", 8, 2)
    ids = np.array([[0, 1], [2, 3], [4, 4], [5, 9]], np.int64)
    with pytest.raises(moeroute.Error, match=r"ids\[2, 1\] = 4: token 2 names that expert twice"):
        moeroute.dispatch(moeroute.Gated.from_ids(ids[:3], cfg), cfg)
    with pytest.raises(moeroute.Error, match=r"ids\[3, 1\] is outside \[0, num_experts\)"):
        moeroute.dispatch(moeroute.Gated.from_ids(ids[[0, 1, 0, 3]], cfg), cfg)


def test_the_aux_loss_alone_needs_only_its_sums():
    cfg = moeroute.Config.preset("switch_transformers", 8)
    cfg["loss.sequence_length"] = 0
    x = np.random.default_rng(3).standard_normal((32, 8)).astype(np.float32)
    g = moeroute.gating(x, cfg)
    full = moeroute.losses(g, cfg)
    only = moeroute.Gated({k: g.arrays[k] for k in ("aux_score_sum", "aux_count", "valid_tokens")},
                          32)
    aux = moeroute.losses(only, cfg, which=["aux_loss"])
    assert list(aux) == ["aux_loss"] and float(aux["aux_loss"][0]) == float(full["aux_loss"][0])
    with pytest.raises(moeroute.Error, match="known: aux_loss"):
        moeroute.losses(g, cfg, which=["aux"])


def test_group_score_change_takes_top_n_along():
    cfg = moeroute.Config.deepseek_v3(16, 4, 4, 2)
    assert cfg["gating.group_limit.top_n"] == 2
    cfg["gating.group_limit.score"] = "max"  # DeepSeek-V2's rule: failed at a stage before
    assert cfg["gating.group_limit.top_n"] == 0
    cfg.validate()
    moeroute.route(np.zeros((4, 16), np.float32), cfg, bias=np.zeros(16, np.float32))


def test_router_bias_and_combine_shapes():
    r = mt.Router(8, "mixtral", num_experts=4, top_k=2, router_bias=True)
    with torch.no_grad():
        r.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 50.0]))  # expert 3 wins every token
    x = torch.randn(2, 5, 8)
    out = r(x)
    assert (out.ids[:, 0] == 3).all() and out.token_shape == (10,)
    out.weight.sum().backward()
    assert r.bias.grad is not None  # learned, unlike expert_bias
    # combine returns the routed logits' leading dims whether or not x is passed
    logits = torch.randn(2, 5, 4)
    routed = mt.route(logits, moeroute.Config.mixtral(4, 2))
    rows = mt.permute(x, routed)
    assert mt.combine(rows, routed).shape == (2, 5, 8)
    assert mt.combine(rows, routed, x=x).shape == (2, 5, 8)
    flat = mt.route(logits.reshape(10, 4), moeroute.Config.mixtral(4, 2))
    assert mt.combine(mt.permute(x, flat), flat, x=x).shape == (10, 8)
