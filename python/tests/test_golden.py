# SPDX-License-Identifier: Apache-2.0
"""The peers' own outputs through the Python API: HuggingFace transformers' MoE routers
(tests/data/golden-hf, 284 cases) and DeepSpeed's, Megatron-Core's and the seed's routing
(tests/data/golden, 416 cases) through moeroute.route, and Megatron-Core's / DeepSpeed's
gradients (tests/data/golden-grad) through moeroute.torch's autograd. The rules of
comparison are the READMEs' of those folders, as the C++ golden tests apply them."""

import json

import numpy as np
import pytest

import moeroute
from moeroute import Config
from conftest import DATA

torch = pytest.importorskip("torch")
import moeroute.torch as mt  # noqa: E402

HF_DIR = DATA / "golden-hf"
GRAD_DIR = DATA / "golden-grad"


def load(folder):
    files = sorted(folder.glob("*.json"))
    if not files:
        pytest.skip(f"no golden files in {folder}")
    return [(f.name, json.loads(f.read_text())) for f in files]


def hf_config(cs, T, E):
    """The family's preset with the case's options (tests/common/golden.hpp, hf_preset_for)."""
    fam, sem = cs["family"], cs["semantics"]
    k = sem["k"]
    norm = sem.get("norm_topk_prob", False)
    if fam == "mixtral":
        c = Config.mixtral(E, k)
    elif fam in ("qwen2_moe", "qwen3_moe"):
        c = Config.qwen_moe(E, k, norm_topk_prob=norm)
    elif fam == "olmoe":
        assert not norm
        c = Config.olmoe(E, k)
    elif fam == "deepseek_v3":
        c = Config.deepseek_v3(E, k, sem["n_group"], sem["topk_group"])
        assert c["gating.group_limit.top_n"] == sem["group_score_topn"]
        if not norm:
            c["gating.renorm"] = "none"
        c["gating.scaling_factor"] = float(np.float32(sem["routed_scaling_factor"]))
    elif fam == "switch":
        assert sem["groups"] * sem["group_size"] == T
        c = Config.switch_transformers(E, sem["expert_capacity"], sem["group_size"])
    elif fam == "nllb_moe":
        assert sem["second_expert_policy"] == "all"
        c = Config.nllb_moe(
            E, expert_capacity=sem.get("expert_capacity"),
            batch_prioritized_routing=sem["batch_prioritized_routing"],
            normalize_router_prob_before_dropping=sem["normalize_router_prob_before_dropping"],
            training=sem["training"],
            moe_eval_capacity_token_fraction=sem["moe_eval_capacity_token_fraction"])
    else:
        raise AssertionError(f"unknown family {fam}")
    assert c.top_k == k
    c["loss.aux_coefficient"] = 1.0
    c["loss.z_coefficient"] = 1.0
    return c


def close(got, want, rel, abs_):
    return abs(got - want) <= max(rel * abs(want), abs_)


def cases_of(folder):
    """Every case of every file in `folder`, as (doc, case) parameters named file/case."""
    return [pytest.param(doc, cs, id=f"{fname[:-5]}/{cs['name']}")
            for fname, doc in load(folder) for cs in doc["cases"]]


