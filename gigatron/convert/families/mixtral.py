"""Mixtral (`MixtralForCausalLM`): the Llama decoder with a top-k MoE block in every layer.

HF `block_sparse_moe.gate` [E, h] is the router; `experts.{e}.w1` (gate), `w3` (up), `w2`
(down). HF's softmax over all experts, then the top-k renormalised, equals Megatron's default
softmax over the top-k logits (moe_router_pre_softmax=False).
"""

from __future__ import annotations

import functools

from gigatron.convert.families._family import Family, config_error
from gigatron.convert.families._moe import moe_mlp
from gigatron.convert.families._registry import register
from gigatron.convert.families.llama import decoder_recipes, parse_llama_like


def parse(cfg: dict):
    config_kwargs, model_kwargs, spec_kwargs = parse_llama_like("mixtral", cfg)
    if cfg.get("router_jitter_noise", 0.0):
        noise = cfg["router_jitter_noise"]
        raise config_error("mixtral", "router_jitter_noise", noise, "must be 0")
    num_experts = cfg["num_local_experts"]
    config_kwargs.update(
        num_moe_experts=num_experts,
        moe_router_topk=cfg["num_experts_per_tok"],
        moe_ffn_hidden_size=cfg["intermediate_size"],
        moe_aux_loss_coeff=cfg.get("router_aux_loss_coef", 0.0),
        moe_router_pre_softmax=False,
        moe_token_dispatcher_type="alltoall",
    )
    return config_kwargs, model_kwargs, {**spec_kwargs, "num_experts": num_experts}


_MLP = functools.partial(moe_mlp, block="block_sparse_moe", gate="w1", up="w3", down="w2")
register(
    Family(
        "mixtral", "MixtralForCausalLM", parse, functools.partial(decoder_recipes, mlp=_MLP),
        "Llama + top-k softmax MoE (router, per-expert SwiGLU)", ep=True,
    )
)  # fmt: skip
