"""Qwen3 and Qwen3-MoE: the Llama decoder with per-head q / k RMSNorm (Megatron's qk_layernorm).

Qwen3 (`Qwen3ForCausalLM`): `self_attn.q_norm` / `k_norm` [head_dim] -> `self_attention.
q_layernorm` / `k_layernorm`, applied per head before RoPE, as Megatron's; `head_dim` may differ
from hidden / heads (kv_channels). Qwen3-MoE (`Qwen3MoeForCausalLM`) adds a top-k MoE block in
every layer (`mlp.gate`, `mlp.experts.{e}.gate|up|down_proj`); `norm_topk_prob` picks the router
normalisation (see _moe.softmax_topk_moe).
"""

from __future__ import annotations

import functools

from gigatron.convert.families._family import Family
from gigatron.convert.families._moe import moe_mlp, softmax_topk_moe
from gigatron.convert.families._registry import register
from gigatron.convert.families.llama import decoder_recipes, parse_llama_like, with_qk_norm


def parse_moe(cfg: dict):
    config_kwargs, model_kwargs, spec_kwargs = parse_llama_like("qwen3_moe", cfg)
    experts = cfg.get("num_experts") or cfg["num_local_experts"]
    config_kwargs.update(softmax_topk_moe("qwen3_moe", cfg, experts=experts))
    return config_kwargs, model_kwargs, {**spec_kwargs, "num_experts": experts}


register(
    Family(
        "qwen3", "Qwen3ForCausalLM", with_qk_norm(functools.partial(parse_llama_like, "qwen3")),
        decoder_recipes, "Llama + per-head QK RMSNorm, head_dim",
    )
)  # fmt: skip
register(
    Family(
        "qwen3_moe", "Qwen3MoeForCausalLM", with_qk_norm(parse_moe),
        functools.partial(decoder_recipes, mlp=moe_mlp),
        "Qwen3 + top-k softmax MoE (norm_topk_prob)", ep=True,
    )
)  # fmt: skip
