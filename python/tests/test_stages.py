# SPDX-License-Identifier: Apache-2.0
"""The stages through the Python API against the C++ CPU reference (the oracle of every
backend): ids, slots, fates and counts exactly, gates / weights / losses within the CPU
backend's tolerances; numpy and torch, every element type, thread counts, padding masks,
and permute / combine / their backward passes against plain numpy formulas."""

import itertools

import numpy as np
import pytest

import moeroute
from moeroute import Config, Error, _core
from conftest import logits_grid

torch = pytest.importorskip("torch")


def configs():
    """A grid of peers' routings x capacity factors x drop policies x priorities."""
    out = []
    bases = [
        ("megatron", Config.megatron(16, 2, capacity_factor=1.0)),
        ("megatron_sigmoid_groups", Config.megatron(16, 4, score="sigmoid", capacity_factor=1.25,
                                                    groups=4, group_topk=2, scaling_factor=2.5,
                                                    expert_bias=True)),
        ("deepspeed_top2", Config.deepspeed_top2(16, 1.0, 4)),
        ("deepspeed_topk", Config.deepspeed_topk(16, 3, 1.25, 2)),
        ("switch_top1", Config.preset("switch_top1", 16, 1)),
        ("seed_reference", Config.preset("seed_reference", 16, 2)),
        ("nllb_bp", Config.nllb_moe(16, expert_capacity=6, batch_prioritized_routing=True)),
        ("tutel", Config.preset("tutel_topk", 16, 2)),
        ("flaxformer", Config.preset("flaxformer_topk", 16, 2)),
        ("mixtral", Config.mixtral(16, 2)),
        ("qwen", Config.qwen_moe(16, 4)),
        ("deepseek", Config.deepseek_v3(16, 4, 4, 2)),
    ]
    for name, base in bases:
        out.append((name, base))
        if base["capacity.mode"] == "unbounded":
            continue
        for factor, policy in itertools.product((0.5, 1.5), ("residual", "next_choice",
                                                             "fallback")):
            c = base.copy()
            c["capacity.factor"] = factor
            c["dispatch.dropped"] = policy
            if policy == "fallback":
                c["dispatch.fallback.expert"] = -1
            try:
                c.validate()
            except Error:
                continue
            out.append((f"{name}_cf{factor}_{policy}", c))
        for prio in ("token_major", "choice_major", "score_per_expert"):
            c = base.copy()
            c["dispatch.prio"] = prio
            c["capacity.factor"] = 0.75
            try:
                c.validate()
            except Error:
                continue
            out.append((f"{name}_{prio}", c))
    return out


CONFIGS = configs()


def bias_for(cfg):
    if not cfg["gating.expert_bias"]:
        return None
    return (np.arange(cfg.num_experts, dtype=np.float32) % 5) * 0.125


def assert_routing_equal(r, ref, cfg):
    g, d = r.gated, r.dispatched
    np.testing.assert_array_equal(np.asarray(g.ids), ref["ids"])
    np.testing.assert_array_equal(np.asarray(d.expert), ref["expert"])
    np.testing.assert_array_equal(np.asarray(d.slot), ref["slot"])
    np.testing.assert_array_equal(np.asarray(d.fate), ref["fate"])
    for name in ("requested", "kept", "rerouted", "dropped", "received", "load"):
        np.testing.assert_array_equal(np.asarray(getattr(d, name)), ref[name], err_msg=name)
    np.testing.assert_array_equal(np.asarray(d.totals), np.asarray(ref["totals"]))
    np.testing.assert_allclose(np.asarray(g.gates), ref["gates"], rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(d.weight), ref["weight"], rtol=2e-6, atol=1e-7)
    for name in ("aux_loss", "sequence_aux_loss", "z_loss"):
        got = float(np.asarray(r.losses[name])[0])
        assert got == pytest.approx(ref[name], rel=1e-6, abs=1e-9), name


