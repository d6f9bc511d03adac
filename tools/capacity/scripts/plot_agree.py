#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plot of a moeroute-capacity --agree run: plot_agree.py OUT.png AGREEMENT.json

Per layer, the share of tokens and of slots whose experts differ between the two dumps (bars)
and the share of those token flips that sit on near-ties (line, right axis); the title gives
the share of tokens that differ in at least one layer.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main(out, path):
    with open(path) as f:
        r = json.load(f)
    layers = r["layers"]
    x = np.arange(len(layers))
    tok = [100 * l["token_flip_rate"] for l in layers]
    slot = [100 * l["slot_flip_rate"] for l in layers]
    ties = [100 * l["near_tie_share"] for l in layers]
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(layers) + 3), 4.5))
    ax.bar(x - 0.2, tok, 0.4, label="tokens with another expert set")
    ax.bar(x + 0.2, slot, 0.4, label="slots with another expert")
    ax.set_xlabel("layer")
    ax.set_ylabel("% of tokens / slots")
    ax.set_xticks(x)
    ax2 = ax.twinx()
    ax2.plot(x, ties, "k.-", label="flips on near-ties (right)")
    ax2.set_ylabel(f"% of token flips with margin < {r['tie_margin']:g}")
    ax2.set_ylim(0, 105)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    ax.set_title(f"{r['preset']}, E={r['experts']}, k={r['top_k']}: "
                 f"{100 * r['any_layer_flip_rate']:.2f}% of {r['tokens']} tokens differ "
                 f"in at least one layer", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
