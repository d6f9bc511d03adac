#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per-rank load of an expert-parallel layer, from `moeroute-capacity --ep R --json FILE`.

usage: plot_ep.py OUT.png|OUT.svg RESULT.json

One panel per input batch: rows each rank receives under every capacity scope (and factor),
with the mean as a dashed line, so a hot rank stands out; the legend gives the hotspot factor
(max / mean) and the drop rate of each scope.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    out, path = argv[1], argv[2]
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"]
    meta = data.get("meta", {})
    inputs = list(dict.fromkeys(r["input"] for r in rows))
    if not inputs:
        sys.stderr.write("plot_ep.py: no rows in %s\n" % path)
        return 1
    fig, axes = plt.subplots(len(inputs), 1, figsize=(9, 3.2 * len(inputs)), squeeze=False)
    for ax, name in zip(axes[:, 0], inputs):
        for r in (r for r in rows if r["input"] == name):
            recv = r["rows_received"]
            label = "%s %s: hotspot %.2f, drop %.1f%%" % (
                r["scope"], r["factor"], r["hotspot"], 100 * r["drop_rate"])
            line, = ax.plot(range(len(recv)), recv, marker="." if len(recv) <= 64 else None,
                            linewidth=1, label=label)
            mean = sum(recv) / max(len(recv), 1)
            ax.axhline(mean, color=line.get_color(), linestyle="--", linewidth=0.6)
        ax.set_title("%s on %s ranks (%s placement)" % (name, meta.get("ranks", "?"),
                                                        meta.get("placement", "?")))
        ax.set_xlabel("rank")
        ax.set_ylabel("rows received")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
