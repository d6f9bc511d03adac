# SPDX-License-Identifier: Apache-2.0
"""moeroute.hf on real transformers models built from their configs (tiny, random-init, seeded,
no downloads): the patched model equals the unpatched one (block outputs and the model's logits
within 1e-5 relative: the k > 2 expert outputs are added in slot order, HF adds them in expert
order), the routing ids exactly, the gradients of a training step within 1e-4; the recorded dump
equals the router logits HF returns; training with a capacity factor and residual drops runs and
counts its drops. Needs transformers (build.sh test installs 4.46.3 into build/hf-venv; skipped
elsewhere)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import moeroute  # noqa: E402
import moeroute.hf as mhf  # noqa: E402

COMMON = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)


def tiny(family, k=2):
    if family == "mixtral":
        c = transformers.MixtralConfig(intermediate_size=48, num_local_experts=8,
                                       num_experts_per_tok=k, **COMMON)
        return transformers.MixtralForCausalLM(c)
    if family == "qwen2_moe":
        c = transformers.Qwen2MoeConfig(intermediate_size=48, moe_intermediate_size=24,
                                        shared_expert_intermediate_size=40, num_experts=8,
                                        num_experts_per_tok=k, norm_topk_prob=False, **COMMON)
        return transformers.Qwen2MoeForCausalLM(c)
    c = transformers.OlmoeConfig(intermediate_size=24, num_experts=8, num_experts_per_tok=k,
                                 **COMMON)
    return transformers.OlmoeForCausalLM(c)


FAMILIES = [("mixtral", 2), ("qwen2_moe", 4), ("olmoe", 4)]


def build(family, k):
    torch.manual_seed(0)
    m = tiny(family, k).eval()
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    return m, ids


@pytest.mark.parametrize("family,k", FAMILIES)
def test_patched_model_equals_the_unpatched_one(family, k):
    m, ids = build(family, k)
    want = m(ids, output_router_logits=True)
    names = mhf.patch(m)
    assert len(names) == 2
    got = m(ids, output_router_logits=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
    # the first layer's gate sees the same input; later layers' inputs differ in rounding
    assert torch.equal(got.router_logits[0], want.router_logits[0])
    for a, b in zip(got.router_logits, want.router_logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the routing of the logits each block saw: HF's rule (softmax, top-k), exactly
    for (name, out), logits in zip(mhf.outputs(m).items(), got.router_logits):
        probs = torch.softmax(logits.float(), dim=-1)
        hf_ids = torch.topk(probs, k, dim=-1).indices
        assert torch.equal(torch.sort(out.ids.long(), 1).values, torch.sort(hf_ids, 1).values), name
    assert mhf.unpatch(m) == 2
    again = m(ids)
    assert torch.equal(again.logits, want.logits)


@pytest.mark.parametrize("family,k", FAMILIES)
def test_training_step_gradients_match(family, k):
    grads = []
    for patched in (False, True):
        m, ids = build(family, k)
        m.train()
        if patched:
            mhf.patch(m)
        out = m(ids, labels=ids)
        out.loss.backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-6, msg=n)


def test_train_with_capacity_and_residual_drops():
    m, ids = build("mixtral", 2)
    m.train()
    mhf.patch(m, capacity_factor=0.5, drop_policy="residual", aux_loss_coeff=0.01)
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        out = m(ids, labels=ids)
        loss = out.loss + mhf.losses(m)
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
    dropped = sum(o.totals_dict()["dropped"] for o in mhf.outputs(m).values())
    assert dropped > 0  # capacity 0.5 drops half the assignments or so
    assert all(o.totals_dict()["capacity"] == 3 for o in mhf.outputs(m).values())  # 0.5*22*2/8


def test_record_writes_the_router_logits_hf_returns(tmp_path):
    m, ids = build("qwen2_moe", 4)
    path, groups = tmp_path / "dump.npy", tmp_path / "groups.npy"
    with mhf.record(m, str(path), group_ids=str(groups)):
        a = m(ids, output_router_logits=True).router_logits
        b = m(ids[:1, :5], output_router_logits=True).router_logits
    dump = np.load(path)
    assert dump.shape == (2, 22 + 5, 8) and dump.dtype == np.float16
    for layer in range(2):
        want = torch.cat([a[layer], b[layer]]).detach().float().numpy().astype(np.float16)
        np.testing.assert_array_equal(dump[layer], want)
    np.testing.assert_array_equal(np.load(groups), [0.0] * 22 + [1.0] * 5)


def test_replay_through_a_patched_model():
    m, ids = build("mixtral", 2)
    mhf.patch(m)
    m(ids)
    own = [o.ids for o in mhf.outputs(m).values()]
    base = m(ids).logits
    mhf.replay(m, own)
    assert torch.equal(m(ids).logits, base)  # its own choice: the identity
    forced = [torch.zeros_like(o) - 1 for o in own]
    for f in forced:
        f[:, 0] = 7  # every token's first slot on expert 7
    mhf.replay(m, forced)
    m(ids)
    assert all((o.ids[:, 0] == 7).all() for o in mhf.outputs(m).values())


def test_unknown_blocks_are_reported():
    class NllbMoeSparseMLP(torch.nn.Module):
        pass

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = NllbMoeSparseMLP()
            self.config = {"model_type": "mixtral", "num_local_experts": 8,
                           "num_experts_per_tok": 2}

    with pytest.raises(moeroute.Error, match="not routed by moeroute yet: moe"):
        mhf.patch(Model())
    with pytest.raises(moeroute.Error, match="has no sparse MoE block"):
        mhf.patch(torch.nn.Linear(2, 2), moeroute.Config.preset("mixtral", 8, 2))
