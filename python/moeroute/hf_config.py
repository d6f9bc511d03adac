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
| deepseek_v2 | n_routed_experts, num_experts_per_tok | topk_method, n_group, topk_group, routed_scaling_factor | aux_loss_alpha |
| switch_transformers | num_experts (top-1) | expert_capacity (per batch row: row_tokens) | router_aux_loss_coef, router_z_loss_coef |
| nllb_moe | num_experts (top-2) | expert_capacity, second_expert_policy, normalize_router_prob_before_dropping, batch_prioritized_routing, moe_eval_capacity_token_fraction | router_aux_loss_coef, router_z_loss_coef |

tests/data/golden-hf holds 284 routings of these routers run by transformers itself; the Python
tests route every one with the config from_hf makes.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping, Union

import numpy as np

from . import _core
from ._core import Config

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "deepseek_v2",
            "switch_transformers", "nllb_moe")


def _getter(hf_config: Union[Mapping[str, Any], Any]):
    if isinstance(hf_config, Mapping):
        return lambda name, default=None: hf_config.get(name, default)
    return lambda name, default=None: getattr(hf_config, name, default)


def _running_version(hf_config):
    """The version of the transformers library a config object belongs to (its blocks run
    that library's code, whatever version saved the config); None for a config.json dict."""
    if isinstance(hf_config, Mapping):
        return None
    module = sys.modules.get("transformers")
    return getattr(module, "__version__", None) if module is not None else None


def _version(version) -> tuple:
    """(major, minor) of a version string ("4.46.3" -> (4, 46)); (0, 0) if unreadable."""
    try:
        major, minor = (str(version).split(".") + ["0"])[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
    except ValueError:
        return 0, 0


def from_hf(hf_config, *, training: bool = True, row_tokens: int = 0) -> Config:
    """The routing Config of a transformers MoE model's config (a PretrainedConfig, or its
    config.json as a dict). `training`: the module's mode (NLLB's eval capacity, training-only
    noise); `row_tokens`: Switch counts expert_capacity per batch row of this many tokens (the
    sequence length; 0 = the whole batch is one row).

    Switch Transformers: transformers before 4.52 passes a dropped token's hidden state
    through (drop_policy residual; the block then scales it by the router probability), 4.52
    and later output 0 for it (zero_weight). For a config object the transformers library it
    came from decides (its blocks run that code); for a config.json dict its
    transformers_version, the newer rule when it has none.

    Raises moeroute.Error for a model_type with no moeroute equivalent, naming the ones known."""
    get = _getter(hf_config)
    kind = str(get("model_type", "")).replace("-", "_")  # transformers spells it "nllb-moe"
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
    elif kind == "deepseek_v2":
        # softmax scores; topk_method greedy, or group_limited_greedy (a group's score is its
        # best expert's); no renormalisation (transformers' V2 gate never reads
        # norm_topk_prob); routed_scaling_factor times the gates
        groups, group_topk = int(get("n_group", 1) or 1), int(get("topk_group", 1) or 1)
        limited = get("topk_method", "greedy") == "group_limited_greedy" and groups > 1
        c = Config.deepseek_v3(int(get("n_routed_experts")), int(k),
                               groups if limited else 0, group_topk if limited else 0)
        c["gating.score"] = "softmax"
        c["gating.expert_bias"] = False
        c["gating.renorm"] = "none"
        if limited:
            c["gating.group_limit.top_n"] = 0
            c["gating.group_limit.score"] = "max"
        c["gating.scaling_factor"] = float(np.float32(get("routed_scaling_factor", 1.0)))
        alpha = get("aux_loss_alpha")
        if alpha is not None:
            c["loss.aux_coefficient"] = float(alpha)
    elif kind == "switch_transformers":
        c = Config.switch_transformers(int(get("num_experts")), int(get("expert_capacity")),
                                       int(row_tokens))
        version = _running_version(hf_config) or get("transformers_version")
        # 4.52 changed SwitchTransformersSparseMLP: next_states starts as zeros, not a clone
        c["dispatch.dropped"] = "residual" if version and _version(version) < (4, 52) \
            else "zero_weight"
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
