#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plots of a moeroute-capacity planning run: plot_plan.py OUT.png PLAN.json

Three panels: (1) per layer, the per-batch drop rate against the capacity factor (p50 line,
p95 dashed, shaded up to p99) for the first priority / policy of the run; (2) a layer x expert heatmap of each
expert's load share over the dump, in units of its fair share 1/E; (3) the recommendation: the
smallest factor per layer (and for the whole model) whose quantile of per-batch overflow meets
the target, annotated with its padded buffer and the dropless alternative.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402


def mib(b):
    return f"{b / 2**20:.1f} MiB" if b < 2**30 else f"{b / 2**30:.2f} GiB"


def main(out, path):
    with open(path) as f:
        plan = json.load(f)
    cells = plan["cells"]
    first = cells[0]
    prio, pol = first["priority"], first["policy"]
    layers = sorted({c["layer"] for c in cells})
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.2), gridspec_kw={"width_ratios": [1.2, 1.3, 1]})

    ax = axes[0]
    cmap = plt.get_cmap("viridis", max(len(layers), 2))
    for i, layer in enumerate(layers):
        rows = [c for c in cells if c["layer"] == layer and c["priority"] == prio
                and c["policy"] == pol and c["factor"] != "dropless"]
        if not rows:
            continue
        x = [float(c["factor"]) for c in rows]
        p50 = [100 * c["drop_rate"]["p50"] for c in rows]
        p95 = [100 * c["drop_rate"]["p95"] for c in rows]
        p99 = [100 * c["drop_rate"]["p99"] for c in rows]
        color = cmap(i)
        ax.plot(x, p50, "-o", color=color, ms=3, label=f"layer {layer}" if len(layers) <= 12 else None)
        ax.plot(x, p95, "--", color=color, lw=0.8)
        ax.fill_between(x, p50, p99, color=color, alpha=0.15)
    target = 100 * plan["target_drop"]
    ax.axhline(target, color="red", ls="--", lw=1, label=f"target {target:g}%")
    ax.set_xlabel("capacity factor")
    ax.set_ylabel("drop rate per batch (%)")
    ax.set_title(f"drop rate over {plan['batches']} batches of {plan['batch_tokens']}\n"
                 f"p50 line, p95 dashed, band to p99 ({prio} / {pol}, {plan['batching']})")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)

    ax = axes[1]
    shares = np.array([u["share"] for u in plan["expert_load"]]) * plan["experts"]
    im = ax.imshow(shares, aspect="auto", cmap="magma", interpolation="nearest",
                   vmin=0, vmax=max(2.0, float(shares.max())))
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title("load share over the dump (x fair share 1/E)")
    for u in plan["expert_load"]:
        for e in u["dead"]:
            ax.text(e, u["layer"], "x", ha="center", va="center", color="cyan", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.046)

    ax = axes[2]
    recs = plan["recommendations"]
    names = [str(r["layer"]) for r in recs]
    vals = [r["factor"] if r["met"] else np.nan for r in recs]
    colors = ["tab:blue"] * (len(recs) - 1) + ["tab:red"]
    ax.bar(range(len(recs)), vals, color=colors)
    finite = [v for v in vals if v == v]
    ax.set_ylim(0, 1.35 * max(finite) if finite else 1)
    ax.set_xticks(range(len(recs)))
    ax.set_xticklabels(names, rotation=0 if len(recs) < 12 else 90, fontsize=8)
    ax.set_xlabel("layer")
    ax.set_ylabel("recommended capacity factor")
    q = 100 * plan["quantile"]
    ax.set_title(f"smallest factor with p{q:g} overflow <= {target:g}%")
    model = recs[-1]
    if model["met"]:
        ax.text(0.02, 0.97,
                f"model: factor {model['factor']:.2f}, padded buffers {mib(model['buffer_bytes'])}"
                f" ({100 * model['padding_waste']:.1f}% padding)\n"
                f"dropless compact instead: {mib(model['dropless_bytes'])}"
                f" ({100 * model['dropless_padding_waste']:.1f}% padding)",
                transform=ax.transAxes, va="top", fontsize=8,
                bbox=dict(facecolor="white", alpha=0.8, edgecolor="none"))
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"moeroute-capacity plan: {plan['input']} ({plan['preset']}, E={plan['experts']},"
                 f" k={plan['top_k']}, {plan['layers']} layers, {plan['tokens']} tokens)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_plan.py OUT.png PLAN.json")
    main(sys.argv[1], sys.argv[2])
