# SPDX-License-Identifier: Apache-2.0
"""Property-based differential tests (hypothesis, Debian's python3-hypothesis): random configs
from every preset and option, T, E, k, dtypes, padding masks and biases; every stage of the CPU
backend against the CPU reference, and the invariants on each result (every assignment
accounted for, slots dense, capacity respected, permute / combine adjoint to their backward).
Invalid configs must raise moeroute.Error naming a field, never crash.

CI runs a fixed seed and a bounded example count; MOEROUTE_HYPOTHESIS_LONG=1 runs 50x more
examples with a random seed (reliability.md records the last long run). Cases hypothesis found
and we fixed stay below as @example regressions.

Logits lie on a 1/8 grid (exact in float16 and bfloat16): exact ties are common (both codes
send them to the lower index) and distinct logits are far apart, so the comparison is exact
where the library promises exactness; dispatch is compared with the reference's dispatch of the
backend's own gating, since priorities that rank by gate may order two gates within their last
bit differently (docs/numerics.md)."""

import os

import numpy as np
import pytest

import moeroute
from moeroute import _core

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

LONG = bool(os.environ.get("MOEROUTE_HYPOTHESIS_LONG"))
settings.register_profile("moeroute_ci", max_examples=120, derandomize=True, deadline=None,
                          database=None,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.filter_too_much])
settings.register_profile("moeroute_long", max_examples=6000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.filter_too_much])
PROFILE = "moeroute_long" if LONG else "moeroute_ci"

PRESETS = {p["name"]: p for p in _core.presets()}
ENUMS = {
    "gating.score": ["softmax", "sigmoid", "sqrt_softplus"],
    "gating.select": ["logits", "scores"],
    "gating.stage": ["before_topk", "after_topk"],
    "gating.renorm": ["none", "before_drop", "after_drop"],
    "capacity.mode": ["factor", "fixed", "max_load", "unbounded", "batch_fraction"],
    "capacity.rounding": ["ceil", "floor", "nearest_even"],
    "dispatch.prio": ["token_major", "choice_major", "score_per_expert", "random",
                      "batch_prioritized"],
    "dispatch.slots": ["priority", "token_index"],
    "dispatch.dropped": ["zero_weight", "residual", "fallback", "next_choice"],
    "loss.counts": ["top1", "all_k"],
    "loss.count_source": ["routed", "fresh_topk"],
    "loss.scale": ["e_times_sum", "e_over_k_sum", "normalized"],
    "gating.noise.kind": ["none", "gaussian", "gumbel"],
    "gating.noise.target": ["selection_only", "selection_and_gates"],
}
NUMBERS = {
    "gating.scaling_factor": [0.5, 1.0, 2.5],
    "capacity.factor": [0.25, 0.5, 1.0, 1.25, 2.0],
    "capacity.min_capacity": [0, 1, 4],
    "capacity.fixed": [0, 1, 3, 8],
    "dispatch.reroute.max_candidates": [1, 2, 4],
    "dispatch.fallback.expert": [-1, 0],
    "gating.noise.scale": [0.25, 1.0],
    "loss.z_coefficient": [0.0, 0.001],
}


@st.composite
def configs(draw):
    """A preset for E, k, then any of the options changed: valid or not."""
    name = draw(st.sampled_from(sorted(PRESETS)))
    E = draw(st.integers(1, 40))
    k = PRESETS[name]["top_k"] if PRESETS[name]["fixed_k"] else draw(st.integers(1, min(E, 6)))
    try:
        cfg = moeroute.Config.preset(name, E, k)
    except moeroute.Error:
        hypothesis.assume(False)
    for field, values in draw(st.lists(st.sampled_from(sorted({**ENUMS, **NUMBERS}.items())),
                                       max_size=5, unique_by=lambda fv: fv[0])):
        cfg[field] = draw(st.sampled_from(values))
    if draw(st.booleans()) and E >= 4:
        groups = draw(st.sampled_from([g for g in (2, 4) if E % g == 0] or [1]))
        if groups > 1:
            cfg["gating.group_limit.groups"] = groups
            cfg["gating.group_limit.group_topk"] = draw(st.integers(1, groups))
    if draw(st.booleans()):
        cfg["gating.expert_bias"] = not cfg["gating.expert_bias"]
    return cfg


