#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Synthetic served traffic for the capacity planner: make_traffic.py OUT_DIR [options]

Writes OUT_DIR/traffic.npy, float16 (or float32) [layers, tokens, experts] router logits, and
OUT_DIR/traffic_request.npy, int32 [tokens], the request of each token. Requests of
--request-tokens tokens arrive in bursts of one kind (the next request keeps the kind with
probability --burst); each kind prefers its own experts in each layer, so arrival-order
batches are more homogeneous than shuffled ones, as in real served traffic. Written layer by
layer through a memory map, so a dump larger than RAM can be made. Deterministic for a seed.
"""
import argparse
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--kinds", type=int, default=8)
    ap.add_argument("--request-tokens", type=int, default=512)
    ap.add_argument("--burst", type=float, default=0.8)
    ap.add_argument("--skew", type=float, default=0.3, help="strength of a kind's preference")
    ap.add_argument("--popularity", type=float, default=0.1,
                    help="spread of the experts' popularity shared by every kind")
    ap.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    n_req = -(-a.tokens // a.request_tokens)
    kinds = np.empty(n_req, dtype=np.int64)
    kinds[0] = rng.integers(a.kinds)
    stay = rng.random(n_req) < a.burst
    fresh = rng.integers(a.kinds, size=n_req)
    for r in range(1, n_req):
        kinds[r] = kinds[r - 1] if stay[r] else fresh[r]
    request = (np.arange(a.tokens) // a.request_tokens).astype(np.int32)
    token_kind = kinds[request]
    np.save(os.path.join(a.out_dir, "traffic_request.npy"), request)
    out = np.lib.format.open_memmap(os.path.join(a.out_dir, "traffic.npy"), mode="w+",
                                    dtype=np.dtype(a.dtype), shape=(a.layers, a.tokens, a.experts))
    chunk = 1 << 16
    for layer in range(a.layers):
        pref = (a.skew * rng.standard_normal((a.kinds, a.experts))).astype(np.float32)
        popular = (a.popularity * rng.standard_normal(a.experts)).astype(np.float32)
        for t0 in range(0, a.tokens, chunk):
            t1 = min(t0 + chunk, a.tokens)
            x = rng.standard_normal((t1 - t0, a.experts), dtype=np.float32)
            x += pref[token_kind[t0:t1]]
            x += popular
            out[layer, t0:t1] = x
    out.flush()
    del out


if __name__ == "__main__":
    main()
