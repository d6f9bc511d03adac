# SPDX-License-Identifier: Apache-2.0
"""moeroute.torch: the autograd operations against torch.autograd.gradcheck (float64 inputs,
computed in float32 by the library, so finite differences use eps 1e-3), against a routing
written with plain torch ops whose gradient autograd derives, and the Router module."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import moeroute  # noqa: E402
import moeroute.torch as mt  # noqa: E402
from moeroute import Config, Error, _core  # noqa: E402
from conftest import logits_grid  # noqa: E402

GRADCHECK = dict(eps=1e-3, atol=2e-4, rtol=2e-3)


def separated_logits(T, E, seed):
    """Logits whose top-k choices and fresh top-k counts stay put under a 1e-3 perturbation
    (gaps of at least 0.05 between any two logits of a token)."""
    rng = np.random.default_rng(seed)
    x = np.stack([rng.permutation(E) for _ in range(T)]).astype(np.float64) * 0.15
    return torch.tensor(x + rng.uniform(-0.02, 0.02, (T, E)), dtype=torch.float64,
                        requires_grad=True)


# Positional priorities (DeepSpeed's choice-major) keep the kept set fixed under a small
# perturbation, so drops are gradient-checked there; score priority (Megatron) may swap two
# near-equal gates at a full expert, so it is checked with room to spare.
@pytest.mark.parametrize("cfg", [
    Config.mixtral(8, 2),
    Config.megatron(8, 2, capacity_factor=2.0),
    Config.megatron(8, 3, score="sigmoid", capacity_factor=1.25),
    Config.deepspeed_top2(8, 1.0, 2),
    Config.qwen_moe(8, 4, norm_topk_prob=False),
], ids=["mixtral", "megatron_cf2", "megatron_sigmoid", "deepspeed_top2", "qwen2"])
def test_route_gradcheck(cfg):
    logits = separated_logits(24, 8, seed=cfg.top_k)
    assert torch.autograd.gradcheck(lambda x: mt.route(x, cfg).weight, (logits,), **GRADCHECK)
    assert torch.autograd.gradcheck(lambda x: mt.route(x, cfg).aux_loss, (logits,), **GRADCHECK)
    assert torch.autograd.gradcheck(lambda x: mt.route(x, cfg).z_loss, (logits,), **GRADCHECK)


def test_sequence_aux_gradcheck():
    cfg = Config.deepseek_v3(8, 2, 0, 0).with_sequence_aux(6, "deepseek")
    cfg["loss.aux_coefficient"] = 1.0
    logits = separated_logits(24, 8, seed=4)
    bias = torch.zeros(8)
    assert torch.autograd.gradcheck(
        lambda x: mt.route(x, cfg, bias=bias).sequence_aux_loss, (logits,), **GRADCHECK)


@pytest.mark.parametrize("policy", ["zero_weight", "residual"])
def test_permute_combine_gradcheck(policy):
    cfg = Config.deepspeed_top2(8, 0.75, 2)
    cfg["dispatch.dropped"] = policy
    logits = separated_logits(24, 8, seed=1)
    out = mt.route(logits, cfg)
    assert out.totals_dict()["dropped"] > 0
    x = torch.randn(24, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: mt.permute(h, out), (x,), **GRADCHECK)
    eo = torch.randn(int(out.row_token.shape[0]), 5, dtype=torch.float64, requires_grad=True)
    w = out.weight.detach().double().requires_grad_(True)
    routing = out._replace(weight=w)
    assert torch.autograd.gradcheck(lambda e, ww, h: mt.combine(e, routing._replace(weight=ww),
                                                                x=h),
                                    (eo, w, x), **GRADCHECK)


def test_gradient_matches_a_plain_torch_routing():
    """Mixtral's router written with torch ops (softmax, topk, renormalise; the HF aux loss):
    autograd's gradient of a loss through it equals the library's backward."""
    cfg = Config.mixtral(8, 2)
    cfg["loss.aux_coefficient"] = 0.1
    cfg["loss.z_coefficient"] = 0.01
    torch.manual_seed(2)
    logits = torch.randn(64, 8, requires_grad=True)  # no ties: torch.topk's order is free there
    up = torch.randn(64, 2)

    out = mt.route(logits, cfg)
    loss = (out.weight * up).sum() + out.aux_loss + out.z_loss
    loss.backward()
    ours = logits.grad.clone()

    logits.grad = None
    p = torch.softmax(logits, -1)
    top, ids = torch.topk(logits, 2, dim=-1)
    assert torch.equal(ids.int(), out.ids.long().int())
    w = torch.softmax(top, -1)
    f = torch.zeros(8).index_add_(0, ids.reshape(-1), torch.ones(128)) / 64
    aux = 8 * (f * p.mean(0)).sum()  # HF load_balancing_loss_func over the top-k mask
    z = torch.logsumexp(logits, -1).pow(2).mean()
    ref = (w * up).sum() + 0.1 * aux + 0.01 * z
    assert float(ref) == pytest.approx(float(loss), rel=1e-5)
    ref.backward()
    torch.testing.assert_close(ours, logits.grad, rtol=1e-5, atol=1e-6)


def test_outputs_match_the_numpy_stages():
    cfg = Config.megatron(16, 4, capacity_factor=1.0)
    x = logits_grid(128, 16, seed=3)
    out = mt.route(torch.from_numpy(x), cfg)
    ref = _core.reference_route(cfg, {"logits": x})
    np.testing.assert_array_equal(out.ids.numpy(), ref["ids"])
    np.testing.assert_array_equal(out.slot.numpy(), ref["slot"])
    np.testing.assert_array_equal(out.fate.numpy(), ref["fate"])
    np.testing.assert_array_equal(out.requested.numpy(), ref["requested"])
    np.testing.assert_allclose(out.weight.numpy(), ref["weight"], rtol=2e-6, atol=1e-7)
    assert float(out.aux_loss) == pytest.approx(ref["aux_loss"], rel=1e-6)


def test_bf16_and_batched_shapes():
    cfg = Config.mixtral(8, 2)
    h = torch.randn(2, 10, 8).bfloat16()
    out = mt.route(h, cfg)
    assert out.weight.shape == (20, 2) and out.aux_loss.dtype == torch.float32
    x = torch.randn(2, 10, 6, dtype=torch.bfloat16, requires_grad=True)
    buf = mt.permute(x, out)
    y = mt.combine(buf, out, x=x)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16


def test_router_module_learns_to_balance():
    """A collapsed router (every token prefers expert 0) trained on the aux loss alone: the
    aux loss falls and the drop rate with it."""
    torch.manual_seed(0)
    router = mt.Router(16, "deepspeed_top2", num_experts=8, top_k=2, capacity_factor=1.0,
                       aux_loss_coeff=1.0)
    with torch.no_grad():
        router.weight.zero_()
        router.weight[0, 0] = 4.0
    opt = torch.optim.SGD(router.parameters(), lr=2.0)
    x = torch.randn(256, 16)
    x[:, 0] = 1.0
    first = None
    for _ in range(30):
        out = router(x)
        if first is None:
            first = (float(out.aux_loss), out.totals_dict()["dropped"])
        opt.zero_grad()
        out.aux_loss.backward()
        opt.step()
    last = (float(out.aux_loss), out.totals_dict()["dropped"])
    assert last[0] < first[0] and last[1] < first[1]


def test_router_expert_bias_update():
    router = mt.Router(8, "deepseek_v3", num_experts=8, top_k=2)
    with torch.no_grad():
        router.weight.zero_()
        router.weight[0, 0] = 5.0
    x = torch.ones(64, 8)
    out = router(x, micro_batch=0)
    router(x, micro_batch=0)  # the recomputed forward of activation checkpointing
    assert int(out.requested[0]) == 64 and int(router.load_since_update[0]) == 64
    router(x, micro_batch=1)
    assert int(router.load_since_update[0]) == 128
    router.update_expert_bias()
    assert router.expert_bias[0] < 0 and int(router.load_since_update.sum()) == 0
    router(x, micro_batch=0)  # a new step: micro-batch 0 counts again
    assert int(router.load_since_update[0]) == 64


def test_router_errors():
    with pytest.raises(Error, match="capacity.factor|drop"):
        mt.Router(8, "megatron", num_experts=8, top_k=2, capacity_factor=-1.0)
    with pytest.raises(Error, match="update_expert_bias"):
        mt.Router(8, "mixtral").update_expert_bias()


@pytest.mark.skipif(not mt.custom_ops, reason="torch.library.custom_op needs torch >= 2.4 "
                    f"(installed: {torch.__version__})")
def test_custom_ops_under_torch_compile():
    cfg = Config.deepspeed_top2(8, 1.0, 2)
    cfg["dispatch.dropped"] = "residual"
    text = str(cfg)  # a Config object is not a constant to dynamo; its text is
    logits = torch.randn(32, 8, requires_grad=True)
    x = torch.randn(32, 4, requires_grad=True)

    def step(lg, h):
        out = mt.route(lg, text)
        y = mt.combine(mt.permute(h, out) * 2.0, out, x=h)
        return y.square().sum() + out.aux_loss + out.z_loss

    eager = step(logits, x)
    eager.backward()
    grads = (logits.grad.clone(), x.grad.clone())
    logits.grad = x.grad = None
    compiled = torch.compile(step, fullgraph=True)(logits, x)
    compiled.backward()
    torch.testing.assert_close(eager, compiled)
    torch.testing.assert_close(grads[0], logits.grad)
    torch.testing.assert_close(grads[1], x.grad)
    router = mt.Router(8, "mixtral", num_experts=8, top_k=2)
    h = torch.randn(16, 8)
    torch.testing.assert_close(torch.compile(router, fullgraph=True)(h).weight, router(h).weight)
    torch.library.opcheck(torch.ops.moeroute.permute.default,
                          (torch.randn(4, 3), torch.tensor([0, 1, -1, 2, 3], dtype=torch.int32),
                           torch.tensor([4]), torch.tensor([[0, -1]] * 4), cfg.__getstate__()))


@pytest.mark.skipif(not (torch.cuda.is_available() and _core.cuda),
                    reason="no CUDA device, or moeroute built without CUDA")
def test_cuda_matches_cpu():
    cfg = Config.megatron(64, 8, capacity_factor=1.0)
    x = torch.from_numpy(logits_grid(1024, 64, seed=1))
    cpu = mt.route(x, cfg)
    gpu = mt.route(x.cuda(), cfg)
    for a, b in zip(cpu[:-1], gpu[:-1]):
        if a.dtype.is_floating_point:
            torch.testing.assert_close(a, b.cpu(), rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(a, b.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inference_calls_equal_recorded_calls(dtype):
    # an eager call that records no graph runs the implementation directly (no custom
    # operator, no autograd.Function): every output equals the recorded call's, bit for bit
    cfg = Config.megatron(8, 2, capacity_factor=1.0)
    cfg["loss.aux_coefficient"] = 1e-2
    cfg["loss.z_coefficient"] = 1e-3
    cfg["dispatch.dropped"] = "residual"
    logits = torch.from_numpy(logits_grid(40, 8, seed=5))
    x = torch.randn(40, 16).to(dtype)
    with torch.no_grad():
        a = mt.route(logits, cfg)
        pa = mt.permute(x, a)
        ca = mt.combine(pa * 2, a, x=x)
    b = mt.route(logits.clone().requires_grad_(), cfg)
    xb = x.clone().requires_grad_()
    pb = mt.permute(xb, b)
    cb = mt.combine(pb * 2, b, x=xb)
    assert pb.requires_grad and cb.requires_grad  # (the recorded path)
    for name in mt.RouterOutput._fields:
        got, want = getattr(a, name), getattr(b, name)
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and torch.equal(got, want.detach()), name
        else:
            assert got == want, name
    assert pa.dtype == dtype and torch.equal(pa, pb.detach())
    assert ca.dtype == dtype and torch.equal(ca, cb.detach())


def test_permute_and_combine_into_reused_buffers():
    # inference: out= writes the caller's buffers (no allocation), the same values as a fresh
    # call; with autograd on, out= is refused, naming the op
    cfg = Config.megatron(8, 2, capacity_factor=1.0)
    out = mt.route(torch.from_numpy(logits_grid(40, 8, seed=3)), cfg)
    x = torch.randn(40, 16, dtype=torch.bfloat16)
    buf = torch.zeros(out.row_token.shape[0], 16, dtype=torch.bfloat16)
    y = torch.empty(40, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):  # reused
            got = mt.permute(x, out, out=buf)
            assert got.data_ptr() == buf.data_ptr()
            assert torch.equal(buf, mt.permute(x, out))
            yy = mt.combine(buf * 2, out, x=x, out=y)
            assert yy.data_ptr() == y.data_ptr()
            assert torch.equal(y, mt.combine(buf * 2, out, x=x))
    xg = x.float().requires_grad_()
    with pytest.raises(moeroute.Error, match="permute: out= writes without autograd"):
        mt.permute(xg, out, out=torch.zeros(out.row_token.shape[0], 16))
