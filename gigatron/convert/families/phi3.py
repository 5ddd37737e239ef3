"""Phi-3 (`Phi3ForCausalLM`): the Llama decoder with fused projections.

`self_attn.qkv_proj` [(np + 2 ng) * hn, h] holds rows [Q; K; V] (regrouped per query group into
Megatron's fused QKV); `mlp.gate_up_proj` [2f, h] holds rows [gate; up], already Megatron's GLU
fc1 layout. `partial_rotary_factor` -> rotary_percent. LongRoPE (`rope_type: longrope`) is
refused (not in Megatron).
"""

from __future__ import annotations

import functools

from gigatron.convert.families._family import Family
from gigatron.convert.families._registry import register
from gigatron.convert.families.llama import decoder_recipes, dense_mlp, parse_llama_like


def parse(cfg: dict):
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    factor = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    config_kwargs, model_kwargs, spec_kwargs = parse_llama_like("phi3", cfg)
    config_kwargs["hidden_dropout"] = 0.0  # resid_pdrop / embd_pdrop: training-time only
    if factor != 1.0:
        model_kwargs["rotary_percent"] = factor
    return config_kwargs, model_kwargs, spec_kwargs


register(
    Family(
        "phi3", "Phi3ForCausalLM", parse,
        functools.partial(
            decoder_recipes, mlp=functools.partial(dense_mlp, fused=True), fused_qkv=True
        ),
        "Llama with fused qkv_proj and gate_up_proj, partial_rotary_factor",
    )
)  # fmt: skip
