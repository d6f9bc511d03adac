#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A HuggingFace Mixtral routed by moeroute, end to end on a CPU: build a tiny model from its
config, patch its MoE blocks, train a few steps with capacity 1.25 and residual drops (plus
moeroute's aux loss), record the router logits of a few batches, and ask the capacity planner
which factor the traffic needs.

    python3 examples/python/hf_mixtral.py [dump.npy]      # needs torch and transformers
"""
import sys
import tempfile

import torch
import transformers

import moeroute
import moeroute.hf

torch.manual_seed(0)
config = transformers.MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, num_local_experts=8,
                                    num_experts_per_tok=2, max_position_embeddings=128)
model = transformers.MixtralForCausalLM(config)

# 1. moeroute routes every MoE block; without options it is Mixtral's own routing exactly
print("patched:", moeroute.hf.patch(model, capacity_factor=1.25, drop_policy="residual",
                                    aux_loss_coeff=0.01))

# 2. a few training steps with capacity and residual drops
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
data = torch.randint(0, 128, (8, 32))
for step in range(5):
    opt.zero_grad()
    out = model(data, labels=data)
    loss = out.loss + moeroute.hf.losses(model)
    loss.backward()
    opt.step()
    totals = [o.totals_dict() for o in moeroute.hf.outputs(model).values()]
    print(f"step {step}: loss {loss.item():.4f}, dropped per layer "
          f"{[t['dropped'] for t in totals]} of {data.numel() * 2} assignments")

# 3. record the router logits of a few batches: the dump moeroute-capacity --npy reads
path = sys.argv[1] if len(sys.argv) > 1 else tempfile.mktemp(suffix=".npy")
model.eval()
with torch.no_grad(), moeroute.hf.record(model, path):
    for _ in range(4):
        model(torch.randint(0, 128, (4, 64)))
print("recorded", path)

# 4. plan: the smallest capacity factor keeping 99 % of 256-token batches under 1 % drops
import numpy as np  # noqa: E402

plan = moeroute.plan(np.load(path), moeroute.Config.from_hf(config), batch_tokens=256,
                     factors=[1.0, 1.25, 1.5, 2.0, "dropless"])
model_rec = plan["recommendations"][-1]
print(f"recommended capacity factor for this traffic: {model_rec['factor']} "
      f"(p99 overflow {model_rec['overflow_quantile']:.4f}, met: {model_rec['met']})")
print(f"the same from the shell: moeroute-capacity --npy {path} --batch-tokens 256 "
      "--preset mixtral --top-k 2")
