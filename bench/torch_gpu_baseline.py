#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The PyTorch baseline of the GPU benchmarks: each stage bench_kernels_cuda times, written with
the torch ops the peers' Python uses (HF model routers for gating, Megatron-Core's unfused
permute / unpermute, GShard-style capacity by a cumulative sum), on the GPU, bf16 logits and
hidden states, over the same model shapes and token counts (bench/shapes.hpp).

Each stage is timed with CUDA events around one call, after warm-up, median of --repeat calls;
`route_graph` replays gating + aux / z losses + capacity captured in one CUDA graph (the decode
path). The router itself is also timed under graph replay (`gating_graph`) and, with --compile,
gating, losses, dispatch and layout as torch.compile made them (`<stage>_compiled`,
`gating_compiled_graph`, `route_compiled_graph`; one compile per model and stage with dynamic
shapes): the table sets moeroute against the faster of eager and compiled. Writes one
JSON object per line to --out; with --ours (bench_kernels_cuda's JSON) it also writes a markdown
table of both, with the ratio, to --table. --stages and --tokens narrow the run (the short
`./build.sh gpu-bench`: gating and gating_backward).

  python3 bench/torch_gpu_baseline.py --out torch.jsonl --ours bench_kernels_cuda.json \
      --table ratios.md
Needs torch with CUDA; exits 77 without a device. `--device cpu` is a dry run of the script
itself (the ctest torch_gpu_baseline_dry_run): every stage once on the CPU, graph rows as errors.
"""
import argparse
import json
import math
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("torch_gpu_baseline.py: torch is not installed", file=sys.stderr)
    sys.exit(77)

# bench/shapes.hpp: name -> (E, k, d, routing family)
MODELS = {
    "switch_base": (128, 1, 768, "softmax_topk"),
    "mixtral_8x7b": (8, 2, 4096, "topk_softmax"),
    "deepseek_v3": (256, 8, 7168, "deepseek"),
    "qwen3_moe": (128, 8, 2048, "softmax_topk_norm"),
    "olmoe": (64, 8, 2048, "softmax_topk"),
}
# bench/shapes.hpp's wide_gating_shapes: only when --models names them (gpu-bench does)
WIDE = {
    "deepseek_v3_e384": (384, 8, 7168, "deepseek"),
    "qwen3_e512_k10": (512, 10, 2048, "softmax_topk_norm"),
}
TOKENS = [1, 16, 128, 1024, 4096, 16384]
ALL_STAGES = ["gating", "losses", "dispatch", "layout", "permute", "combine", "permute_backward",
              "route_graph", "gating_backward"]
FACTOR = 1.25


def gate(logits, k, family, bias=None):
    """The model's router as its HF code writes it: (weights [T,k] fp32, ids [T,k], lse [T])."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)  # for the z-loss, as the fused kernels also emit it
    if family == "topk_softmax":  # Mixtral: softmax over the k chosen logits
        top, ids = torch.topk(x, k, dim=-1)
        return torch.softmax(top, dim=-1), ids, lse
    if family == "deepseek":  # DeepSeek-V3: sigmoid, bias for selection, 8 groups / top-4
        s = torch.sigmoid(x)
        sel = s + bias
        t = sel.shape[0]
        g = sel.view(t, 8, -1).topk(2, dim=-1)[0].sum(dim=-1)
        gidx = torch.topk(g, k=4, dim=-1, sorted=False)[1]
        gmask = torch.zeros_like(g).scatter_(1, gidx, 1)
        smask = gmask.unsqueeze(-1).expand(t, 8, sel.shape[1] // 8).reshape(t, -1)
        sel = sel.masked_fill(~smask.bool(), 0.0)
        ids = torch.topk(sel, k=k, dim=-1, sorted=False)[1]
        w = s.gather(1, ids)
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20) * 2.5
        return w, ids, lse
    p = torch.softmax(x, dim=-1)
    w, ids = torch.topk(p, k, dim=-1)
    if family == "softmax_topk_norm":
        w = w / w.sum(dim=-1, keepdim=True)
    return w, ids, lse


def losses(logits, ids, lse, experts, k):
    """Switch aux loss (mean prob x fraction routed) and the ST-MoE z-loss."""
    t = logits.shape[0]
    probs = torch.softmax(logits.float(), dim=-1)
    counts = torch.zeros(experts, device=logits.device).scatter_add_(
        0, ids.reshape(-1), torch.ones(ids.numel(), device=logits.device))
    aux = experts * torch.sum(probs.mean(dim=0) * counts / (t * k))
    z = torch.mean(lse * lse)
    return aux, z


def dispatch(ids, weights, experts, capacity):
    """Capacity by position (token-major, GShard / Megatron drop policy 'position')."""
    t = ids.shape[0]
    routing_map = torch.zeros(t, experts, dtype=torch.int32, device=ids.device).scatter_(1, ids, 1)
    position = torch.cumsum(routing_map, dim=0) - 1
    keep = (position < capacity) & routing_map.bool()
    probs = torch.zeros(t, experts, device=ids.device).scatter_(1, ids, weights) * keep
    return keep, probs


def layout(keep):
    """Megatron's permute indices: token of each row, expert-major; per-expert counts."""
    t, experts = keep.shape
    map_t = keep.T.contiguous()
    token_idx = torch.arange(t, device=keep.device).unsqueeze(0).expand(experts, -1)
    return token_idx.masked_select(map_t), map_t.sum(dim=1)


def permute(x, token_indices):
    return x.index_select(0, token_indices)


def combine(ye, probs, keep, token_indices, t):
    w = probs.T.contiguous().masked_select(keep.T.contiguous())
    out = torch.zeros(t, ye.shape[1], dtype=ye.dtype, device=ye.device)
    return out.index_add_(0, token_indices, ye * w.unsqueeze(-1).to(ye.dtype))


def time_us(fn, repeat, warmup=3):
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():  # --device cpu: a dry run of the script, wall clock
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times), min(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times), min(times)