@pytest.mark.parametrize("name,cfg", CONFIGS, ids=[n for n, _ in CONFIGS])
def test_route_matches_reference(name, cfg):
    x = logits_grid(96, cfg.num_experts, seed=len(name))
    bias = bias_for(cfg)
    valid = (np.arange(96) % 7 != 3).astype(np.uint8)
    ref = _core.reference_route(cfg, {"logits": x, "bias": bias, "valid": valid})
    r = moeroute.route(x, cfg, bias=bias, valid=valid)
    assert_routing_equal(r, ref, cfg)
    assert r.dispatched.totals_dict()["masked"] == cfg.top_k * int((valid == 0).sum())
    # every assignment is kept, rerouted, dropped or masked, and the counts say so
    t = r.dispatched.totals_dict()
    assert t["kept"] + t["rerouted"] + t["dropped"] + t["masked"] == 96 * cfg.top_k


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_and_element_types_match_reference(dtype):
    cfg = Config.megatron(32, 4, capacity_factor=1.0)
    x = logits_grid(128, 32, seed=3)
    ref = _core.reference_route(cfg, {"logits": x})
    t = torch.from_numpy(x).to(getattr(torch, dtype))
    assert torch.equal(t.float(), torch.from_numpy(x))  # the grid is exact in every dtype
    r = moeroute.route(t, cfg)
    assert isinstance(r.gated.ids, torch.Tensor) and r.gated.ids.dtype == torch.int32
    assert_routing_equal(r, ref, cfg)


def test_results_identical_for_any_thread_count():
    cfg = Config.qwen_moe(64, 8)
    x = logits_grid(4096, 64, seed=11, scale=2.0)
    one = moeroute.route(x, cfg, threads=1)
    for threads in (2, 3, 0):
        other = moeroute.route(x, cfg, threads=threads)
        for a, b in ((one.gated, other.gated), (one.dispatched, other.dispatched),
                     (one.laid, other.laid)):
            for k in a.arrays:
                assert np.array_equal(a.arrays[k], b.arrays[k]), (threads, k)
        for k in one.losses:
            assert one.losses[k].tobytes() == other.losses[k].tobytes()


def test_bool_mask_and_padding():
    cfg = Config.mixtral(8, 2)
    x = logits_grid(40, 8, seed=5)
    mask = np.arange(40) < 30
    r = moeroute.route(x, cfg, valid=mask)
    assert (np.asarray(r.dispatched.fate)[30:] == 3).all()  # masked
    assert int(r.gated.valid_tokens[0]) == 30
    rt = moeroute.route(torch.from_numpy(x), cfg, valid=torch.from_numpy(mask))
    np.testing.assert_array_equal(rt.dispatched.fate.numpy(), np.asarray(r.dispatched.fate))


def test_per_token_aux_rows_add_up_to_the_sums():
    cfg = Config.megatron(16, 2)
    x = logits_grid(64, 16, seed=9)
    g = moeroute.gating(x, cfg, per_token_aux=True)
    np.testing.assert_allclose(g.aux_scores.sum(0), g.aux_score_sum, rtol=1e-5)
    counts = np.bincount(g.aux_count_ids.ravel(), minlength=16)
    np.testing.assert_array_equal(counts, g.aux_count)


