#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""moeroute's CPU backend against the PyTorch baseline of Megatron-Core's router, same logits,
same machine, same run: writes N(0, 1) logits [T, E] (and a Zipf-skewed batch, so capacity
drops), times `moeroute-capacity --preset megatron --backend cpu` and torch_router_baseline.py on
each, checks that both keep the same number of assignments, and prints the ratio.

  bench/compare_torch.py BUILD_DIR [--tokens 16384 --experts 64 --top-k 2 --factor 1.25]
Exit 0 with the table; 77 when python3-torch is missing (a skip, not a pass).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def moeroute_row(tool, npy, a, threads):
    out = subprocess.run(
        [tool, "--npy", npy, "--preset", "megatron", "--top-k", str(a.top_k),
         "--factors", str(a.factor), "--backend", "cpu", "--check", "--threads", str(threads),
         "--repeat", str(a.repeat), "--format", "json", "-q"],
        check=True, capture_output=True, text=True).stdout
    row = json.loads(out)["rows"][0]
    return row["cpu_us"] / 1e3, row["gating_us"] / 1e3, row["kept"]


def torch_row(npy, a, threads):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "torch_router_baseline.py"), "--npy", npy,
         "--top-k", str(a.top_k), "--capacity-factor", str(a.factor), "--threads", str(threads),
         "--repeat", str(a.repeat)], capture_output=True, text=True)
    if out.returncode == 77:
        print(out.stderr.strip(), file=sys.stderr)
        sys.exit(77)
    out.check_returncode()
    r = json.loads(out.stdout)
    return r["ms_min"], r["kept"], r["torch"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", help="the CMake build directory (with tools/capacity/moeroute-capacity)")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--factor", type=float, default=1.25)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    tool = os.path.join(a.build, "tools", "capacity", "moeroute-capacity")
    rng = np.random.default_rng(7)
    batches = {
        "uniform": rng.standard_normal((a.tokens, a.experts), dtype=np.float32),
        # Zipf-skewed expert popularity: a few hot experts, so the capacity drops tokens
        "zipf": (rng.standard_normal((a.tokens, a.experts), dtype=np.float32)
                 + np.log(1.0 / np.arange(1, a.experts + 1) ** 1.2).astype(np.float32)),
    }
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, x in batches.items():
            npy = os.path.join(tmp, name + ".npy")
            np.save(npy, x)
            for threads in (1, 2):
                ms, gating_ms, kept = moeroute_row(tool, npy, a, threads)
                tms, tkept, version = torch_row(npy, a, threads)
                results.append({"batch": name, "threads": threads, "moeroute_ms": ms,
                                "moeroute_gating_ms": gating_ms, "torch_ms": tms,
                                "speedup": tms / ms, "kept": kept, "torch_kept": tkept,
                                "torch": version})
    print(f"T={a.tokens} E={a.experts} k={a.top_k} capacity factor {a.factor}, Megatron-Core "
          f"routing (top-k, softmax over k, drop by probability, aux + z-loss); best of "
          f"{a.repeat}")
    print(f"{'batch':>8} {'threads':>7} {'moeroute ms':>12} {'(gating)':>9} {'torch ms':>9} "
          f"{'speed-up':>9} {'kept':>7} {'torch kept':>10}")
    same = True
    for r in results:
        print(f"{r['batch']:>8} {r['threads']:>7} {r['moeroute_ms']:>12.3f} "
              f"{r['moeroute_gating_ms']:>9.3f} {r['torch_ms']:>9.3f} {r['speedup']:>8.1f}x "
              f"{r['kept']:>7} {r['torch_kept']:>10}")
        same = same and r["kept"] == r["torch_kept"]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    if not same:
        print("MISMATCH: moeroute and the torch baseline keep different numbers of assignments",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