@pytest.mark.parametrize("doc,cs", cases_of(HF_DIR))
def test_hf_router(doc, cs):
    T, E = doc["tokens"], doc["experts"]
    logits = np.asarray(doc["logits"], dtype=np.float32)
    cfg = hf_config(cs, T, E)
    bias = np.asarray(cs["expert_bias"], np.float32) if "expert_bias" in cs else None
    mask = None
    if "attention_mask" in cs:
        mask = np.asarray(cs["attention_mask"]) != 0
    elif "padding_mask" in cs:
        mask = np.asarray(cs["padding_mask"]) == 0
    routing_mask = mask if cs["family"] == "nllb_moe" else None
    r = moeroute.route(logits, cfg, bias=bias, valid=routing_mask)
    ex = cs["expected"]
    ids, gates = np.asarray(r.gated.ids), np.asarray(r.gated.gates)
    fate, weight = np.asarray(r.dispatched.fate), np.asarray(r.dispatched.weight)
    k = cfg.top_k
    for t in range(T):
        if ex["ids"][t] is None:
            continue
        assert sorted(ex["ids"][t]) == sorted(ids[t].tolist()), f"token {t}: ids"
        if "weights" in ex:
            for e, w in zip(ex["ids"][t], ex["weights"][t]):
                j = ids[t].tolist().index(e)
                assert close(gates[t, j], w, 1e-6, 1e-7), f"token {t} expert {e}: weight"
    if "kept" in ex:
        for t in range(T):
            want = sorted((kw[0], kw[1]) for kw in ex["kept"][t])
            got = sorted((int(ids[t, j]), float(weight[t, j])) for j in range(k) if fate[t, j] == 0)
            assert [e for e, _ in got] == [e for e, _ in want], f"token {t}: kept"
            for (_, a), (_, b) in zip(got, want):
                assert close(a, b, 1e-6, 1e-7), f"token {t}: kept weight"
    if "top1_kept" in ex:
        got = [int(ids[t, 0]) if fate[t, 0] == 0 else -1 for t in range(T)]
        assert got == ex["top1_kept"]
    if ex.get("capacity") is not None:
        assert r.dispatched.totals_dict()["capacity"] == ex["capacity"]
    if "aux_loss" in ex:
        name = "sequence_aux_loss" if cs["family"] == "switch" else "aux_loss"
        assert close(float(r.losses[name][0]), ex["aux_loss"], 1e-5, 0.0)
    if "aux_loss_masked" in ex:
        g = moeroute.gating(logits, cfg, bias=bias, valid=mask)
        assert close(float(moeroute.losses(g, cfg)["aux_loss"][0]), ex["aux_loss_masked"], 1e-5,
                     0.0)
    if "z_loss" in ex:
        assert close(float(r.losses["z_loss"][0]), ex["z_loss"], 1e-5, 0.0)


def test_hf_case_count():
    n = sum(len(doc["cases"]) for _, doc in load(HF_DIR))
    assert n == 284  # the public set (README): none goes missing


def peer_config(cs, E):
    """The peer's preset with the knobs a user passes (tests/common/golden.hpp, preset_for)."""
    sem = cs["semantics"]
    cap = sem.get("capacity")
    if "DeepSpeed" in cs["source"]:
        if sem.get("priority") == "choice_major":
            c = Config.deepspeed_top2(E, cap["factor"], cap["min_capacity"])
        else:
            c = Config.deepspeed_topk(E, sem["k"], cap["factor"], cap["min_capacity"])
    elif "seed" in cs["source"]:
        c = Config.preset("seed_reference", E, sem["k"])
        c["capacity.factor"] = cap["factor"] if cap else 1.0
    else:
        g = sem.get("group_limited")
        c = Config.megatron(
            E, sem["k"], score=sem["score"],
            pre_softmax=sem["score"] == "softmax" and sem["select_from"] == "probs",
            capacity_factor=cap["factor"] if cap else None,
            groups=g["groups"] if g else 0, group_topk=g["group_topk"] if g else 0,
            scaling_factor=sem.get("scaling_factor") or 1.0,
            expert_bias=sem.get("expert_bias") is not None)
    c["loss.aux_coefficient"] = 1.0
    c["loss.z_coefficient"] = 1.0
    return c


def assert_grad(got, want, what):
    want = np.asarray(want, np.float64)
    tol = np.maximum(1e-5 * np.abs(want), 1e-7)
    bad = np.abs(got.numpy().astype(np.float64) - want) > tol
    assert not bad.any(), f"{what}: {int(bad.sum())} elements differ, first at " \
                          f"{np.argwhere(bad)[0].tolist()}"