def test_permute_and_combine_against_numpy():
    cfg = Config.deepspeed_top2(8, 1.0, 4)
    cfg["dispatch.dropped"] = "residual"
    T, d = 64, 12
    x = logits_grid(T, 8, seed=1)
    h = np.random.default_rng(2).standard_normal((T, d)).astype(np.float32)
    r = moeroute.route(x, cfg)
    lay, dsp = r.laid, r.dispatched
    buf = moeroute.permute(h, lay, cfg)
    rows = np.asarray(lay.row_token)
    want = np.where(rows[:, None] >= 0, h[np.maximum(rows, 0)], 0.0)
    np.testing.assert_array_equal(buf, want)
    eo = np.random.default_rng(3).standard_normal(buf.shape).astype(np.float32)
    y = moeroute.combine(eo, lay, dsp, cfg, x=h)
    ar, w, fate = lay.assignment_row, dsp.weight, dsp.fate
    want_y = np.zeros_like(h)
    for t in range(T):
        for j in range(cfg.top_k):
            if ar[t, j] >= 0:
                want_y[t] += w[t, j] * eo[ar[t, j]]
        if not (fate[t] <= 1).any():  # residual: a token with nothing kept passes through
            want_y[t] += h[t]
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
    assert dsp.totals_dict()["dropped"] > 0
    # backward passes
    dy = np.random.default_rng(4).standard_normal(y.shape).astype(np.float32)
    g_out, g_w, g_x = moeroute.combine_backward(dy, eo, lay, dsp, cfg)
    want_gout = np.zeros_like(eo)
    for r_ in range(eo.shape[0]):
        t = rows[r_]
        if t >= 0:
            j = list(ar[t]).index(r_)
            want_gout[r_] = w[t, j] * dy[t]
    np.testing.assert_allclose(g_out, want_gout, rtol=1e-6, atol=1e-7)
    want_gw = np.array([[eo[ar[t, j]] @ dy[t] if ar[t, j] >= 0 else 0.0 for j in range(2)]
                        for t in range(T)], dtype=np.float32)
    np.testing.assert_allclose(g_w, want_gw, rtol=1e-5, atol=1e-5)
    passthrough = ~(fate <= 1).any(axis=1)
    np.testing.assert_allclose(g_x, np.where(passthrough[:, None], dy, 0.0))
    gx = moeroute.permute_backward(want_gout, lay, cfg)
    want_gx = np.zeros_like(h)
    for r_ in range(eo.shape[0]):
        if rows[r_] >= 0:
            want_gx[rows[r_]] += want_gout[r_]
    np.testing.assert_allclose(gx, want_gx, rtol=1e-6, atol=1e-7)


def test_compact_layout_and_expert_map():
    cfg = Config.mixtral(8, 2)
    x = logits_grid(50, 8, seed=6)
    r = moeroute.route(x, cfg, kind="compact", block_size=16)
    lay = r.laid
    assert lay.kind == "compact" and lay.max_rows % 16 == 0
    off = np.asarray(lay.offsets)
    assert (np.diff(off) % 16 == 0).all() and int(lay.num_rows[0]) == off[-1]
    # permute's fresh buffer: each row its token's x, padding rows (inside the blocks and past
    # num_rows, which the stage does not touch) zero
    h = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    buf = moeroute.permute(h, lay, cfg)
    rt = np.asarray(lay.row_token)
    want = np.where((rt >= 0)[:, None], h[np.maximum(rt, 0)], 0.0)
    assert int(lay.num_rows[0]) < lay.max_rows and np.array_equal(buf, want)
    for t in range(50):
        for j in range(2):
            assert lay.row_token[lay.assignment_row[t, j]] == t
            e = r.dispatched.expert[t, j]
            assert off[e] <= lay.assignment_row[t, j] < off[e + 1]
    # the experts 2 and 5 held here, as local experts 0 and 1
    m = np.full(8, -1, np.int32)
    m[2], m[5] = 0, 1
    local = moeroute.layout(r.dispatched, cfg, kind="compact", block_size=4, expert_map=m)
    held = np.isin(np.asarray(r.dispatched.expert), [2, 5])
    assert ((np.asarray(local.assignment_row) >= 0) == held).all()
    assert int(local.arrays["nonlocal"][0]) == int((~held).sum())


