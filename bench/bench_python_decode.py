#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A decode step's calls from Python on the CPU (T = 1, no grad, one thread): the fixed cost
of each call, which a serving loop pays per layer. Megatron (64, 2) routing with capacity
factor 1.25 (the padded layout) and the aux and z losses, as bench_python.py routes; d = 2048;
us per call, the best of 5 runs of --calls calls. `route out=` writes the previous step's
RouterOutput again (a decode loop's layer keeps its own), the rest make their outputs.
`torch router` is the same routing in torch ops (bench/torch_router_baseline.py's `route`,
Megatron-Core's unfused router), timed the same way in the same run.

    PYTHONPATH=build/release/python python3 bench/bench_python_decode.py [--calls 3000]

To compare two builds of the package, run it with each one's PYTHONPATH in turn (an older
commit's module built in a git worktree), alternating, a few rounds: this VM's neighbours
move single runs by 30 % and more.
"""

import argparse
import json
import os
import sys
import time

import torch

import moeroute
import moeroute.torch as mt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_router_baseline import route as torch_route  # noqa: E402


def best_us(fn, calls):
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(1)
    E, k, d = 64, 2, 2048
    cfg = moeroute.Config.megatron(E, k, capacity_factor=1.25)  # bench_python.py's routing
    cfg["loss.aux_coefficient"] = 1e-2
    cfg["loss.z_coefficient"] = 1e-3
    text = str(cfg)
    logits = torch.randn(1, E)
    logits_np = logits.numpy()
    h = torch.randn(1, d)
    hb = h.bfloat16()
    with torch.no_grad():
        r = mt.route(logits, text)
        eo, eob = mt.permute(h, r), mt.permute(hb, r)
        rows = {
            "moeroute.route (numpy)": lambda: moeroute.route(logits_np, cfg),
            "moeroute.torch.route": lambda: mt.route(logits, text),
            "moeroute.torch.route out=": lambda: mt.route(logits, text, out=r),
            "permute float32": lambda: mt.permute(h, r),
            "permute bf16": lambda: mt.permute(hb, r),
            "combine float32": lambda: mt.combine(eo, r),
            "combine bf16": lambda: mt.combine(eob, r),
            "torch router (same routing)": lambda: torch_route(logits, k, 1.25),
        }
        result = {name: best_us(fn, a.calls) for name, fn in rows.items()}
    print(f"moeroute {moeroute.__version__} ({moeroute.isa}), torch {torch.__version__}, "
          f"T = 1, E = {E}, k = {k}, d = {d}")
    for name, us in result.items():
        print(f"{name:28} {us:7.1f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
