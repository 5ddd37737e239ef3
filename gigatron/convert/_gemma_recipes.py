"""Gemma 2 / Gemma 3 (text) tensor recipes: HF names <-> gigatron's checkpoint keys.

Key names follow Megatron-Bridge's Gemma mappings (`linear_qkv.layer_norm_weight` for
input_layernorm, `mlp.linear_fc1.layer_norm_weight` for pre_feedforward_layernorm) and its Gemma
layer's submodules for the sandwich norms (`post_self_attn_layernorm`, `post_mlp_layernorm`).
Gemma's norm weights are stored as HF stores them (x * (1 + w): layernorm_zero_centered_gamma).
"""

from __future__ import annotations

from gigatron.convert._recipe_ops import Recipe, _glu, _same, _vocab
from gigatron.core.models.gpt.hf_mapping import qkv_from_megatron, qkv_to_megatron


def _qkv(key: str, prefix: str, heads: int, groups: int) -> Recipe:
    return Recipe(
        key,
        tuple(f"{prefix}{n}_proj.weight" for n in "qkv"),
        lambda tq, tk, tv: qkv_to_megatron(tq, tk, tv, heads, groups),
        lambda t: tuple(x.contiguous() for x in qkv_from_megatron(t, heads, groups)),
    )


def gemma_recipes(spec, names, padded: int) -> list[Recipe]:
    """Gemma2ForCausalLM / Gemma3ForCausalLM (`model.` keys; lm_head only when untied)."""
    c = spec.config_kwargs
    heads, groups = c["num_attention_heads"], c["num_query_groups"]
    out = [
        _vocab(
            "embedding.word_embeddings.weight", "model.embed_tokens.weight", spec.vocab_size, padded
        )
    ]
    for i in range(c["num_layers"]):
        h, g = f"model.layers.{i}.", f"decoder.layers.{i}."
        out += [
            _same(f"{g}self_attention.linear_qkv.layer_norm_weight", f"{h}input_layernorm.weight"),
            _qkv(f"{g}self_attention.linear_qkv.weight", f"{h}self_attn.", heads, groups),
            _same(f"{g}self_attention.linear_proj.weight", f"{h}self_attn.o_proj.weight"),
            _same(f"{g}post_self_attn_layernorm.weight", f"{h}post_attention_layernorm.weight"),
            _same(f"{g}mlp.linear_fc1.layer_norm_weight", f"{h}pre_feedforward_layernorm.weight"),
            _glu(f"{g}mlp.linear_fc1.weight", f"{h}mlp.gate_proj.weight", f"{h}mlp.up_proj.weight"),
            _same(f"{g}mlp.linear_fc2.weight", f"{h}mlp.down_proj.weight"),
            _same(f"{g}post_mlp_layernorm.weight", f"{h}post_feedforward_layernorm.weight"),
        ]
        if c.get("qk_layernorm"):
            out += [
                _same(f"{g}self_attention.q_layernorm.weight", f"{h}self_attn.q_norm.weight"),
                _same(f"{g}self_attention.k_layernorm.weight", f"{h}self_attn.k_norm.weight"),
            ]
    out.append(_same("decoder.final_layernorm.weight", "model.norm.weight"))
    if not spec.tied:
        out.append(_vocab("output_layer.weight", "lm_head.weight", spec.vocab_size, padded))
    return out