def named(message: str, cfg) -> bool:
    """True when a validation message names a config field (or the shape it checked)."""
    return any(f in message for f in cfg.fields()) or "experts" in message


@settings.get_profile(PROFILE)
@given(configs())
def test_every_config_is_accepted_or_rejected_by_name(cfg):
    try:
        cfg.validate()
    except moeroute.Error as e:
        assert named(str(e), cfg), str(e)
        with pytest.raises(moeroute.Error):
            moeroute.route(np.zeros((4, cfg.num_experts), np.float32), cfg)


@settings.get_profile(PROFILE)
@given(configs(), st.data())
def test_hostile_field_values_raise_naming_the_field(cfg, data):
    field = data.draw(st.sampled_from(sorted({**ENUMS, **NUMBERS})))
    value = data.draw(st.one_of(st.sampled_from(["", "nope", "1e999", "-1"]),
                                st.integers(-2**40, 2**40), st.floats(allow_nan=True)))
    try:
        cfg[field] = value
    except moeroute.Error as e:
        assert field in str(e) or "value" in str(e), str(e)
        return
    try:
        cfg.validate()
    except moeroute.Error as e:
        assert named(str(e), cfg), str(e)


def grid(draw, shape, step, lo, hi):
    n = int(np.prod(shape))
    values = draw(st.lists(st.integers(int(lo / step), int(hi / step)), min_size=n, max_size=n))
    return (np.asarray(values, np.float32) * np.float32(step)).reshape(shape)


@st.composite
def batches(draw, cfg):
    """T (a multiple of the sequence length), logits, bias, mask and dtype for `cfg`."""
    L = cfg["loss.sequence_length"]
    T = draw(st.integers(0, 48)) * (L if L > 0 else 1)
    E = cfg.num_experts
    x = grid(draw, (T, E), 0.125, -4, 4)
    bias = grid(draw, (E,), 0.0625, -0.5, 0.5) if cfg["gating.expert_bias"] else None
    valid = None
    if T and draw(st.booleans()):
        valid = np.asarray(draw(st.lists(st.booleans(), min_size=T, max_size=T)), np.uint8)
    dtype = draw(st.sampled_from(["float32", "float16"]))
    return x, bias, valid, dtype


def check_invariants(cfg, T, d, lay, kind):
    k = cfg.top_k
    fate = np.asarray(d.fate)
    totals = d.totals_dict()
    # every assignment accounted for
    assert totals["kept"] + totals["rerouted"] + totals["dropped"] + totals["masked"] == T * k
    assert (np.bincount(fate.ravel(), minlength=4)[:4] ==
            [totals["kept"], totals["rerouted"], totals["dropped"], totals["masked"]]).all()
    expert, slot = np.asarray(d.expert), np.asarray(d.slot)
    held = (fate == 0) | (fate == 1)
    assert (expert[~held] == -1).all() and (slot[~held] == -1).all()
    assert (np.asarray(d.weight)[~held] == 0).all()
    load = np.asarray(d.load)
    for e in range(load.shape[0]):
        at = held & (expert == e)
        # slots dense 0 .. load-1 (a token rerouted onto an expert it holds shares its slot)
        assert sorted(set(slot[at].tolist())) == list(range(int(load[e])))
    C = totals["capacity"]
    if C >= 0:
        assert (load[:cfg.num_experts] <= C).all()
    # the layout holds exactly the held assignments
    row = np.asarray(lay.assignment_row)
    assert ((row >= 0) == held).all()