def time_graph_us(fn, replays):
    """fn captured once in a CUDA graph; median of per-replay times."""
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA graphs without a device")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return time_us(g.replay, replays)


# the stages torch.compile makes a variant of (`<stage>_compiled`), and route_graph's
# (`route_compiled_graph`: the compiled stages captured in one graph)
COMPILED_STAGES = {"gating": gate, "losses": losses, "dispatch": dispatch, "layout": layout}


def compiled_stages(out, name, wanted):
    """torch.compile of each wanted stage function (dynamic shapes: one compile for every T)."""
    if not hasattr(torch, "compile"):
        out.append({"stage": "compiled", "model": name, "error": "no torch.compile"})
        return {}
    return {s: torch.compile(f, dynamic=True) for s, f in COMPILED_STAGES.items()
            if s in wanted or (s != "layout" and "route_graph" in wanted)}


def timed(out, stage, name, T, timer, fn, repeat):
    """One row: fn timed, or the error a compile or capture torch refused with (not fatal)."""
    try:
        med, best = timer(fn, repeat)
        out.append({"stage": stage, "model": name, "T": T, "us": med, "us_min": best})
    except Exception as e:  # recorded in the JSON, the run goes on
        out.append({"stage": stage, "model": name, "T": T, "error": str(e)[:300]})


def run_model(name, spec, repeat, out, stages_wanted, tokens, compile_stages, device):
    E, k, d, family = spec
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(1)
    bias = torch.zeros(E, device=dev)
    compiled = compiled_stages(out, name, stages_wanted) if compile_stages else {}
    for T in tokens:
        logits = torch.randn(T, E, generator=gen, device=dev).to(torch.bfloat16)
        x = torch.randn(T, d, generator=gen, device=dev).to(torch.bfloat16)
        C = math.ceil(FACTOR * T * k / E)
        with torch.no_grad():
            w, ids, lse = gate(logits, k, family, bias)
            keep, probs = dispatch(ids, w, E, C)
            tok, counts = layout(keep)
            xe = permute(x, tok)
            args = {"gating": (logits, k, family, bias), "losses": (logits, ids, lse, E, k),
                    "dispatch": (ids, w, E, C), "layout": (keep,)}
            stages = {
                "gating": lambda: gate(*args["gating"]),
                "losses": lambda: losses(*args["losses"]),
                "dispatch": lambda: dispatch(*args["dispatch"]),
                "layout": lambda: layout(keep),
                "permute": lambda: permute(x, tok),
                "combine": lambda: combine(xe, probs, keep, tok, T),
                "permute_backward": lambda: torch.zeros(T, d, dtype=x.dtype, device=dev)
                .index_add_(0, tok, xe),
            }
            for stage, fn in stages.items():
                if stage in stages_wanted:
                    timed(out, stage, name, T, time_us, fn, repeat)
            for stage, cfn in compiled.items():
                if stage in stages_wanted:
                    timed(out, f"{stage}_compiled", name, T, time_us,
                          lambda cfn=cfn, a=args[stage]: cfn(*a), repeat)
            if "gating" in stages_wanted:
                timed(out, "gating_graph", name, T, time_graph_us, stages["gating"], repeat)
                if "gating" in compiled:
                    timed(out, "gating_compiled_graph", name, T, time_graph_us,
                          lambda: compiled["gating"](*args["gating"]), repeat)

            def route(f):
                w_, ids_, lse_ = f["gating"](logits, k, family, bias)
                f["losses"](logits, ids_, lse_, E, k)
                f["dispatch"](ids_, w_, E, C)

            if "route_graph" in stages_wanted:
                timed(out, "route_graph", name, T, time_graph_us, lambda: route(COMPILED_STAGES),
                      repeat)
                if compiled:
                    timed(out, "route_compiled_graph", name, T, time_graph_us,
                          lambda: route(compiled), repeat)
        if "gating_backward" not in stages_wanted:
            print(f"torch_gpu_baseline: {name} T={T} done", file=sys.stderr, flush=True)
            continue
        # backward of the router (gates + aux + z) w.r.t. the logits, by autograd
        lg = logits.detach().clone().requires_grad_(True)
        w_, ids_, lse_ = gate(lg, k, family, bias)
        aux, z = losses(lg, ids_, lse_, E, k)
        total = (w_ * torch.randn_like(w_)).sum() + 1e-2 * aux + 1e-3 * z
        timed(out, "gating_backward", name, T, time_us,
              lambda: torch.autograd.grad(total, lg, retain_graph=True), repeat)
        del lg, w_, total
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(f"torch_gpu_baseline: {name} T={T} done", file=sys.stderr, flush=True)


