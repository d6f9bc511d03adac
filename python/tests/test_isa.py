# SPDX-License-Identifier: Apache-2.0
"""The extension's vector-level builds (moeroute/_extension.py): the package loads the highest
level that the CPU runs and the package has; MOEROUTE_ISA pins a level and refuses ones that are
unknown, missing or beyond the CPU; and every level routes as the baseline build does — ids,
slots, counts and the logit gradient bit for bit, gates within the exp's bound — on batches
that reach the vector paths (rows of 8 to 256 experts, groups, sigmoid, padding, a NaN row,
batch sizes off the 16-token blocks)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import moeroute
from moeroute import _extension

try:
    from moeroute import _cpu
except ImportError:  # a MOEROUTE_PYTHON_NATIVE build: _core alone
    _cpu = None

HOST = _cpu.host_isa() if _cpu else "baseline"
BUILT = [lv for lv in _extension.LEVELS if _extension._have(lv)]
RUNNABLE = [lv for lv in BUILT if _extension.LEVELS.index(lv) <= _extension.LEVELS.index(HOST)]

# Each subprocess routes the same batches under one level and saves every output.
SCRIPT = r"""
import sys
import numpy as np
import moeroute

out = {"isa": np.array(moeroute.isa)}
cases = [("megatron", 64, 2, 1000), ("mixtral", 8, 2, 37), ("qwen2_moe", 128, 8, 301),
         ("deepseek_v3", 256, 8, 129), ("switch_transformers", 128, 1, 1), ("olmoe", 64, 8, 517)]
for name, E, k, T in cases:
    cfg = moeroute.Config.preset(name, E, k)
    rng = np.random.default_rng(E * 1000 + T)
    logits = (rng.standard_normal((T, E)) * 2).astype(np.float32)
    logits[T // 2] = np.nan if T > 2 else logits[T // 2]
    valid = np.ones(T, dtype=bool)
    valid[T // 3] = False
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32) if name == "deepseek_v3" else None
    r = moeroute.route(logits, cfg, bias=bias, valid=valid)
    for group, arrays in (("g", r.gated.arrays), ("d", r.dispatched.arrays),
                          ("l", r.laid.arrays), ("s", r.losses)):
        for key, value in arrays.items():
            if value is not None:
                out[f"{name}/{group}/{key}"] = np.asarray(value)
    gw = rng.standard_normal(r.gated.ids.shape).astype(np.float32)
    out[f"{name}/grad"] = moeroute.gating_backward(logits, r.gated, r.dispatched, cfg,
                                                   grad_weight=gw, valid=valid)
np.savez(sys.argv[1], **out)
"""


def _run(level, tmp_path, expect_ok=True):
    env = dict(os.environ)
    if level is None:
        env.pop("MOEROUTE_ISA", None)
    else:
        env["MOEROUTE_ISA"] = level
    path = tmp_path / f"{level or 'auto'}.npz"
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, capture_output=True,
                       text=True)
    if not expect_ok:
        return p
    assert p.returncode == 0, p.stderr
    return dict(np.load(path))


def test_the_default_is_the_highest_level_built_and_runnable():
    assert "baseline" in BUILT
    assert moeroute.isa == RUNNABLE[-1] or (len(BUILT) == 1 and moeroute.isa == HOST)
    assert moeroute._core.isa == moeroute.isa
    assert moeroute.Config.__module__ == "moeroute"


@pytest.mark.skipif(len(BUILT) < 2, reason="a build without the ISA modules (native)")
def test_every_level_routes_as_the_baseline(tmp_path):
    results = {lv: _run(lv, tmp_path) for lv in RUNNABLE}
    auto = _run(None, tmp_path)
    assert str(auto["isa"]) == RUNNABLE[-1]
    base = results["baseline"]
    assert str(base["isa"]) == "baseline"
    for level, got in list(results.items()) + [("auto", auto)]:
        if level != "auto":
            assert str(got["isa"]) == level
        assert set(got) == set(base), level
        for key in base:
            if key == "isa":
                continue
            a, b = base[key], got[key]
            assert a.dtype == b.dtype and a.shape == b.shape, (level, key)
            if a.dtype.kind != "f" or key.endswith("/grad"):
                # ids, slots, counts, fates, layouts and the logit gradient (its own double
                # arithmetic, numerics.md) are the same bytes on every level
                assert a.tobytes() == b.tobytes(), (level, key)
            else:
                # gates, probabilities and their sums go through the float exp, whose last bit
                # depends on FMA (AVX2 / AVX-512) and on AVX-512's own sigmoid: within the
                # bounds of numerics.md (2-3 ulp), NaN where the baseline has NaN
                np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-9, err_msg=f"{level} {key}")
    # the batches reach real work: gradients and kept assignments are not all zero
    assert np.count_nonzero(base["qwen2_moe/grad"]) > 1000
    assert np.count_nonzero(base["deepseek_v3/d/weight"]) > 500


def test_moeroute_isa_refuses_unknown_missing_and_unrunnable_levels(tmp_path):
    p = _run("sse9", tmp_path, expect_ok=False)
    assert p.returncode != 0 and "MOEROUTE_ISA='sse9': expected one of baseline, avx2, avx512" in p.stderr
    beyond = [lv for lv in _extension.LEVELS if lv not in RUNNABLE]
    for level in beyond:
        p = _run(level, tmp_path, expect_ok=False)
        assert p.returncode != 0, level
        assert f"MOEROUTE_ISA={level}:" in p.stderr
