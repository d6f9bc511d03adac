#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Capacity planning on a router-logit dump from Python: which capacity factor keeps the
per-batch drop rate under a target, and what it costs in buffer memory.

    python3 plan_dump.py traffic.npy --preset mixtral --batch-tokens 2048

The dump is [layers, N, E] or [N, E] float32 / float16 (numpy.save of the router logits you
served or trained on, in arrival order). Loaded memory-mapped; see docs/capacity-tuning.md."""

import argparse

import numpy as np

import moeroute


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("npy")
    p.add_argument("--preset", default="mixtral")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--target-drop", type=float, default=0.01)
    p.add_argument("--quantile", type=float, default=0.99)
    p.add_argument("--batching", default="consecutive", choices=["consecutive", "shuffled"])
    args = p.parse_args()

    logits = np.load(args.npy, mmap_mode="r")
    res = moeroute.plan(np.ascontiguousarray(logits), args.preset, top_k=args.top_k,
                        batch_tokens=args.batch_tokens, batching=args.batching,
                        factors=[1.0, 1.25, 1.5, 2.0, "dropless"],
                        target_drop=args.target_drop, quantile=args.quantile)
    print(f"{res['batches']} batches of {res['batch_tokens']} tokens "
          f"({res['tokens_left_out']} left out)")
    print(f"{'layer':>5} {'factor':>8} {'C':>6} {'drop mean':>10} {'p99':>8} {'max':>8}")
    for c in res["cells"]:
        d = c["drop_rate"]
        print(f"{c['layer']:>5} {c['factor']:>8} {c['capacity']:>6} {100 * d['mean']:>9.2f}% "
              f"{100 * d['p99']:>7.2f}% {100 * d['max']:>7.2f}%")
    model = res["recommendations"][-1]
    q = f"p{round(100 * args.quantile)}"
    print(f"\nsmallest factor with {q} of per-batch drops <= {100 * args.target_drop:g} %: "
          f"{model['factor']:.2f} (C = {model['capacity']}): padded expert buffers of "
          f"{model['buffer_bytes'] / 2**20:.1f} MiB over all layers, against "
          f"{model['dropless_bytes'] / 2**20:.1f} MiB for dropless routing's worst batch "
          "(hidden 4096, bf16)")
    try:
        cells, _, _ = moeroute.plan_frames(res)
        print(f"\n(pandas: {len(cells)} rows, columns {', '.join(cells.columns[:6])}, ...)")
    except ImportError:
        pass


if __name__ == "__main__":
    main()
