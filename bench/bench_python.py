#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python package against PyTorch, measured in one run on the CPU, one thread:

- routing: moeroute.torch.route (Megatron-Core semantics, capacity factor 1.25, aux and
  z-loss) against bench/torch_router_baseline.py's torch-ops router on the same logits,
  forward, and forward + backward of (weight * upstream).sum() + aux + z;
- permute and combine (bf16) against the torch ops an unfused MoE layer uses (index_select,
  weighted index_add_), each with the bandwidth it moves (its output allocated per call, as
  the API does) and a copy of the same bytes into a reused buffer as the memcpy baseline;
- the fixed cost of one call from Python (T = 1).

    PYTHONPATH=build/release/python python3 bench/bench_python.py [--tokens 16384] [--json F]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_python_decode as decode  # noqa: E402
import torch_router_baseline as baseline  # noqa: E402

import moeroute  # noqa: E402
import moeroute.torch as mt  # noqa: E402


def timed(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    T, E, k, d = a.tokens, a.experts, a.top_k, a.hidden
    cfg = moeroute.Config.megatron(E, k, capacity_factor=1.25)
    cfg["loss.aux_coefficient"] = 1e-2
    cfg["loss.z_coefficient"] = 1e-3
    text = str(cfg)
    logits = torch.randn(T, E)
    up = torch.randn(T, k)
    rows = {}

    def ours_fwd():
        return mt.route(logits, text)

    def torch_fwd():
        return baseline.route(logits, k, 1.25)

    rows["route forward"] = (timed(ours_fwd, a.reps), timed(torch_fwd, a.reps))
    lg = logits.clone().requires_grad_(True)

    def ours_train():
        lg.grad = None
        out = mt.route(lg, text)
        ((out.weight * up).sum() + out.aux_loss + out.z_loss).backward()

    def torch_train():
        lg.grad = None
        probs, _, aux, z = baseline.route(lg, k, 1.25)
        top = torch.topk(lg.detach(), k, dim=1).indices
        ((probs.gather(1, top) * up).sum() + aux + z).backward()

    rows["route forward+backward"] = (timed(ours_train, a.reps), timed(torch_train, a.reps))

    out = mt.route(logits, text)
    x = torch.randn(T, d).bfloat16()
    rows_used = int(out.num_rows[0])
    perm_bytes = 2 * rows_used * d * 2  # read + write of the rows in use, bf16
    assign = out.assignment_row.reshape(-1)
    keep = assign >= 0
    src_tok = torch.arange(T).repeat_interleave(k)[keep]
    dst_row = assign[keep]

    def ours_permute():
        return mt.permute(x, out)

    def torch_permute():
        buf = torch.zeros(out.row_token.shape[0], d, dtype=x.dtype)
        buf[dst_row] = x.index_select(0, src_tok)
        return buf

    buf = ours_permute()
    w = out.weight.reshape(-1)[keep].to(torch.bfloat16)

    def ours_combine():
        return mt.combine(buf, out)

    def torch_combine():
        y = torch.zeros(T, d, dtype=x.dtype)
        y.index_add_(0, src_tok, buf.index_select(0, dst_row) * w[:, None])
        return y

    # memcpy baseline: the same bytes copied into a buffer allocated once (moeroute's calls
    # below allocate their outputs, as a user's call does; that cost is in their numbers)
    src = torch.empty(perm_bytes // 4, dtype=torch.bfloat16).fill_(1)
    dst = torch.empty_like(src).fill_(0)
    memcpy = timed(lambda: dst.copy_(src), a.reps)
    rows["permute bf16"] = (timed(ours_permute, a.reps), timed(torch_permute, a.reps))
    rows["combine bf16"] = (timed(ours_combine, a.reps), timed(torch_combine, a.reps))
    # the stage itself: moeroute.permute into a buffer reused across calls (out=), against
    # torch's index_select into a reused buffer (index_select(out=))
    laid = moeroute.Laid({"row_token": out.row_token, "num_rows": out.num_rows,
                          "assignment_row": out.assignment_row}, "padded", 1,
                         int(out.row_token.shape[0]))
    reuse = torch.zeros_like(buf)
    gathered = torch.empty(src_tok.shape[0], d, dtype=x.dtype)
    rows["permute bf16, reused out*"] = (
        timed(lambda: moeroute.permute(x, laid, cfg, out=reuse, threads=1), a.reps),
        timed(lambda: torch.index_select(x, 0, src_tok, out=gathered), a.reps))
    # the same through moeroute.torch (inference, out=): permute and combine into buffers
    # reused across calls, against torch's ops writing reused buffers
    y_reuse = torch.empty(T, d, dtype=x.dtype)

    def torch_combine_reused():
        y_reuse.zero_()
        y_reuse.index_add_(0, src_tok, buf.index_select(0, dst_row) * w[:, None])
        return y_reuse

    with torch.no_grad():
        rows["torch.permute out=*"] = (
            timed(lambda: mt.permute(x, out, out=reuse), a.reps),
            timed(lambda: torch.index_select(x, 0, src_tok, out=gathered), a.reps))
        rows["torch.combine out="] = (timed(lambda: mt.combine(buf, out, out=y_reuse), a.reps),
                                      timed(torch_combine_reused, a.reps))
    one = torch.randn(1, E)
    # (loops of calls timed together, as bench_python_decode.py times every decode call: 200
    # calls each timed alone after the large rows above gave a 134 us median here, 57 us so)
    with torch.no_grad():
        call_us = decode.best_us(lambda: mt.route(one, text), 1000)

    gbps = lambda ms: perm_bytes / (ms * 1e-3) / 1e9  # noqa: E731
    print(f"T={T} E={E} k={k} d={d}, Megatron semantics, capacity factor 1.25, one thread "
          f"(torch {torch.__version__}, moeroute.torch custom_ops={mt.custom_ops})")
    print(f"{'':24} {'moeroute ms':>12} {'torch ms':>9} {'ratio':>6}")
    result = {"tokens": T, "experts": E, "top_k": k, "hidden": d, "rows": {}}
    for name, ((ours, ours_min), (theirs, theirs_min)) in rows.items():
        print(f"{name:24} {ours:12.3f} {theirs:9.3f} {theirs / ours:5.1f}x")
        result["rows"][name] = {"moeroute_ms": ours, "torch_ms": theirs,
                                "ratio": theirs / ours}
    print(f"memcpy (copy_ into a reused buffer) of the permuted bytes: {memcpy[0]:.3f} ms = {gbps(memcpy[0]):.1f} GB/s;"
          f" permute {gbps(rows['permute bf16'][0][0]):.1f} GB/s "
          f"({100 * memcpy[0] / rows['permute bf16'][0][0]:.0f} % of memcpy), combine "
          f"{gbps(rows['combine bf16'][0][0]):.1f} GB/s "
          f"({100 * memcpy[0] / rows['combine bf16'][0][0]:.0f} % of memcpy), permute into a "
          f"reused buffer {gbps(rows['permute bf16, reused out*'][0][0]):.1f} GB/s "
          f"({100 * memcpy[0] / rows['permute bf16, reused out*'][0][0]:.0f} % of memcpy)")
    print("* torch's row: index_select of the kept rows into a dense [kept, d] buffer; "
          "moeroute's: the padded [E * C, d] layout, padding rows written as zeros")
    print(f"one route call from Python at T = 1: {call_us:.1f} us")
    result.update(memcpy_gbps=gbps(memcpy[0]), call_overhead_us=call_us)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
