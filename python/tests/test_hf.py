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


def grads_of(m):
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def assert_patched_grads_match(make, loss_of):
    """Two fresh models from make() -> (model, *inputs), in training mode, the second patched:
    loss_of(model, *inputs).backward() in each, then the same gradients (assert_same_grads)."""
    grads = []
    for patched in (False, True):
        m, *inputs = make()
        m.train()
        if patched:
            mhf.patch(m)
        loss_of(m, *inputs).backward()
        grads.append(grads_of(m))
    assert_same_grads(grads[1], grads[0])


def assert_same_grads(got, want):
    """The same parameters have gradients (an expert with no tokens: zero where HF calls it,
    none where HF skips it), each within 1e-4 (the expert-sum order differs, see above)."""
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-6, msg=n)


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
    assert_patched_grads_match(lambda: build(family, k), lambda m, ids: m(ids, labels=ids).loss)


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


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch < 2 has no torch.compile")
def test_torch_compile_of_a_patched_model():
    # dynamo and AOTAutograd (fake tensors, functionalisation, the joint graph) without
    # inductor, whose C++ build of the model's own layers took ~55 s on two cores; inductor
    # over the custom operators is test_torch.py's and test_token_count.py's. The expert loop
    # reads the segment offsets on the host, so dynamo breaks the graph there (and logs that it
    # could not evaluate u1 > u0): the gate, the routing ops and the experts compile, the loop
    # runs between them
    grads, losses = [], []
    for compiled in (False, True):
        m, ids = build("mixtral", 2)
        m.train()
        mhf.patch(m, capacity_factor=1.0, drop_policy="residual")
        run = torch.compile(m, backend="aot_eager") if compiled else m
        loss = run(ids, labels=ids).loss + mhf.losses(m)
        loss.backward()
        losses.append(loss.detach())
        grads.append(grads_of(m))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    assert_same_grads(grads[1], grads[0])


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


def test_record_batches_streams_to_disk_with_progress(tmp_path, capsys):
    m, ids = build("mixtral", 2)
    batches = [{"input_ids": ids[:, :a]} for a in (11, 4, 7)]
    want = []
    gate = mhf.moe_blocks(m)[1][1].gate  # 5.x's returns (logits, weights, index)
    hook = gate.register_forward_hook(lambda mod, a, out: want.append(
        (out[0] if isinstance(out, tuple) else out).detach().reshape(-1, 8)))
    shape = mhf.record_batches(m, batches, str(tmp_path / "d.npy"),
                               group_ids=str(tmp_path / "g.npy"))
    hook.remove()
    assert shape == (2, 2 * (11 + 4 + 7), 8)
    dump = np.load(tmp_path / "d.npy")
    np.testing.assert_array_equal(dump[1], torch.cat(want).numpy().astype(np.float16))
    np.testing.assert_array_equal(np.load(tmp_path / "g.npy"), [0.0] * 22 + [1.0] * 8 + [2.0] * 14)
    assert "batch 3/3, 44 tokens" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".moeroute")] == []


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


# ---- families newer than transformers 4.46 (Qwen3-MoE 4.51, DeepSeek-V3 4.50, DeepSeek-V2
# 4.52): run where the installed transformers has them (build.sh's second venv, torch 2.5.1 and
# transformers 4.57.6), skipped, and counted as skipped, elsewhere
def has(name):
    return hasattr(transformers, name)


def tiny_new(family, k):
    common = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=64)
    if family == "qwen3_moe":
        c = transformers.Qwen3MoeConfig(intermediate_size=48, moe_intermediate_size=24,
                                        num_experts=8, num_experts_per_tok=k, head_dim=8,
                                        norm_topk_prob=True, **common)
        return transformers.Qwen3MoeForCausalLM(c)
    mla = dict(kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
               v_head_dim=8, intermediate_size=48, moe_intermediate_size=24, n_routed_experts=16,
               num_experts_per_tok=k, n_group=4, topk_group=2, n_shared_experts=1,
               first_k_dense_replace=0)
    if family == "deepseek_v3":
        c = transformers.DeepseekV3Config(routed_scaling_factor=2.5, norm_topk_prob=True,
                                          **mla, **common)
        m = transformers.DeepseekV3ForCausalLM(c)
        g = torch.Generator().manual_seed(3)
        for mod in m.modules():  # an aux-loss-free bias that changes the choice
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.copy_(torch.rand(16, generator=g) * 0.2)
        return m
    c = transformers.DeepseekV2Config(topk_method="group_limited_greedy",
                                      routed_scaling_factor=1.5, **mla, **common)
    return transformers.DeepseekV2ForCausalLM(c)


NEW_FAMILIES = [
    pytest.param("qwen3_moe", 4, marks=pytest.mark.skipif(
        not has("Qwen3MoeConfig"), reason="transformers < 4.51 has no Qwen3-MoE")),
    pytest.param("deepseek_v3", 4, marks=pytest.mark.skipif(
        not has("DeepseekV3Config"), reason="transformers < 4.50 has no DeepSeek-V3")),
    pytest.param("deepseek_v2", 4, marks=pytest.mark.skipif(
        not has("DeepseekV2Config"), reason="transformers < 4.52 has no DeepSeek-V2")),
]


