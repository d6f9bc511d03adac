#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plot moeroute-capacity CSV output: drop rate and padding waste against capacity factor.

usage: plot_capacity.py OUT.png|OUT.svg SWEEP.csv [SWEEP.csv ...]

One row of two panels per CSV file (e.g. one per model size), one line per
scenario / priority / policy. 'dropless' is drawn at the right end of the x axis.
Needs matplotlib (Debian: python3-matplotlib); uses the Agg backend, so no display.
"""
import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_rows(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"plot_capacity.py: {path} has no data rows")
    for key in ("scenario", "factor", "priority", "policy", "drop_rate", "padding_waste"):
        if key not in rows[0]:
            raise SystemExit(f"plot_capacity.py: {path} has no '{key}' column")
    return rows


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out, paths = argv[1], argv[2:]
    tables = [(p, read_rows(p)) for p in paths]
    fig, axes = plt.subplots(len(tables), 2, figsize=(13, 4.0 * len(tables) + 0.6), squeeze=False)
    for r, (path, rows) in enumerate(tables):
        numeric = sorted({float(x["factor"]) for x in rows if x["factor"] != "dropless"})
        has_dropless = any(x["factor"] == "dropless" for x in rows)
        top = (numeric[-1] if numeric else 1.0)
        dropless_x = top + max(0.25, 0.15 * top)

        def xval(f):
            return dropless_x if f == "dropless" else float(f)

        # one colour per scenario, one line style per drop policy; with several priority
        # modes in the CSV only the first is drawn (the title says which)
        priorities = list(dict.fromkeys(x["priority"] for x in rows))
        prio = priorities[0]
        rows = [x for x in rows if x["priority"] == prio]
        policies = list(dict.fromkeys(x["policy"] for x in rows))
        scenarios = list(dict.fromkeys(x["scenario"] for x in rows))
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        styles = ["-", "--", ":", "-."]
        markers = ["o", "s", "^", "D"]
        first = rows[0]
        title = f"E={first['experts']} k={first['top_k']} T={first['tokens']}, priority {prio}"
        for si, scn in enumerate(scenarios):
            for pi, pol in enumerate(policies):
                pts = [x for x in rows if x["scenario"] == scn and x["policy"] == pol]
                pts.sort(key=lambda x: xval(x["factor"]))
                if not pts:
                    continue
                xs = [xval(x["factor"]) for x in pts]
                kw = dict(color=colours[si % len(colours)], linestyle=styles[pi % len(styles)],
                          marker=markers[pi % len(markers)], markersize=4, alpha=0.85)
                axes[r][0].plot(xs, [100 * float(x["drop_rate"]) for x in pts], **kw)
                axes[r][1].plot(xs, [100 * float(x["padding_waste"]) for x in pts], **kw)
        for c, what in enumerate(("drop rate (% of assignments)", "padding waste (% of buffer rows)")):
            ax = axes[r][c]
            ax.set_ylabel(what)
            ax.set_xlabel("capacity factor")
            ax.set_title(f"{what.split(' (')[0]} — {title}", fontsize=10)
            ticks = list(numeric) + ([dropless_x] if has_dropless else [])
            labels = [f"{v:g}" for v in numeric] + (["dropless"] if has_dropless else [])
            ax.set_xticks(ticks)
            ax.set_xticklabels(labels, rotation=0)
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
        from matplotlib.lines import Line2D
        scn_handles = [Line2D([], [], color=colours[i % len(colours)], label=n) for i, n in enumerate(scenarios)]
        pol_handles = [Line2D([], [], color="black", linestyle=styles[i % len(styles)],
                              marker=markers[i % len(markers)], markersize=4, label=n)
                       for i, n in enumerate(policies)]
        leg = axes[r][1].legend(handles=scn_handles, title="scenario", fontsize=8, title_fontsize=8,
                                loc="upper left", bbox_to_anchor=(1.01, 1.0))
        axes[r][1].add_artist(leg)
        axes[r][1].legend(handles=pol_handles, title="drop policy", fontsize=8, title_fontsize=8,
                          loc="lower left", bbox_to_anchor=(1.01, 0.0))
    fig.suptitle("moeroute-capacity: what each capacity factor drops and what it wastes", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