def test_gating_backward_term_weights_add_up():
    cfg = Config.megatron(16, 2, capacity_factor=1.0)
    cfg["loss.z_coefficient"] = 0.5
    x = logits_grid(64, 16, seed=8)
    r = moeroute.route(x, cfg)
    gw = np.random.default_rng(1).standard_normal((64, 2)).astype(np.float32)
    full = moeroute.gating_backward(x, r.gated, r.dispatched, cfg, grad_weight=gw, aux=0.3, z=2.0)
    parts = moeroute.gating_backward(x, r.gated, r.dispatched, cfg, grad_weight=gw, aux=0.0,
                                     z=0.0)
    moeroute.gating_backward(x, r.gated, r.dispatched, cfg, routing=0.0, aux=0.3, z=0.0,
                             out=parts)
    moeroute.gating_backward(x, r.gated, r.dispatched, cfg, routing=0.0, aux=0.0, z=2.0,
                             out=parts)
    np.testing.assert_allclose(full, parts, rtol=1e-5, atol=1e-7)


def test_expert_bias_update_moves_against_the_load():
    cfg = Config.deepseek_v3(8, 2, 0, 0)
    bias = np.zeros(8, np.float32)
    load = np.array([10, 0, 0, 0, 0, 0, 0, 6], np.int64)
    moeroute.expert_bias_update(bias, load, cfg)
    assert bias[0] < 0 and bias[1] > 0  # the overloaded expert is pushed down


def test_empty_batch():
    cfg = Config.deepspeed_top2(8)
    r = moeroute.route(np.zeros((0, 8), np.float32), cfg)
    assert r.gated.ids.shape == (0, 2) and r.dispatched.totals_dict()["kept"] == 0


def test_nonfinite_logits_are_counted():
    cfg = Config.mixtral(8, 2)
    x = logits_grid(8, 8, seed=1)
    x[2, 3] = np.nan
    x[5, 0] = np.inf
    g = moeroute.gating(x, cfg)
    assert int(g.nonfinite[0]) == 2
    assert g.ids[5, 0] == 0  # +Inf routes as +FLT_MAX (docs/numerics.md)


def test_hostile_inputs_raise_clear_errors():
    cfg = Config.deepspeed_top2(8)
    x = logits_grid(16, 8, seed=1)
    with pytest.raises(Error, match=r"gating: logits: shape \[16, 4\], expected \[\*, 8\]"):
        moeroute.gating(x[:, :4].copy(), cfg)
    with pytest.raises(Error, match="logits: dtype float64, expected one of float32"):
        moeroute.gating(x.astype(np.float64), cfg)
    with pytest.raises(Error, match="logits: dtype int32"):
        moeroute.gating(x.astype(np.int32), cfg)
    with pytest.raises(Error, match="must be contiguous"):
        moeroute.gating(np.asfortranarray(logits_grid(8, 16, 1).T), Config.deepspeed_top2(16))
    with pytest.raises(Error, match="must be contiguous"):
        moeroute.gating(torch.from_numpy(logits_grid(8, 16, 1)).t(), Config.deepspeed_top2(16))
    with pytest.raises(Error, match="logits: must be 2-D"):
        moeroute.gating(x.reshape(2, 8, 8), cfg)
    with pytest.raises(Error, match="expected a numpy array or a torch tensor"):
        moeroute.gating([[0.0] * 8] * 2, cfg)
    with pytest.raises(Error, match=r"valid: shape \[3\], expected \[16\]"):
        moeroute.gating(x, cfg, valid=np.ones(3, np.uint8))
    ds = Config.deepseek_v3(8, 2, 0, 0)
    with pytest.raises(Error, match="bias: required here"):
        moeroute.gating(x, ds)
    with pytest.raises(Error, match="d_bias given but gating.expert_bias is false"):
        moeroute.gating(x, cfg, bias=np.zeros(8, np.float32))
    with pytest.raises(Error, match=r"d_bias\[0\] is not finite"):
        moeroute.gating(x, ds, bias=np.full(8, np.nan, np.float32))
    bad = Config("num_experts=8 top_k=9")
    with pytest.raises(Error, match="top_k"):
        moeroute.gating(x, bad)
    with pytest.raises(Error, match="the padded layout needs a bounded capacity"):
        moeroute.route(x, Config.mixtral(8, 2), kind="padded")
    with pytest.raises(Error, match="not a layout"):
        moeroute.route(x, cfg, kind="diagonal")
    r = moeroute.route(x, cfg)
    h = np.ones((16, 4), np.float32)
    assert moeroute.permute(h.astype(np.float16), r.laid, cfg).dtype == np.float16
    with pytest.raises(Error, match="permute: x: dtype int64, expected one of float32"):
        moeroute.permute(np.ones((16, 4), np.int64), r.laid, cfg)
    with pytest.raises(Error, match=r"combine: assignment_row: shape"):
        moeroute.combine(np.ones((r.laid.max_rows, 4), np.float32), r.laid,
                         moeroute.Dispatched({"weight": np.ones((3, 2), np.float32),
                                              "fate": np.zeros((3, 2), np.uint8)}), cfg)
    # a mismatched config between stages is caught by the shapes it implies
    with pytest.raises(Error, match="ids: shape"):
        moeroute.dispatch(r.gated, Config.deepspeed_topk(8, 3))