def build_new(family, k):
    torch.manual_seed(0)
    m = tiny_new(family, k).eval()
    return m, torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family,k", NEW_FAMILIES)
def test_newer_families_patched_equal_unpatched(family, k):
    m, ids = build_new(family, k)
    want = m(ids).logits
    # the gate's own choice on each block's input, to check the routing ids exactly
    inputs = {}
    hooks = [b.register_forward_pre_hook(lambda mod, a, n=n: inputs.__setitem__(n, a[0]))
             for n, b in mhf.moe_blocks(m)]
    names = mhf.patch(m)
    assert len(names) == 2
    got = m(ids).logits
    for h in hooks:
        h.remove()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    blocks = dict(mhf.moe_blocks(m))
    for name, out in mhf.outputs(m).items():
        gate = blocks[name].gate
        x = inputs[name]
        hf = type(gate).forward(gate, x)  # the family's own gate, on the block's input
        if isinstance(hf, tuple):  # 5.x: (logits, weights, ids); DeepSeek 4.x: (ids, weights)
            hf_ids = hf[2] if len(hf) == 3 else hf[0]
        else:  # Qwen3-MoE 4.x: a Linear's logits
            hf_ids = torch.topk(torch.softmax(hf.reshape(-1, hf.shape[-1]).float(), -1), k,
                                -1).indices
        assert torch.equal(torch.sort(out.ids.long(), 1).values,
                           torch.sort(hf_ids.reshape(-1, k), 1).values), name
    assert mhf.unpatch(m) == 2
    assert torch.equal(m(ids).logits, want)


@pytest.mark.parametrize("family,k", NEW_FAMILIES)
def test_newer_families_training_gradients_match(family, k):
    assert_patched_grads_match(lambda: build_new(family, k),
                               lambda m, ids: m(ids, labels=ids).loss)


@pytest.mark.skipif(not has("DeepseekV3Config"), reason="transformers < 4.50 has no DeepSeek-V3")
def test_record_a_deepseek_gate_writes_its_logits(tmp_path):
    m, ids = build_new("deepseek_v3", 4)
    inputs = []
    blocks = mhf.moe_blocks(m)
    hook = blocks[0][1].register_forward_pre_hook(lambda mod, a: inputs.append(a[0]))
    with mhf.record(m, str(tmp_path / "dump.npy")):
        m(ids)
    hook.remove()
    dump = np.load(tmp_path / "dump.npy")
    x = inputs[0].reshape(-1, 32)
    want = torch.nn.functional.linear(x.float(), blocks[0][1].gate.weight.float())
    np.testing.assert_array_equal(dump[0], want.detach().numpy().astype(np.float16))


# ---- encoder-decoder families whose blocks hold a router module and a ModuleDict of experts
SEQ2SEQ = dict(vocab_size=97, d_model=32, max_position_embeddings=64, num_experts=8,
               encoder_sparse_step=1, decoder_sparse_step=1)


def tiny_seq2seq(family, capacity, eval_fraction=0.0):
    """A small capacity, so that both the kept and the dropped paths run: Switch's
    expert_capacity; NLLB's in training, and in eval ceil(eval_fraction * T), or
    expert_capacity with eval_fraction 0."""
    if family == "switch_transformers":
        c = transformers.SwitchTransformersConfig(
            d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
            expert_capacity=capacity, router_jitter_noise=0.0, dropout_rate=0.0,
            **{k: v for k, v in SEQ2SEQ.items() if k != "max_position_embeddings"})
        return transformers.SwitchTransformersForConditionalGeneration(c)
    c = transformers.NllbMoeConfig(
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=48, decoder_ffn_dim=48, expert_capacity=capacity, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0,
        moe_eval_capacity_token_fraction=eval_fraction, **SEQ2SEQ)
    return transformers.NllbMoeForConditionalGeneration(c)


def _no_fsdp():
    """transformers 4.46's NLLB encoder asks is_fsdp_managed_module(), which imports
    torch.distributed.fsdp: under Python 3.11 Debian's torch 1.13 fails that import (a
    dataclass error in torch itself). Nothing here runs under FSDP: answer False."""
    mod = getattr(getattr(transformers.models, "nllb_moe", None), "modeling_nllb_moe", None)
    if mod is not None and hasattr(mod, "is_fsdp_managed_module"):
        mod.is_fsdp_managed_module = lambda module: False


def build_seq2seq(family, capacity, eval_fraction=0.0, **config):
    _no_fsdp()
    torch.manual_seed(0)
    m = tiny_seq2seq(family, capacity, eval_fraction).eval()
    for k, v in config.items():
        setattr(m.config, k, v)
    g = torch.Generator().manual_seed(1)
    return m, torch.randint(0, 97, (2, 11), generator=g), torch.randint(0, 97, (2, 7), generator=g)


