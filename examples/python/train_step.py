#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Training steps of a small MoE layer with moeroute.torch, from a router that starts
collapsed (every token prefers expert 0), as examples/train_step.cpp does in C++.

The layer: Router -> permute -> 8 two-layer MLP experts on their buffer rows -> combine
(residual pass-through for dropped tokens). The loss is a regression task plus the router's
aux loss and z-loss; every gradient goes through the library's backward passes
(combine_backward, permute_backward, gating_backward). Each step prints the aux loss and the
drop rate; both fall as the aux loss spreads the tokens."""

import argparse

import torch

import moeroute.torch as mt


class MoELayer(torch.nn.Module):
    def __init__(self, d, experts, hidden, capacity_factor):
        super().__init__()
        self.router = mt.Router(d, "deepspeed_top2", num_experts=experts, top_k=2,
                                capacity_factor=capacity_factor, drop_policy="residual",
                                aux_loss_coeff=0.1, z_loss_coeff=1e-3)
        self.w1 = torch.nn.Parameter(torch.randn(experts, d, hidden) * d ** -0.5)
        self.w2 = torch.nn.Parameter(torch.randn(experts, hidden, d) * hidden ** -0.5)

    def forward(self, x):
        # [snippet:readme-python]
        out = self.router(x)                              # RouterOutput: ids, weight, losses...
        buf = mt.permute(x, out)                          # [max_rows, d], expert-major
        offsets = out.offsets.tolist()
        rows = []
        for e in range(self.router.num_experts):          # each expert on its own rows
            seg = buf[offsets[e]:offsets[e + 1]]
            rows.append(torch.relu(seg @ self.w1[e]) @ self.w2[e])
        rows.append(buf[offsets[-1]:])                    # padding rows past the experts
        y = mt.combine(torch.cat(rows), out, x=x)         # differentiable in rows, weight, x
        # [/snippet]
        return y, out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--tokens", type=int, default=512)
    args = p.parse_args()
    torch.manual_seed(0)
    d, E = 16, 8
    layer = MoELayer(d, E, 32, capacity_factor=1.0)
    with torch.no_grad():                                  # collapse the router onto expert 0
        layer.router.weight.zero_()
        layer.router.weight[0, 0] = 4.0
    target = torch.nn.Linear(d, d)
    opt = torch.optim.Adam(layer.parameters(), lr=3e-2)
    history = []
    for step in range(args.steps):
        x = torch.randn(args.tokens, d)
        x[:, 0] = 1.0                                      # a constant feature: a router bias
        with torch.no_grad():
            want = target(x)
        y, out = layer(x)
        task = torch.nn.functional.mse_loss(y, want)
        loss = task + out.aux_loss + out.z_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = out.totals_dict()
        drop = t["dropped"] / (args.tokens * 2)
        history.append((float(out.aux_loss), drop))
        print(f"step {step:3d}  task {float(task):.4f}  aux {float(out.aux_loss):.4f}  "
              f"dropped {100 * drop:5.1f} %")
    first, last = history[0], history[-1]
    if not (last[0] < first[0] and last[1] < first[1]):
        raise SystemExit("the aux loss and the drop rate did not fall")
    print(f"aux loss {first[0]:.4f} -> {last[0]:.4f}, drop rate {100 * first[1]:.1f} % -> "
          f"{100 * last[1]:.1f} %")


if __name__ == "__main__":
    main()