@pytest.mark.parametrize("doc,cs", cases_of(DATA / "golden"))
def test_peer_routing(doc, cs):
    """DeepSpeed's, Megatron-Core's and the seed's routing decisions (tests/data/golden, the
    rules of tests/golden/golden_test.cpp): capacity, losses, counts and every kept set."""
    T, E = doc["tokens"], doc["experts"]
    cfg = peer_config(cs, E)
    sem, ex = cs["semantics"], cs["expected"]
    bias = None if sem.get("expert_bias") is None else np.asarray(sem["expert_bias"], np.float32)
    logits = np.asarray(doc["logits"], dtype=np.float32)
    r = moeroute.route(logits, cfg, bias=bias)
    g, d = r.gated, r.dispatched
    k = cfg.top_k
    cap = d.totals_dict()["capacity"]
    assert cap == (ex["capacity"] if ex.get("capacity") is not None else -1)
    for name in ("aux_loss", "z_loss"):
        if name in ex:
            assert close(float(r.losses[name][0]), ex[name], 1e-5, 0.0), name
    if "requested_per_expert" in ex:
        # Megatron counts a fresh top-k on the unbiased scores: our aux counts
        ours = g.aux_count if "Megatron" in cs["source"] else d.requested
        assert ours.tolist() == ex["requested_per_expert"]
    ids, gates, fate = g.ids, g.gates, d.fate
    assert not (fate == 1).any()  # no reroutes in these routings
    assert "kept" in ex or "topk_idx" in ex
    if "kept" in ex:
        ours_kept = fate == 0
        peer_kept = np.zeros_like(ours_kept)
        for t in range(T):
            for w in ex["kept"][t]:
                peer_kept[t, ids[t].tolist().index(w[0])] = True
        if not (ours_kept == peer_kept).all():
            # only an exact tie at an expert's cut-off, decided by torch.topk's order (score
            # priority): each expert keeps the same number of assignments with the same gates
            assert cfg["dispatch.prio"] == "score_per_expert"
            for e in range(E):
                assert sorted(gates[(ids == e) & ours_kept]) == \
                    sorted(gates[(ids == e) & peer_kept]), f"expert {e}: beyond a tie"
        for t in range(T):
            for w in ex["kept"][t]:
                j = ids[t].tolist().index(w[0])
                if not ours_kept[t, j]:
                    continue  # a tie the peer decided the other way
                if len(w) == 3:
                    assert d.slot[t, j] == w[1], f"token {t}: slot"
                assert close(d.weight[t, j], w[-1], 1e-6, 0.0), f"token {t}: weight"
    if "topk_idx" in ex:
        assert ids.tolist() == ex["topk_idx"]
        np.testing.assert_allclose(gates, np.asarray(ex["topk_gate"]), rtol=1e-6)
        assert d.kept.tolist() == ex["kept_per_expert"]
        assert (fate == 0).any(axis=1).tolist() == ex["token_dispatched"]


def test_peer_case_counts():
    assert sum(len(doc["cases"]) for _, doc in load(DATA / "golden")) == 416
    assert sum(len(doc["cases"]) for _, doc in load(GRAD_DIR)) >= 40


