# SPDX-License-Identifier: Apache-2.0
"""The stages from several Python threads at once (docs/api.md "Concurrency"): each stage
releases the GIL while it runs, so threads that share one Config — even while another thread
assigns its fields — must get the results a single thread gets, bit for bit. Run in every
ctest, and under ThreadSanitizer by tests/tsan.sh (the module built with -fsanitize=thread
and loaded with LD_PRELOAD=libtsan), which makes a race these runs survive a failure."""

import threading

import numpy as np
import pytest

import moeroute
from moeroute import Config
from conftest import logits_grid

THREADS = 4
ROUNDS = 3


def step(config, seed, threads):
    """One training step's stages on numpy arrays; every output, as bytes."""
    T, E, D = 48 + seed % 17, config.num_experts, 8
    logits = logits_grid(T, E, seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, D)).astype(np.float32)
    dy = rng.standard_normal((T, D)).astype(np.float32)
    bias = (rng.standard_normal(E).astype(np.float32) * 0.1
            if config["gating.expert_bias"] else None)
    r = moeroute.route(logits, config, bias=bias, threads=threads)
    buf = moeroute.permute(x, r.laid, config, threads=threads)
    out = buf * 1.5
    y = moeroute.combine(out, r.laid, r.dispatched, config, x=x, threads=threads)
    d_out, d_w, d_x = moeroute.combine_backward(dy, out, r.laid, r.dispatched, config,
                                                threads=threads)
    d_x = moeroute.permute_backward(d_out * 1.5, r.laid, config, out=d_x, threads=threads)
    d_logits = moeroute.gating_backward(logits, r.gated, r.dispatched, config,
                                        grad_weight=d_w, threads=threads)
    parts = [r.gated.ids, r.gated.gates, r.dispatched.expert, r.dispatched.slot,
             r.dispatched.weight, r.laid.assignment_row, y, d_x, d_logits,
             r.losses["aux_loss"], r.losses["z_loss"]]
    return b"".join(np.ascontiguousarray(p).tobytes() for p in parts)


def configs():
    return [Config.deepspeed_top2(16, 1.0, 4),
            Config.deepseek_v3(16, 4, 4, 2),
            Config.megatron(16, 2, capacity_factor=1.25)]


def run_threads(work):
    """work(i) in THREADS threads at once; the exceptions they raised."""
    errors = []

    def body(i):
        try:
            work(i)
        except Exception as e:  # noqa: BLE001 - reported on the main thread
            errors.append(e)

    ts = [threading.Thread(target=body, args=(i,)) for i in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_share_configs_and_match_one_thread(threads):
    cfgs = configs()
    want = {(c, s): step(cfg, s, 1) for c, cfg in enumerate(cfgs) for s in range(THREADS)}
    got = {}

    def work(i):
        for _ in range(ROUNDS):
            for c, cfg in enumerate(cfgs):
                for j in range(THREADS):
                    s = (i + j) % THREADS
                    got[(i, c, s)] = step(cfg, s, threads)

    assert run_threads(work) == []
    assert len(got) == THREADS * len(cfgs) * THREADS
    for (i, c, s), v in got.items():
        assert v == want[(c, s)], f"thread {i}, config {c}, seed {s}"


def test_a_config_assigned_while_other_threads_route():
    # A stage works on the config as it was when called: assigning a field of the shared
    # Config (to the value it already has, so every result stays the one-thread result) while
    # the stages run in other threads without the GIL must not race with them.
    cfg = Config.deepspeed_top2(16, 1.0, 4)
    want = [step(cfg, s, 1) for s in range(THREADS)]
    stop = threading.Event()
    assigned = [0]

    def assign():
        while not stop.is_set():
            cfg["loss.z_coefficient"] = cfg["loss.z_coefficient"]
            cfg["capacity.factor"] = 1.0
            assigned[0] += 1

    writer = threading.Thread(target=assign)
    writer.start()
    got = {}

    def work(i):
        for j in range(2 * THREADS):
            s = (i + j) % THREADS
            got[(i, j)] = step(cfg, s, 1)

    try:
        errors = run_threads(work)
    finally:
        stop.set()
        writer.join()
    assert errors == []
    assert assigned[0] > 0
    for (i, j), v in got.items():
        assert v == want[(i + j) % THREADS], f"thread {i}, step {j}"


def test_agreement_and_plan_from_several_threads():
    cfg = Config.mixtral(8, 2)
    a = np.stack([logits_grid(256, 8, 1), logits_grid(256, 8, 2)])
    b = a + np.float32(1.0 / 16.0) * (np.arange(8, dtype=np.float32) % 3 == 0)
    want_agree = moeroute.agreement(a, b, cfg)
    want_plan = moeroute.plan(a, "mixtral", batch_tokens=64)
    got = []

    def work(i):
        got.append((moeroute.agreement(a, b, cfg, threads=1 + i % 2),
                    moeroute.plan(a, "mixtral", batch_tokens=64, threads=1 + i % 2)))

    assert run_threads(work) == []
    assert len(got) == THREADS
    for agree, plan in got:
        assert agree == want_agree
        assert plan["recommendations"] == want_plan["recommendations"]
