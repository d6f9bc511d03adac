#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The PyTorch baseline of the CPU backend benchmark: Megatron-Core's router semantics written
with the torch ops Megatron's unfused path uses (top-k over the logits, softmax over the k,
capacity by a top-C over each expert's column of probabilities, the Switch aux loss with a fresh
top-k over the full softmax, and the ST-MoE z-loss), run on the CPU and timed.

Same routing as `moeroute-capacity --preset megatron --top-k K --factors F` (capacity factor F,
drop policy "probs"), so the two timings compare one routing call each. Prints one JSON line:
  {"tokens": T, "experts": E, "top_k": K, "threads": N, "ms": <median>, "ms_min": ..., ...}

  bench/torch_router_baseline.py --npy logits.npy --top-k 2 --capacity-factor 1.25 --threads 1
  bench/torch_router_baseline.py --tokens 16384 --experts 64 --top-k 2   # random N(0,1) logits
Needs python3-torch (Debian) and numpy.
"""
import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

try:
    import torch
except ImportError:  # the caller (bench/compare_torch.sh) reports this as a skip
    print("torch_router_baseline.py: python3-torch is not installed", file=sys.stderr)
    sys.exit(77)


def route(logits, top_k, capacity_factor, aux_coeff=1e-2, z_coeff=1e-3):
    """One routing call: probs and map after dropping, the aux loss and the z-loss."""
    tokens, experts = logits.shape
    # z-loss on the raw logits
    z_loss = torch.square(torch.logsumexp(logits, dim=-1)).mean() * z_coeff
    # top-k over the logits, softmax over the chosen k (use_pre_softmax = False)
    top_logits, top_indices = torch.topk(logits, k=top_k, dim=1)
    probs = torch.softmax(top_logits, dim=-1, dtype=torch.float32)
    routing_probs = torch.zeros_like(logits).scatter(1, top_indices, probs)
    routing_map = torch.zeros_like(logits).int().scatter(1, top_indices, 1).bool()
    # capacity: each expert keeps its C most probable assignments (drop policy "probs")
    capacity = math.ceil(tokens * top_k / experts * capacity_factor)
    capacity = min(capacity, tokens)
    _, keep = torch.topk(routing_probs, k=capacity, dim=0, sorted=False)
    capacity_mask = torch.zeros_like(routing_probs).scatter(0, keep, 1).bool()
    final_map = torch.logical_and(routing_map, capacity_mask)
    final_probs = routing_probs * final_map
    # aux loss: full softmax, a fresh top-k for the counts
    scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    _, aux_top = torch.topk(scores, k=top_k, dim=1)
    aux_map = torch.zeros_like(logits).int().scatter(1, aux_top, 1).bool()
    tokens_per_expert = aux_map.sum(dim=0)
    aux_loss = torch.sum(scores.sum(dim=0) * tokens_per_expert) * (
        experts * aux_coeff / (top_k * tokens * tokens))
    return final_probs, final_map, aux_loss, z_loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--npy", help="[T, E] float32 logits (np.save); else random N(0, 1)")
    ap.add_argument("--layer", type=int, default=0, help="with a [L, T, E] file: this layer")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--capacity-factor", type=float, default=1.25)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    if a.npy:
        x = np.load(a.npy, mmap_mode="r")
        if x.ndim == 3:
            x = x[a.layer]
        logits = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    else:
        g = torch.Generator().manual_seed(1)
        logits = torch.randn(a.tokens, a.experts, generator=g, dtype=torch.float32)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    with torch.no_grad():
        for _ in range(a.warmup):
            route(logits, a.top_k, a.capacity_factor)
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            _, fmap, aux, z = route(logits, a.top_k, a.capacity_factor)
            times.append((time.perf_counter() - t0) * 1e3)
    tokens, experts = logits.shape
    print(json.dumps({
        "tool": "torch_router_baseline", "torch": torch.__version__,
        "tokens": tokens, "experts": experts, "top_k": a.top_k,
        "capacity_factor": a.capacity_factor, "threads": torch.get_num_threads(),
        "ms": statistics.median(times), "ms_min": min(times),
        "kept": int(fmap.sum()), "aux_loss": float(aux), "z_loss": float(z)}))


if __name__ == "__main__":
    main()