@pytest.mark.parametrize("doc,cs", cases_of(GRAD_DIR))
def test_peer_gradients_through_autograd(doc, cs):
    T, E = doc["tokens"], doc["experts"]
    cfg = peer_config(cs, E)
    sem = cs["semantics"]
    bias = None if sem.get("expert_bias") is None else torch.tensor(sem["expert_bias"])
    logits = torch.tensor(doc["logits"], dtype=torch.float32, requires_grad=True)
    out = mt.route(logits, cfg, bias=bias)
    ex = cs["expected"]
    deepspeed = "DeepSpeed" in cs["source"]
    k = cfg.top_k
    upstream = torch.zeros(T, k)
    peer_kept = np.zeros((T, k), bool)
    for t in range(T):
        for entry in ex["upstream"][t]:
            j = out.ids[t].tolist().index(entry[0])
            if deepspeed:
                assert int(out.slot[t, j]) == entry[1]
            peer_kept[t, j] = True
            upstream[t, j] = entry[2 if deepspeed else 1]
    ours_kept = out.fate.numpy() == 0
    (out.weight * upstream).sum().backward(retain_graph=True)
    if (ours_kept == peer_kept).all():
        assert_grad(logits.grad, ex["d_logits_routing"], "d_logits_routing")
    else:
        # only where torch.topk broke an exact tie of the priority key another way: each
        # expert keeps as many assignments with the same gates (golden_grad_test.cpp)
        assert not deepspeed
        gates = out.gates.numpy()
        ids = out.ids.numpy()
        for e in range(E):
            assert sorted(gates[(ids == e) & ours_kept]) == sorted(gates[(ids == e) & peer_kept])
    logits.grad = None
    out.aux_loss.backward(retain_graph=True)
    assert_grad(logits.grad, ex["d_logits_aux"], "d_logits_aux")
    if "d_logits_z" in ex:
        logits.grad = None
        out.z_loss.backward()
        assert_grad(logits.grad, ex["d_logits_z"], "d_logits_z")


def hf_attributes(cs, T, E):
    """The case's semantics as the transformers config attributes they came from."""
    fam, sem = cs["family"], cs["semantics"]
    kind = "switch_transformers" if fam == "switch" else fam
    a = {"model_type": kind, "num_experts_per_tok": sem["k"]}
    a["num_local_experts" if fam == "mixtral" else
      "n_routed_experts" if fam == "deepseek_v3" else "num_experts"] = E
    a.update({k: v for k, v in sem.items() if k not in ("k", "class", "training")})
    return a


@pytest.mark.parametrize("doc,cs", cases_of(HF_DIR))
def test_config_from_hf_is_the_golden_mapping(doc, cs):
    """Config.from_hf on the transformers attributes of every HF golden case gives the config
    test_hf_router checks against transformers' own routing (the switch row length and the
    drop policy of transformers 5.x, which made these files, included)."""
    T, E = doc["tokens"], doc["experts"]
    sem = cs["semantics"]
    row = sem.get("group_size", 0)
    got = Config.from_hf(hf_attributes(cs, T, E), training=sem.get("training", True),
                         row_tokens=row)
    want = hf_config(cs, T, E)
    for c in (got, want):
        c["loss.aux_coefficient"] = 1.0
        c["loss.z_coefficient"] = 1.0
    if cs["family"] == "switch":
        assert got["dispatch.dropped"] == "zero_weight"  # transformers 5.x
        got["dispatch.dropped"] = want["dispatch.dropped"]
    assert got == want, f"{got}\n!=\n{want}"


def test_config_from_hf_reads_what_presets_by_name_cannot():
    ds = Config.from_hf({"model_type": "deepseek_v3", "n_routed_experts": 16,
                         "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
                         "norm_topk_prob": True, "routed_scaling_factor": 2.5})
    assert (ds["gating.group_limit.groups"], ds["gating.group_limit.group_topk"]) == (4, 2)
    assert Config.preset("deepseek_v3", 16, 4)["gating.group_limit.groups"] == 8
    q = Config.from_hf({"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4,
                        "norm_topk_prob": False, "router_aux_loss_coef": 0.001})
    assert q["gating.renorm"] == "none" and q["loss.aux_coefficient"] == pytest.approx(0.001)
    sw4 = Config.from_hf({"model_type": "switch_transformers", "num_experts": 8,
                          "expert_capacity": 64, "transformers_version": "4.46.3"})
    assert sw4["dispatch.dropped"] == "residual"
    with pytest.raises(moeroute.Error, match="model_type 'llama' has no moeroute routing"):
        Config.from_hf({"model_type": "llama"})
