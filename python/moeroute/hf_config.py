# SPDX-License-Identifier: Apache-2.0
"""Config.from_hf: the routing of a HuggingFace transformers MoE model, read off its config
object (or config.json as a dict), so no preset option is left at a default the model does not
use (a DeepSeek-V3 with 4 groups / top-2, a Qwen2-MoE without norm_topk_prob, ...).

The families and the attributes read (transformers' own names):

| model_type | experts, k | routing options | losses |
|---|---|---|---|
| mixtral | num_local_experts, num_experts_per_tok | — | router_aux_loss_coef |
| qwen2_moe, qwen3_moe, olmoe | num_experts, num_experts_per_tok | norm_topk_prob | router_aux_loss_coef |
| deepseek_v3 | n_routed_experts, num_experts_per_tok | n_group, topk_group, norm_topk_prob, routed_scaling_factor | (aux-loss-free: expert bias) |
| switch_transformers | num_experts (top-1) | expert_capacity (per batch row: row_tokens) | router_aux_loss_coef, router_z_loss_coef |
| nllb_moe | num_experts (top-2) | expert_capacity, second_expert_policy, normalize_router_prob_before_dropping, batch_prioritized_routing, moe_eval_capacity_token_fraction | router_aux_loss_coef, router_z_loss_coef |

tests/data/golden-hf holds 284 routings of these routers run by transformers itself; the Python
tests route every one with the config from_hf makes.
"""

from __future__ import annotations

from typing import Any, Mapping, Union

import numpy as np

from . import _core
from ._core import Config

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "switch_transformers",
            "nllb_moe")


def _getter(hf_config: Union[Mapping[str, Any], Any]):
    if isinstance(hf_config, Mapping):
        return lambda name, default=None: hf_config.get(name, default)
    return lambda name, default=None: getattr(hf_config, name, default)


def _major(version) -> int:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


def from_hf(hf_config, *, training: bool = True, row_tokens: int = 0) -> Config:
    """The routing Config of a transformers MoE model's config (a PretrainedConfig, or its
    config.json as a dict). `training`: the module's mode (NLLB's eval capacity, training-only
    noise); `row_tokens`: Switch counts expert_capacity per batch row of this many tokens (the
    sequence length; 0 = the whole batch is one row).

    Switch Transformers: transformers 4.x passes a dropped token's hidden state through
    (drop_policy residual), 5.x outputs 0 for it (zero_weight); the config's
    transformers_version decides, 5.x when it has none.

    Raises moeroute.Error for a model_type with no moeroute equivalent, naming the ones known."""
    get = _getter(hf_config)
    kind = get("model_type", "")
    k = get("num_experts_per_tok")
    if kind == "mixtral":
        c = Config.mixtral(int(get("num_local_experts")), int(k))
    elif kind in ("qwen2_moe", "qwen3_moe"):
        c = Config.qwen_moe(int(get("num_experts")), int(k),
                            norm_topk_prob=bool(get("norm_topk_prob", False)))
    elif kind == "olmoe":
        c = Config.olmoe(int(get("num_experts")), int(k))
        if get("norm_topk_prob", False):
            c["gating.renorm"] = "before_drop"
    elif kind == "deepseek_v3":
        groups, group_topk = int(get("n_group", 1)), int(get("topk_group", 1))
        c = Config.deepseek_v3(int(get("n_routed_experts")), int(k),
                               groups if groups > 1 else 0, group_topk if groups > 1 else 0)
        if not get("norm_topk_prob", True):
            c["gating.renorm"] = "none"
        # the model multiplies in float32: the factor as that float32
        c["gating.scaling_factor"] = float(np.float32(get("routed_scaling_factor", 1.0)))
    elif kind == "switch_transformers":
        c = Config.switch_transformers(int(get("num_experts")), int(get("expert_capacity")),
                                       int(row_tokens))
        version = get("transformers_version")
        c["dispatch.dropped"] = "residual" if version and _major(version) < 5 else "zero_weight"
    elif kind == "nllb_moe":
        c = Config.nllb_moe(
            int(get("num_experts")), expert_capacity=get("expert_capacity"),
            batch_prioritized_routing=bool(get("batch_prioritized_routing", False)),
            normalize_router_prob_before_dropping=bool(
                get("normalize_router_prob_before_dropping", False)),
            training=bool(training),
            moe_eval_capacity_token_fraction=float(get("moe_eval_capacity_token_fraction", 1.0)))
        policy = get("second_expert_policy", "all")
        if policy != "all":
            c["gating.second_expert.policy"] = policy
    else:
        raise _core.Error(f"Config.from_hf: model_type '{kind}' has no moeroute routing "
                          f"(known: {', '.join(FAMILIES)})")
    aux = get("router_aux_loss_coef")
    if aux is not None:
        c["loss.aux_coefficient"] = float(aux)
    z = get("router_z_loss_coef")
    if z is not None:
        c["loss.z_coefficient"] = float(z)
    c["training"] = bool(training)
    c.validate()
    return c
