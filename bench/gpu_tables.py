#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The GPU tables of docs/performance.md from one `./build.sh gpu-check DIR` output folder.

Usage: python3 bench/gpu_tables.py DIR [--check DOC]  (DIR holds bench_kernels_cuda.json and
torch_gpu_baseline.jsonl, as docs/gpu-results/ does). Prints three markdown tables: prefill
(T = 16384) and decode (T = 1) per launcher and model -- moeroute us, the % of 4.8 TB/s where it
is 1 % or more, and the torch stage's us with the ratio -- then the CUDA-graph decode rows
(gating / gating + losses + dispatch, torch's captured route in brackets). With --check, prints
nothing but the rows DOC lacks and exits 1 if any (ctest docs_gpu_tables: performance.md shows
the numbers of the raw files committed beside it).
"""
import json
import sys

MODELS = ["switch_base", "mixtral_8x7b", "deepseek_v3", "qwen3_moe", "olmoe"]
# launcher -> the torch stage timed beside it (None: no torch row)
STAGE = {
    "cuda_gating_bf16": "gating",
    "cuda_losses": "losses",
    "cuda_dispatch_cf1.25": "dispatch",
    "cuda_layout_compact_b16": "layout",
    "cuda_permute_bf16": "permute",
    "cuda_combine_bf16": "combine",
    "cuda_gating_backward_bf16": "gating_backward",
    "cuda_backward_combine_bf16": None,  # autograd splits this step differently
    "cuda_backward_permute_bf16": "permute_backward",
}


def load(folder):
    bench = {}
    for b in json.load(open(f"{folder}/bench_kernels_cuda.json"))["benchmarks"]:
        parts = b["name"].split("/")
        if len(parts) < 3 or "=" not in parts[2]:
            continue  # shapes without a T (the expert-bias update)
        bench[(parts[0], parts[1], int(parts[2].split("=")[1]))] = b
    torch = {}
    for line in open(f"{folder}/torch_gpu_baseline.jsonl"):
        r = json.loads(line)
        if "stage" in r and "us" in r:  # (rows of a compile or capture torch refused: no "us")
            torch[(r["stage"], r["model"], r["T"])] = r["us"]
    return bench, torch


def cell(bench, torch, launcher, model, T):
    b = bench[(launcher, model, T)]
    us, pct = b["real_time"], b.get("pct_of_peak", 0.0)
    text = f"{us:.1f}" + (f" ({pct:.0f} %)" if pct >= 1 else "")
    stage = STAGE[launcher]
    # the faster of torch eager and torch.compile where both ran (with --compile)
    variants = [v for v in (stage, f"{stage}_compiled") if (v, model, T) in torch] if stage else []
    if variants:
        t = min(torch[(v, model, T)] for v in variants)
        text += f" / {t:.0f} = {t / us:.1f}x"
    return text


def tables(folder):
    """The three tables' lines."""
    bench, torch = load(folder)
    out = []
    head = ["| launcher | " + " | ".join(MODELS) + " |", "|---|" + "---|" * len(MODELS)]
    for T in (16384, 1):
        out += [f"T = {T}", ""] + head
        for launcher in STAGE:
            row = " | ".join(cell(bench, torch, launcher, m, T) for m in MODELS)
            out.append(f"| {launcher} | {row} |")
        out.append("")
    out += ["| T | " + " | ".join(MODELS) + " |", "|---|" + "---|" * len(MODELS)]
    for T in (1, 16, 128):
        row = []
        for m in MODELS:
            g = bench[("cuda_gating_graph", m, T)]["real_time"]
            r = bench[("cuda_route_graph", m, T)]["real_time"]
            t = min(torch[(v, m, T)] for v in ("route_graph", "route_compiled_graph")
                    if (v, m, T) in torch)
            row.append(f"{g:.1f} / {r:.1f} ({t:.0f})")
        out.append(f"| {T} | " + " | ".join(row) + " |")
    return out


def main():
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--check"):
        sys.exit("usage: gpu_tables.py DIR [--check DOC]")
    lines = tables(args[0])
    if len(args) == 1:
        print("\n".join(lines))
        return
    doc = set(open(args[2]).read().splitlines())
    # the data rows (the header rows repeat, so they prove nothing)
    missing = [l for l in lines if l.startswith("| ") and not l.startswith("| launcher")
               and not l.startswith("| T |") and l not in doc]
    for l in missing:
        print(f"{args[2]} lacks: {l}")
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
