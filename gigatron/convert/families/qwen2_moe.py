"""Qwen2-MoE (`Qwen2MoeForCausalLM`): Qwen2's decoder with a top-k MoE block plus a gated
shared expert in every layer.

HF `mlp.gate` [E, h] is the router (softmax over all experts, top-k, renormalised only with
`norm_topk_prob`: `_moe.softmax_topk_moe`); `mlp.experts.{e}.gate|up|down_proj`; the shared
expert `mlp.shared_expert.gate|up|down_proj` (width `shared_expert_intermediate_size`) ->
`mlp.shared_experts.linear_fc1|2` (Megatron's moe_shared_expert_intermediate_size), and its
gate `mlp.shared_expert_gate.weight` [1, h] -> `mlp.shared_experts.gate_weight`: the shared
output times sigmoid(x @ w^T) per token (Megatron's moe_shared_expert_gate). `qkv_bias`
(default true): q/k/v carry biases, o_proj none.
"""

from __future__ import annotations

import functools

from gigatron.convert.families._family import Family, config_error
from gigatron.convert.families._moe import moe_mlp, softmax_topk_moe
from gigatron.convert.families._registry import register
from gigatron.convert.families.llama import decoder_recipes, parse_llama_like


def parse(cfg: dict):
    config_kwargs, model_kwargs, spec_kwargs = parse_llama_like(
        "qwen2_moe", cfg, qkv_bias_only=True
    )
    config_kwargs["add_qkv_bias"] = bool(cfg.get("qkv_bias", True))
    experts = cfg["num_experts"]
    config_kwargs.update(softmax_topk_moe("qwen2_moe", cfg, experts=experts))
    shared = cfg.get("shared_expert_intermediate_size")
    if not shared:
        raise config_error(
            "qwen2_moe", "shared_expert_intermediate_size", shared,
            "must be a positive width (Qwen2-MoE's gated shared expert)",
        )  # fmt: skip
    config_kwargs.update(moe_shared_expert_intermediate_size=shared, moe_shared_expert_gate=True)
    return config_kwargs, model_kwargs, {**spec_kwargs, "num_experts": experts}


_MLP = functools.partial(moe_mlp, shared="shared_expert", shared_gate="shared_expert_gate")
register(
    Family(
        "qwen2_moe", "Qwen2MoeForCausalLM", parse, functools.partial(decoder_recipes, mlp=_MLP),
        "Qwen2 + top-k softmax MoE and a sigmoid-gated shared expert (moe_shared_expert_gate)",
        ep=True,
    )
)  # fmt: skip
