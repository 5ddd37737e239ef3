"""DeepSeek-V2 / V3 tensors <-> gigatron's MLA + MoE checkpoint keys (see _recipe_ops.Recipe).

HF `model.layers.{i}.self_attn.`: q_a_proj -> linear_q_down_proj, q_a_layernorm ->
linear_q_up_proj.layer_norm_weight, q_b_proj -> linear_q_up_proj (or q_proj -> linear_q_proj when
q_lora_rank is null), kv_a_proj_with_mqa -> linear_kv_down_proj, kv_a_layernorm ->
linear_kv_up_proj.layer_norm_weight, kv_b_proj -> linear_kv_up_proj, o_proj -> linear_proj: the
same rows (both lay heads out [nope | rope] and [k_nope | v] per head, the rotary channels as
interleaved pairs). MLP: the first first_k_dense_replace layers are dense (GLU fc1 [gate; up]),
the others MoE: gate -> router (+ V3's e_score_correction_bias -> router.expert_bias), experts and
shared_experts as GLU MLPs.
"""

from __future__ import annotations

from gigatron.convert._recipe_ops import _glu, _same, _vocab


def _attention(g: str, a: str, q_lora: bool) -> list:
    s = f"{g}self_attention."
    out = [
        _same(f"{s}linear_kv_down_proj.weight", f"{a}kv_a_proj_with_mqa.weight"),
        _same(f"{s}linear_kv_up_proj.layer_norm_weight", f"{a}kv_a_layernorm.weight"),
        _same(f"{s}linear_kv_up_proj.weight", f"{a}kv_b_proj.weight"),
        _same(f"{s}linear_proj.weight", f"{a}o_proj.weight"),
    ]
    if not q_lora:
        return [_same(f"{s}linear_q_proj.weight", f"{a}q_proj.weight"), *out]
    return [
        _same(f"{s}linear_q_down_proj.weight", f"{a}q_a_proj.weight"),
        _same(f"{s}linear_q_up_proj.layer_norm_weight", f"{a}q_a_layernorm.weight"),
        _same(f"{s}linear_q_up_proj.weight", f"{a}q_b_proj.weight"),
        *out,
    ]


def _glu_mlp(g: str, h: str) -> list:
    return [
        _glu(f"{g}linear_fc1.weight", f"{h}gate_proj.weight", f"{h}up_proj.weight"),
        _same(f"{g}linear_fc2.weight", f"{h}down_proj.weight"),
    ]


def _moe(spec, g: str, h: str) -> list:
    c = spec.config_kwargs
    out = [
        _same(f"{g}pre_mlp_layernorm.weight", f"{h}post_attention_layernorm.weight"),
        _same(f"{g}mlp.router.weight", f"{h}mlp.gate.weight"),
    ]
    if c.get("moe_router_enable_expert_bias"):
        out.append(_same(f"{g}mlp.router.expert_bias", f"{h}mlp.gate.e_score_correction_bias"))
    for e in range(c["num_moe_experts"]):
        out += _glu_mlp(f"{g}mlp.experts.local_experts.{e}.", f"{h}mlp.experts.{e}.")
    if c.get("moe_shared_expert_intermediate_size"):
        out += _glu_mlp(f"{g}mlp.shared_experts.", f"{h}mlp.shared_experts.")
    return out


def deepseek_recipes(spec, names, padded: int) -> list:
    """All recipes of a DeepSeek-V2 / V3 model (`names` unused: no optional tensors)."""
    c = spec.config_kwargs
    out = [
        _vocab(
            "embedding.word_embeddings.weight", "model.embed_tokens.weight", spec.vocab_size, padded
        )
    ]
    for i, is_moe in enumerate(c["moe_layer_freq"]):
        h, g = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.append(_same(f"{g}input_layernorm.weight", f"{h}input_layernorm.weight"))
        out += _attention(g, f"{h}self_attn.", c["q_lora_rank"] is not None)
        if is_moe:
            out += _moe(spec, g, h)
        else:
            out.append(
                _same(f"{g}mlp.linear_fc1.layer_norm_weight", f"{h}post_attention_layernorm.weight")
            )
            out += _glu_mlp(f"{g}mlp.", f"{h}mlp.")
    out.append(_same("decoder.final_layernorm.weight", "model.norm.weight"))
    if not spec.tied:
        out.append(_vocab("output_layer.weight", "lm_head.weight", spec.vocab_size, padded))
    return out