# bench_kernels_cuda's case names per baseline stage
OURS = {
    "gating": "cuda_gating_bf16",
    "gating_graph": "cuda_gating_graph",
    "losses": "cuda_losses",
    "dispatch": "cuda_dispatch_cf1.25",
    "layout": "cuda_layout_compact_b16",
    "permute": "cuda_permute_bf16",
    "combine": "cuda_combine_bf16",
    "gating_backward": "cuda_gating_backward_bf16",
    "permute_backward": "cuda_backward_permute_bf16",
    "route_graph": "cuda_route_graph",
}


# torch's stages the table sets against one of ours: the faster of eager and compiled
FASTEST_OF = {"gating": ("gating", "gating_compiled"),
              "gating_graph": ("gating_graph", "gating_compiled_graph"),
              "losses": ("losses", "losses_compiled"),
              "dispatch": ("dispatch", "dispatch_compiled"),
              "layout": ("layout", "layout_compiled"),
              "route_graph": ("route_graph", "route_compiled_graph")}


def fastest_torch(rows):
    """Rows with each FASTEST_OF stage's time the fastest of its variants (which one: 'via')."""
    best = {}
    for r in rows:
        if "us" not in r:
            continue
        for stage, variants in FASTEST_OF.items():
            if r["stage"] in variants:
                key = (stage, r["model"], r["T"])
                if key not in best or r["us"] < best[key]["us"]:
                    best[key] = dict(r, stage=stage, via=r["stage"])
    merged = [r for r in rows if "us" in r and r["stage"] in OURS and r["stage"] not in FASTEST_OF]
    return merged + list(best.values())


def table(rows, ours_json):
    with open(ours_json) as f:
        bench = json.load(f)
    ours = {}
    for b in bench["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or "error_occurred" in b:
            continue
        ours[b["name"].split("/manual_time")[0]] = b
    lines = ["| stage | model | T | moeroute us | % of 4.8 TB/s | torch us | torch / moeroute |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in fastest_torch(rows):
        key = f"{OURS[r['stage']]}/{r['model']}/T={r['T']}"
        b = ours.get(key)
        if b is None:
            continue
        us = b["real_time"] if b.get("time_unit") == "us" else b["real_time"] / 1e3
        pct = b.get("pct_of_peak")
        pct_s = f"{pct:.1f}" if pct is not None else ""
        via = " (compiled)" if "compiled" in r.get("via", "") else ""
        lines.append(f"| {r['stage']} | {r['model']} | {r['T']} | {us:.2f} | {pct_s} | "
                     f"{r['us']:.2f}{via} | {r['us'] / us:.1f}x |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON lines, one per (stage, model, T)")
    ap.add_argument("--ours", help="bench_kernels_cuda --benchmark_out JSON, for the table")
    ap.add_argument("--table", help="markdown table of both, with the ratio")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--stages", default="all",
                    help="comma-separated stages (gating, losses, dispatch, layout, permute, "
                         "combine, permute_backward, route_graph, gating_backward) or all")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts")
    ap.add_argument("--compile", action="store_true",
                    help="also time torch.compile of gating, losses, dispatch and layout (the "
                         "router also under graph replay, and the route's graph of them)")
    ap.add_argument("--device", default="cuda",
                    help="cuda, or cpu for a dry run of the script without a GPU (wall-clock "
                         "times, no graph stages: those rows record the error)")
    a = ap.parse_args()
    stages = set(ALL_STAGES) if a.stages == "all" else set(a.stages.split(","))
    unknown = stages - set(ALL_STAGES)
    if unknown:
        ap.error(f"unknown --stages {sorted(unknown)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_gpu_baseline.py: no CUDA device", file=sys.stderr)
        sys.exit(77)
    rows = []
    for name in a.models.split(","):
        run_model(name, {**MODELS, **WIDE}[name], a.repeat, rows, stages,
                  [int(t) for t in a.tokens.split(",")], a.compile, a.device)
    with open(a.out, "w") as f:
        meta = {"tool": "torch_gpu_baseline", "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else a.device}
        f.write(json.dumps(meta) + "\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")
    if a.ours and a.table:
        with open(a.table, "w") as f:
            f.write(table(rows, a.ours))


if __name__ == "__main__":
    main()