def adjoint_checks(cfg, x, d, lay, rng):
    """<permute(h), g> == <h, permute_backward(g)> and the same for combine."""
    T = x.shape[0]
    D = 3
    h = rng.standard_normal((T, D)).astype(np.float32)
    buf = moeroute.permute(h, lay, cfg)
    g = rng.standard_normal(buf.shape).astype(np.float32)
    back = moeroute.permute_backward(g, lay, cfg)
    lhs, rhs = float((buf.astype(np.float64) * g).sum()), float((h.astype(np.float64) * back).sum())
    assert abs(lhs - rhs) <= 1e-4 * (1 + abs(lhs))
    eo = rng.standard_normal(buf.shape).astype(np.float32)
    # residual adds x for the dropped assignments: x = 0 leaves the linear map in eo
    zero = np.zeros((T, D), np.float32) if cfg["dispatch.dropped"] == "residual" else None
    y = moeroute.combine(eo, lay, d, cfg, x=zero)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    g_out, _, _ = moeroute.combine_backward(dy, eo, lay, d, cfg)
    lhs = float((y.astype(np.float64) * dy).sum())
    rhs = float((eo.astype(np.float64) * g_out).sum())
    assert abs(lhs - rhs) <= 1e-4 * (1 + abs(lhs))


@settings.get_profile(PROFILE)
@given(configs().filter(lambda c: _valid(c)), st.data())
def test_cpu_backend_equals_the_reference_and_keeps_every_invariant(cfg, data):
    x, bias, valid, dtype = data.draw(batches(cfg))
    T, k = x.shape[0], cfg.top_k
    kind = "padded" if cfg["capacity.mode"] != "unbounded" and data.draw(st.booleans()) \
        else "compact"
    block = data.draw(st.sampled_from([1, 4])) if kind == "compact" else 1
    r = moeroute.route(x.astype(dtype), cfg, bias=bias, valid=valid, kind=kind, block_size=block)
    ref = _core.reference_route(cfg, {"logits": x, "bias": bias, "valid": valid})
    g, d = r.gated, r.dispatched
    np.testing.assert_array_equal(g.ids, ref["ids"], err_msg="ids")
    np.testing.assert_allclose(g.gates, ref["gates"], rtol=1e-5, atol=1e-7, err_msg="gates")
    # dispatch: the reference's dispatch of this gating, exactly
    want = _core.reference_dispatch(cfg, routing_of(g, valid))
    for key in ("expert", "slot", "fate"):
        np.testing.assert_array_equal(getattr(d, key), want[key], err_msg=key)
    np.testing.assert_allclose(d.weight, want["weight"], rtol=1e-6, atol=1e-7)
    if T:  # an empty batch writes nothing (docs/api.md): the package's totals are zeros
        assert list(d.totals) == want["totals"]
    check_invariants(cfg, T, d, r.laid, kind)
    if T:
        adjoint_checks(cfg, x, d, r.laid, np.random.default_rng(T))
    for name in ("aux_loss", "z_loss"):
        np.testing.assert_allclose(float(r.losses[name][0]), ref[name], rtol=1e-5, atol=1e-9)


def routing_of(g, valid):
    """The arrays of a Gated that dispatch reads, for reference_dispatch."""
    routing = {"ids": g.ids, "gates": g.gates, "valid": valid}
    for extra in ("reroute_ids", "token_priority", "second_skipped"):
        if extra in g.arrays:
            routing[extra] = g.arrays[extra]
    return routing


def _valid(cfg) -> bool:
    try:
        cfg.validate()
        return True
    except moeroute.Error:
        return False


@settings(settings.get_profile(PROFILE), max_examples=500 if LONG else 25)
@given(configs().filter(lambda c: _valid(c)), st.data())
def test_emulated_cuda_launchers_equal_the_cpu_backend(cfg, data):
    emu = pytest.importorskip("moeroute._core_emulated",
                              reason="the emulated module is built in the CMake build tree")
    from moeroute import stages

    x, bias, valid, _ = data.draw(batches(cfg))
    cpu = moeroute.route(x, cfg, bias=bias, valid=valid)
    saved = stages._core
    stages._core = emu
    try:
        dev = moeroute.route(x, emu.Config(cfg.__getstate__()), bias=bias, valid=valid)
    finally:
        stages._core = saved
    np.testing.assert_array_equal(dev.gated.ids, cpu.gated.ids)
    np.testing.assert_allclose(dev.gated.gates, cpu.gated.gates, rtol=1e-5, atol=1e-7)
    # the device's dispatch of its own gating equals the reference's of the same
    g = dev.gated
    want = _core.reference_dispatch(cfg, routing_of(g, valid))
    for key in ("expert", "slot", "fate"):
        np.testing.assert_array_equal(getattr(dev.dispatched, key), want[key], err_msg=key)
