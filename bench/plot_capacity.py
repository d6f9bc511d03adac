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
    fig, axes = plt.subplots(len(tables), 2, figsize=(13, 4.2 * len(tables)), squeeze=False)
    for r, (path, rows) in enumerate(tables):
        numeric = sorted({float(x["factor"]) for x in rows if x["factor"] != "dropless"})
        has_dropless = any(x["factor"] == "dropless" for x in rows)
        top = (numeric[-1] if numeric else 1.0)
        dropless_x = top + max(0.25, 0.15 * top)

        def xval(f):
            return dropless_x if f == "dropless" else float(f)

        # one policy/priority combination per line style, one scenario per colour
        combos = sorted({(x["priority"], x["policy"]) for x in rows})
        scenarios = list(dict.fromkeys(x["scenario"] for x in rows))
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        styles = ["-", "--", ":", "-."]
        markers = ["o", "s", "^", "D", "v", "x"]
        first = rows[0]
        title = f"E={first['experts']} k={first['top_k']} T={first['tokens']}"
        for si, scn in enumerate(scenarios):
            for ci, (prio, pol) in enumerate(combos):
                pts = [x for x in rows if x["scenario"] == scn and x["priority"] == prio and x["policy"] == pol]
                pts.sort(key=lambda x: xval(x["factor"]))
                if not pts:
                    continue
                xs = [xval(x["factor"]) for x in pts]
                label = scn if len(combos) == 1 else f"{scn} / {prio} / {pol}"
                kw = dict(color=colours[si % len(colours)], linestyle=styles[ci % len(styles)],
                          marker=markers[ci % len(markers)], markersize=4, label=label)
                axes[r][0].plot(xs, [100 * float(x["drop_rate"]) for x in pts], **kw)
                axes[r][1].plot(xs, [100 * float(x["padding_waste"]) for x in pts], **kw)
        for c, what in enumerate(("drop rate (% of assignments)", "padding waste (% of buffer rows)")):
            ax = axes[r][c]
            ax.set_ylabel(what)
            ax.set_xlabel("capacity factor")
            ax.set_title(f"{what.split(' (')[0]} — {title} ({os.path.basename(path)})", fontsize=10)
            ticks = list(numeric) + ([dropless_x] if has_dropless else [])
            labels = [f"{v:g}" for v in numeric] + (["dropless"] if has_dropless else [])
            ax.set_xticks(ticks)
            ax.set_xticklabels(labels, rotation=0)
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
        axes[r][1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("moeroute-capacity: what each capacity factor drops and what it wastes", fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
