# SPDX-License-Identifier: Apache-2.0
"""moeroute.Config: fields by name, presets, validation messages, pickling."""

import pickle

import pytest

import moeroute
from moeroute import Config, Error


def test_preset_by_name_and_fields():
    c = Config.preset("mixtral")
    assert (c.num_experts, c.top_k) == (8, 2)
    assert c["gating.stage"] == "after_topk"
    assert c["capacity.mode"] == "unbounded"
    c = Config.preset("deepseek_v3", 256, 8)
    assert c["gating.score"] == "sigmoid" and c["gating.expert_bias"] is True
    assert c["gating.group_limit.groups"] == 8 and c["gating.scaling_factor"] == 2.5
    names = [p["name"] for p in moeroute.presets()]
    assert "megatron" in names and "qwen_moe" in names and len(names) == len(set(names))


def test_preset_errors_name_the_problem():
    with pytest.raises(Error, match="preset 'nope' is unknown .*megatron"):
        Config.preset("nope")
    with pytest.raises(Error, match="top-2 only, not top-3"):
        Config.preset("deepspeed_top2", 8, 3)


def test_set_and_get_typed_values():
    c = Config.preset("megatron", 16, 2)
    c["capacity.mode"] = "factor"
    c["capacity.factor"] = 1.1
    c["gating.expert_bias"] = True
    c["top_k"] = 4
    assert c["capacity.factor"] == 1.1 and isinstance(c["capacity.factor"], float)
    assert c["gating.expert_bias"] is True and c["top_k"] == 4 and c.top_k == 4
    c.validate()
    with pytest.raises(Error, match="'capacity.nope': not a routing_config field"):
        c["capacity.nope"] = 1
    with pytest.raises(Error, match="dispatch.dropped = 'sideways': must be one of"):
        c["dispatch.dropped"] = "sideways"
    with pytest.raises(KeyError):
        c["no.such.field"]


def test_validate_names_the_field():
    c = Config("num_experts=4 top_k=5")
    with pytest.raises(Error, match="top_k"):
        c.validate()
    with pytest.raises(Error, match="not a name=value assignment"):
        Config("top_k")


def test_pickle_equality_and_text_round_trip():
    c = Config.megatron(64, 8, score="sigmoid", capacity_factor=1.25, groups=8, group_topk=4,
                        expert_bias=True)
    d = pickle.loads(pickle.dumps(c))
    assert d == c and str(d) == str(c)
    assert Config(str(c)) == c
    e = c.copy()
    e["capacity.factor"] = 2.0
    assert e != c and c["capacity.factor"] == 1.25


def test_preset_functions_take_their_options():
    q = Config.qwen_moe(64, 8, norm_topk_prob=False)
    assert q["gating.renorm"] == "none"
    assert Config.qwen_moe(64, 8)["gating.renorm"] == "before_drop"
    n = Config.nllb_moe(16, expert_capacity=5, batch_prioritized_routing=True)
    assert n["capacity.mode"] == "fixed" and n["capacity.fixed"] == 5
    assert n["dispatch.prio"] == "batch_prioritized"
    s = Config.switch_transformers(8, expert_capacity=4, row_tokens=16)
    assert s["capacity.group_tokens"] == 16 and s["loss.sequence_length"] == 16
    with pytest.raises(Error, match="score 'tanh'"):
        Config.megatron(8, 2, score="tanh")


def test_size_queries():
    c = Config.deepspeed_top2(8, capacity_factor=1.0, min_capacity=4)
    # DeepSpeed: C = max(ceil(T / E * factor * k), min_capacity)
    assert c.capacity(64) == 16 and c.capacity(4) == 4
    assert c.max_rows(64) == 8 * 16
    assert c.max_rows(64, "compact", 16) >= 64 * 2
    with pytest.raises(Error, match="tokens"):
        c.capacity(-1)
    seq = Config.preset("megatron", 8, 2).with_sequence_aux(32, "megatron")
    assert seq["loss.sequence_length"] == 32 and seq["loss.sequence_order"] == "position_major"
    with pytest.raises(Error, match="peer 'x'"):
        c.with_sequence_aux(4, "x")
