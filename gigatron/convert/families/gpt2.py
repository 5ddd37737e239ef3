"""GPT-2 (`GPT2LMHeadModel`): LayerNorm, learned positions, Conv1D weights, fused c_attn.

HF c_attn is a Conv1D [h, 3h] (bias [3h]) whose columns are [Q | K | V]; Megatron's fused rows
group them per head. c_proj / c_fc weights are Conv1D [in, out]: transposed. Keys are
`transformer.`-prefixed (GPT2LMHeadModel) or bare (GPT2Model).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from gigatron.convert._recipe_ops import (
    Recipe,
    qkv_from_megatron,
    qkv_to_megatron,
    same,
    transposed,
    vocab,
)
from gigatron.convert.families._family import Family, config_error
from gigatron.convert.families._registry import register

_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


def parse(cfg: dict):
    act = cfg.get("activation_function", "gelu_new")
    if act not in _GELU:
        raise config_error("gpt2", "activation_function", act, f"must be one of {sorted(_GELU)}")
    for key, ok in (
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
        ("add_cross_attention", False),
    ):
        if cfg.get(key, ok) != ok:
            raise config_error("gpt2", key, cfg.get(key), f"must be {ok}")
    h = cfg["n_embd"]
    config_kwargs = dict(
        num_layers=cfg["n_layer"],
        hidden_size=h,
        num_attention_heads=cfg["n_head"],
        ffn_hidden_size=cfg.get("n_inner") or 4 * h,
        layernorm_epsilon=cfg.get("layer_norm_epsilon", 1e-5),
        activation_func=functools.partial(F.gelu, approximate=_GELU[act]),
        hidden_dropout=cfg.get("resid_pdrop", 0.1),
        attention_dropout=cfg.get("attn_pdrop", 0.1),
        init_method_std=cfg.get("initializer_range", 0.02),
        add_bias_linear=True,
    )
    model_kwargs = dict(
        max_sequence_length=cfg.get("n_positions", 1024),
        position_embedding_type="learned_absolute",
        share_embeddings_and_output_weights=bool(cfg.get("tie_word_embeddings", True)),
    )
    return config_kwargs, model_kwargs, {}


def _c_attn(key: str, hf_key: str, heads: int) -> Recipe:
    """Conv1D c_attn [h, 3h] (or bias [3h]) = [Q | K | V] columns <-> fused rows."""

    def to_gig(t):
        rows = t.t() if t.dim() == 2 else t  # [3h, h] = [Q; K; V]
        return qkv_to_megatron(*rows.chunk(3, dim=0), heads, heads).contiguous()

    def to_hf(t):
        rows = torch.cat(qkv_from_megatron(t, heads, heads), dim=0)
        return ((rows.t() if rows.dim() == 2 else rows).contiguous(),)

    return Recipe(key, (hf_key,), to_gig, to_hf)


def _linear(key: str, hf_key: str) -> Recipe:
    return transposed(key, hf_key) if key.endswith("weight") else same(key, hf_key)


def recipes(spec, names, padded: int) -> list[Recipe]:
    p = "transformer." if "transformer.wte.weight" in names else ""
    c = spec.config_kwargs
    out = [
        vocab("embedding.word_embeddings.weight", p + "wte.weight", spec.vocab_size, padded),
        same("embedding.position_embeddings.weight", p + "wpe.weight"),
    ]
    for i in range(c["num_layers"]):
        h, g = f"{p}h.{i}.", f"decoder.layers.{i}."
        for s in ("weight", "bias"):
            out += [
                same(f"{g}self_attention.linear_qkv.layer_norm_{s}", f"{h}ln_1.{s}"),
                _c_attn(
                    f"{g}self_attention.linear_qkv.{s}",
                    f"{h}attn.c_attn.{s}",
                    c["num_attention_heads"],
                ),
                _linear(f"{g}self_attention.linear_proj.{s}", f"{h}attn.c_proj.{s}"),
                same(f"{g}mlp.linear_fc1.layer_norm_{s}", f"{h}ln_2.{s}"),
                _linear(f"{g}mlp.linear_fc1.{s}", f"{h}mlp.c_fc.{s}"),
                _linear(f"{g}mlp.linear_fc2.{s}", f"{h}mlp.c_proj.{s}"),
            ]
    out += [same(f"decoder.final_layernorm.{s}", f"{p}ln_f.{s}") for s in ("weight", "bias")]
    if not spec.tied:
        out.append(vocab("output_layer.weight", "lm_head.weight", spec.vocab_size, padded))
    return out


register(
    Family(
        "gpt2", "GPT2LMHeadModel", parse, recipes,
        "LayerNorm, learned positions, GELU (tanh), Conv1D fused c_attn, tied output",
    )
)  # fmt: skip