def router_tuples(out):
    """Every MoE layer's router tuple, encoder then decoder (dense layers' placeholders out)."""
    return [t for t in tuple(out.encoder_router_logits) + tuple(out.decoder_router_logits)
            if isinstance(t, tuple) and len(t) == 2]


# (family, capacity, NLLB's moe_eval_capacity_token_fraction); transformers 5.x rewrote both
# blocks (experts with their own forward, routers returning masks): patch() reports them there
TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5
_seq2seq_4x = pytest.mark.skipif(TRANSFORMERS_5, reason="transformers 5.x's Switch / NLLB blocks "
                                 "are reported, not routed (test_seq2seq_5x_blocks_are_reported)")
SEQ2SEQ_FAMILIES = [pytest.param(*case, marks=_seq2seq_4x) for case in
                    [("switch_transformers", 3, 0.0), ("nllb_moe", 3, 0.0), ("nllb_moe", None, 0.2)]]


@pytest.mark.skipif(not TRANSFORMERS_5, reason="transformers 4.x's Switch / NLLB blocks are routed")
@pytest.mark.parametrize("family", ["switch_transformers", "nllb_moe"])
def test_seq2seq_5x_blocks_are_reported(family):
    m, _, _ = build_seq2seq(family, 3)
    with pytest.raises(moeroute.Error, match="is transformers 5.x's"):
        mhf.patch(m)


@pytest.mark.parametrize("family,capacity,eval_fraction", SEQ2SEQ_FAMILIES)
def test_seq2seq_patched_model_equals_the_unpatched_one(family, capacity, eval_fraction):
    m, ids, dec = build_seq2seq(family, capacity, eval_fraction)
    want = m(ids, decoder_input_ids=dec, output_router_logits=True)
    names = mhf.patch(m)
    assert len(names) == 4  # 2 encoder + 2 decoder layers, every one sparse
    got = m(ids, decoder_input_ids=dec, output_router_logits=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
    g_t, w_t = router_tuples(got), router_tuples(want)
    assert len(g_t) == len(w_t) == 4
    for (g_probs, g_index), (w_probs, w_index) in zip(g_t, w_t):
        # Switch: the router logits; NLLB: the [T, E] combine weights (0 where not routed)
        torch.testing.assert_close(g_probs, w_probs, rtol=1e-5, atol=1e-6)
        assert torch.equal(g_index, w_index)
    assert torch.equal(g_t[0][0], w_t[0][0]) or family == "nllb_moe"  # the same classifier
    outs = list(mhf.outputs(m).values())
    dropped = sum(o.totals_dict()["dropped"] for o in outs)
    assert dropped > 0  # the dropped path ran (Switch: prob * x passes through)
    assert mhf.unpatch(m) == 4
    assert torch.equal(m(ids, decoder_input_ids=dec).logits, want.logits)


@pytest.mark.parametrize("family,capacity,eval_fraction", SEQ2SEQ_FAMILIES)
def test_seq2seq_training_step_gradients_match(family, capacity, eval_fraction):
    # the router losses too: transformers adds them from the router tuples patch() returns
    def make():
        m, ids, dec = build_seq2seq(family, capacity, eval_fraction, moe_token_dropout=0.0)
        for mod in m.modules():  # no random token dropout: the two runs must draw alike
            if hasattr(mod, "moe_token_dropout"):
                mod.moe_token_dropout = 0.0
        return m, ids, dec

    assert_patched_grads_match(make, lambda m, ids, dec: m(
        ids, decoder_input_ids=dec, labels=dec, output_router_logits=True).loss)


@_seq2seq_4x
def test_nllb_padding_tokens_are_routed_nowhere():
    m, ids, dec = build_seq2seq("nllb_moe", None, 1.0)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # the second sentence is 8 tokens long
    want = m(ids, attention_mask=mask, decoder_input_ids=dec, output_router_logits=True)
    mhf.patch(m)
    got = m(ids, attention_mask=mask, decoder_input_ids=dec, output_router_logits=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
    encoder_out = list(mhf.outputs(m).values())[0]
    assert (encoder_out.fate.view(2, 11, 2)[1, 8:] == 3).all()  # masked
    assert encoder_out.totals_dict()["masked"] == 3 * 2


def test_unknown_blocks_are_reported():
    class MixtralSparseMoeBlock(torch.nn.Module):  # transformers 5.x: experts fused in one module
        def __init__(self):
            super().__init__()
            self.gate = torch.nn.Linear(4, 8)
            self.experts = torch.nn.Linear(4, 4)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = MixtralSparseMoeBlock()
            self.config = {"model_type": "mixtral", "num_local_experts": 8,
                           "num_experts_per_tok": 2}

    with pytest.raises(moeroute.Error, match="moe .MixtralSparseMoeBlock. keeps its experts fused"):
        mhf.patch(Model())
    with pytest.raises(moeroute.Error, match="has no sparse MoE block"):
        mhf.patch(torch.nn.Linear(2, 2), moeroute.Config.preset("mixtral", 8, 2))
