# SPDX-License-Identifier: Apache-2.0
"""moeroute.plan on real served traffic (tests/data/real-router): the README's published
numbers, the same result as the moeroute-capacity CLI on the same dump, numpy statistics of
the per-batch drop rate, and hostile arguments."""

import json
import os
import subprocess

import numpy as np
import pytest

import moeroute
from moeroute import Config, Error
from conftest import DATA

REAL = DATA / "real-router"


@pytest.fixture(scope="module")
def traffic():
    path = REAL / "traffic.npy"
    if not path.exists():
        pytest.skip(f"{path} missing")
    return np.load(path)


@pytest.fixture(scope="module")
def planned(traffic):
    return moeroute.plan(traffic, "mixtral", batch_tokens=2048, factors=[1.0, 1.25, 2.0, "dropless"],
                         policies=["zero_weight"], target_drop=0.02, quantile=0.9)


def test_published_worst_batches(planned):
    # tests/data/real-router/README.md: worst batch at factor 1.25 in arrival order
    worst = [c["drop_rate"]["max"] for c in planned["cells"] if c["factor"] == "1.25"]
    assert [round(100 * w, 1) for w in worst] == [17.1, 17.2, 15.3, 22.0]
    assert planned["batches"] == 16 and planned["tokens_left_out"] == 0


def test_drop_rates_against_numpy(traffic, planned):
    L, N, E = traffic.shape
    for layer in range(L):
        x = traffic[layer].astype(np.float32)
        top2 = np.argsort(-x, axis=1, kind="stable")[:, :2]
        for cf in (1.0, 1.25, 2.0):
            C = int(np.ceil(cf * 2048 * 2 / E))  # Mixtral rules at a factor: ceil(f T k / E)
            rates = []
            for b in range(16):
                counts = np.bincount(top2[b * 2048:(b + 1) * 2048].ravel(), minlength=E)
                rates.append(np.maximum(counts - C, 0).sum() / (2048 * 2))
            cell = [c for c in planned["cells"] if c["layer"] == layer and c["factor"] == f"{cf:g}"]
            assert len(cell) == 1 and cell[0]["capacity"] == C
            assert cell[0]["drop_rate"]["max"] == pytest.approx(max(rates), abs=1e-12)
            assert cell[0]["drop_rate"]["mean"] == pytest.approx(np.mean(rates), abs=1e-12)


def test_same_result_as_the_cli(traffic, planned, tmp_path):
    tool = os.environ.get("MOEROUTE_CAPACITY_TOOL")
    if not tool or not os.path.exists(tool):
        pytest.skip("moeroute-capacity not built (MOEROUTE_CAPACITY_TOOL)")
    res = subprocess.run([tool, "--npy", str(REAL / "traffic.npy"), "--batch-tokens", "2048",
                          "--preset", "mixtral", "--factors", "1.0,1.25,2.0,dropless",
                          "--policies", "zero_weight", "--format", "json", "--target-drop",
                          "0.02", "--quantile", "0.9", "--quiet"],
                         capture_output=True, text=True, check=True)
    cli = json.loads(res.stdout)
    assert len(cli["cells"]) == len(planned["cells"])
    for a, b in zip(cli["cells"], planned["cells"]):
        assert (a["layer"], a["factor"], a["capacity"]) == (b["layer"], b["factor"], b["capacity"])
        for key in ("mean", "p50", "p95", "p99", "max"):
            assert a["drop_rate"][key] == b["drop_rate"][key]
    for a, b in zip(cli["recommendations"], planned["recommendations"]):
        assert a["factor"] == pytest.approx(b["factor"], abs=1e-12)
        assert a["capacity"] == b["capacity"]


def test_recommendation_meets_the_target(planned):
    model = planned["recommendations"][-1]
    assert model["layer"] is None and model["met"]
    assert model["overflow_quantile"] <= 0.02
    assert model["dropless_bytes"] > 0


def test_shuffled_and_grouped(traffic):
    req = np.load(REAL / "traffic_request.npy")
    kw = dict(batch_tokens=2048, factors=[1.25], policies=["zero_weight"])
    a = moeroute.plan(traffic, "mixtral", batching="shuffled", seed=7, **kw)
    b = moeroute.plan(traffic, "mixtral", batching="shuffled", seed=7, **kw)
    assert a["cells"] == b["cells"]
    g = moeroute.plan(traffic, "mixtral", batching="grouped", group_ids=req, **kw)
    assert len(g["cells"]) == traffic.shape[0]


def test_torch_input_and_frames(traffic):
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(traffic[:1, :4096].astype(np.float32))
    r = moeroute.plan(t, Config.mixtral(traffic.shape[2], 2), batch_tokens=1024,
                      factors=[1.0, "dropless"], expert_ranks=[e % 2 for e in range(traffic.shape[2])])
    assert len(r["cells"][0]["rank_drop_rate"]) == 2
    pd = pytest.importorskip("pandas")
    cells, recs, experts = moeroute.plan_frames(r)
    assert isinstance(cells, pd.DataFrame) and "drop_rate_p99" in cells.columns
    assert len(recs) == 2 and "gini" in experts.columns


def test_hostile_arguments(traffic):
    x = traffic[0, :512]
    with pytest.raises(Error, match=r"batch_tokens = 1000: must be in \[1, 512\]"):
        moeroute.plan(x, "mixtral", batch_tokens=1000)
    with pytest.raises(Error, match="factors: 'x' is not a capacity factor"):
        moeroute.plan(x, "mixtral", batch_tokens=64, factors=["x"])
    with pytest.raises(Error, match=r"factors: -1.0 is not in \(0, 1e6\]"):
        moeroute.plan(x, "mixtral", batch_tokens=64, factors=[-1.0])
    with pytest.raises(Error, match="priorities: unknown value 'best'"):
        moeroute.plan(x, "mixtral", batch_tokens=64, priorities=["best"])
    with pytest.raises(Error, match="batching: 'random' is not one of"):
        moeroute.plan(x, "mixtral", batch_tokens=64, batching="random")
    with pytest.raises(Error, match="group_ids: required here"):
        moeroute.plan(x, "mixtral", batch_tokens=64, batching="grouped")
    with pytest.raises(Error, match="bias: the config routes without an expert bias"):
        moeroute.plan(x, "mixtral", batch_tokens=64, bias=np.zeros(16, np.float32))
    with pytest.raises(Error, match="target_drop: must be in"):
        moeroute.plan(x, "mixtral", batch_tokens=64, target_drop=2.0)
    with pytest.raises(Error, match="logits have 16 experts, the config 8"):
        moeroute.plan(x, Config.mixtral(8, 2), batch_tokens=64)
    with pytest.raises(Error, match="logits: dtype float64"):
        moeroute.plan(x.astype(np.float64), "mixtral", batch_tokens=64)
    with pytest.raises(Error, match="expert_ranks: 3 entries"):
        moeroute.plan(x, "mixtral", batch_tokens=64, expert_ranks=[0, 1, 0])