@pytest.mark.skipif(not torch.cuda.is_available() or _core.cuda,
                    reason="checks the CPU-only build's message for CUDA tensors")
def test_cuda_tensor_on_a_cpu_only_build_is_refused():
    cfg = Config.deepspeed_top2(8)
    with pytest.raises(Error, match="CPU backend only"):
        moeroute.gating(torch.zeros(4, 8, device="cuda"), cfg)


@pytest.mark.skipif(not (torch.cuda.is_available() and _core.cuda),
                    reason="no CUDA device, or moeroute built without CUDA")
@pytest.mark.parametrize("name,cfg", CONFIGS[::3], ids=[n for n, _ in CONFIGS[::3]])
def test_cuda_stages_match_the_cpu(name, cfg):
    """Every stage on CUDA tensors (the CUDA launchers on torch's current stream) against the
    same stage on the CPU: integers exactly, floats within the CUDA tolerances."""
    x = logits_grid(256, cfg.num_experts, seed=len(name))
    bias = bias_for(cfg)
    tb = None if bias is None else torch.from_numpy(bias)
    cpu = moeroute.route(torch.from_numpy(x), cfg, bias=tb)
    gpu = moeroute.route(torch.from_numpy(x).cuda(), cfg, bias=None if tb is None else tb.cuda())
    for a, b in ((cpu.gated, gpu.gated), (cpu.dispatched, gpu.dispatched), (cpu.laid, gpu.laid)):
        for k, v in a.arrays.items():
            w = b.arrays[k].cpu()
            if v.dtype.is_floating_point:
                torch.testing.assert_close(w, v, rtol=1e-5, atol=1e-6, msg=k)
            else:
                assert torch.equal(w, v), k
    h = torch.randn(256, 32)
    buf = moeroute.permute(h, cpu.laid, cfg)
    gbuf = moeroute.permute(h.cuda(), gpu.laid, cfg)
    torch.testing.assert_close(gbuf.cpu(), buf)
    y = moeroute.combine(buf, cpu.laid, cpu.dispatched, cfg, x=h)
    gy = moeroute.combine(gbuf, gpu.laid, gpu.dispatched, cfg, x=h.cuda())
    torch.testing.assert_close(gy.cpu(), y, rtol=1e-5, atol=1e-5)
    gw = torch.randn(256, cfg.top_k)
    g = moeroute.gating_backward(torch.from_numpy(x), cpu.gated, cpu.dispatched, cfg,
                                 grad_weight=gw)
    gg = moeroute.gating_backward(torch.from_numpy(x).cuda(), gpu.gated, gpu.dispatched, cfg,
                                  grad_weight=gw.cuda())
    torch.testing.assert_close(gg.cpu(), g, rtol=1e-5, atol=1e-6)


def staged_route(x, cfg, **kw):
    """moeroute.route's four stages called one by one (the path torch tensors take): what
    the fused host binding must give, array for array."""
    kind = moeroute.stages.layout_kind_for(cfg, kw.pop("kind", "auto"))
    block_size = kw.pop("block_size", 1)
    valid = kw.get("valid")
    g = moeroute.gating(x, cfg, **kw)
    d = moeroute.dispatch(g, cfg, valid=valid)
    lay = moeroute.layout(d, cfg, kind=kind, block_size=block_size)
    return g, d, lay, moeroute.losses(g, cfg)


def test_fused_host_route_keeps_a_plan_per_config_and_batch():
    """The fused host route keeps the buffer plans of its last 8 (config, T, layout) calls and
    reuses one only for a bit-equal config: configs that differ in one field that changes an
    output's shape (capacity factor: the padded rows; top_k; sequence length), batch sizes, and
    more of them than are kept, in turns — each call equal to the stages called one by one."""
    base = Config.preset("olmoe", 16, 4)
    variants = []
    for factor in (1.0, 1.25, 2.0, 4.0):
        for k in (2, 4):
            c = base.copy()
            c["capacity.factor"] = factor
            c["top_k"] = k
            variants.append(c)
    seq = base.copy()
    seq["loss.sequence_length"] = 5
    variants.append(seq)
    for turn in range(3):
        for i, cfg in enumerate(variants):
            T = (5, 20, 35)[(i + turn) % 3]
            x = logits_grid(T, cfg.num_experts, seed=i + 10 * turn)
            fused = moeroute.route(x, cfg)
            g, d, lay, losses = staged_route(x, cfg)
            for got, want in ((fused.gated.arrays, g.arrays), (fused.dispatched.arrays, d.arrays),
                              (fused.laid.arrays, lay.arrays), (fused.losses, losses)):
                assert sorted(got) == sorted(want)
                for key in want:
                    assert got[key].shape == want[key].shape, (turn, i, key)
                    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize("case", ["plain", "bool_valid", "per_token_aux", "replay", "compact",
                                  "sequences", "empty"])
@pytest.mark.parametrize("name,cfg", CONFIGS[::4], ids=[n for n, _ in CONFIGS[::4]])
def test_fused_host_route_equals_the_stages(name, cfg, case):
    """moeroute.route on host numpy arrays runs the four stages in one binding call
    (_core.route_host, every output carved from one buffer): every output array, bit for bit,
    as the stages called one by one give it."""
    T = 0 if case == "empty" else 77
    cfg = cfg.copy()
    if case == "sequences":
        cfg["loss.sequence_length"] = 7
    x = logits_grid(T, cfg.num_experts, seed=len(name) + len(case))
    kw = dict(bias=bias_for(cfg))
    if case in ("plain", "bool_valid", "replay", "sequences"):
        valid = np.arange(T) % 5 != 2
        kw["valid"] = valid if case == "bool_valid" else valid.astype(np.uint8)
    if case == "per_token_aux":
        kw["per_token_aux"] = True
    if case == "replay":
        rng = np.random.default_rng(3)
        kw["replay_ids"] = rng.integers(-1, cfg.num_experts, size=(T, cfg.top_k)).astype(np.int64)
        kw["replay_ratio"] = 0.5
    route_kw = dict(kw)
    if case == "compact":
        route_kw.update(kind="compact", block_size=8)
    try:
        fused = moeroute.route(x, cfg, **route_kw)
    except Error as e:
        with pytest.raises(Error, match=str(e).split(":")[0]):
            staged_route(x, cfg, **route_kw)
        return
    g, d, lay, losses = staged_route(x, cfg, **route_kw)
    for got, want in ((fused.gated.arrays, g.arrays), (fused.dispatched.arrays, d.arrays),
                      (fused.laid.arrays, lay.arrays), (fused.losses, losses)):
        assert sorted(got) == sorted(want)
        for key in want:
            assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
            # (C order, as numpy makes them: pybind11 < 2.12 made 0 strides under numpy 2)
            assert got[key].flags["C_CONTIGUOUS"], key
            if want[key].size > 0:  # (an empty array's strides are numpy's choice)
                assert got[key].strides == want[key].strides, key
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert fused.laid.max_rows == lay.max_rows and fused.laid.kind == lay.kind
