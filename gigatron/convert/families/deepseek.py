"""DeepSeek-V2 / V3: multi-latent attention + MoE (MLATransformerConfig, the decoder block spec).

Megatron's names for DeepSeek's settings (as Megatron Bridge maps them):

    q_lora_rank / kv_lora_rank / v_head_dim       same names
    qk_nope_head_dim / qk_rope_head_dim           qk_head_dim / qk_pos_emb_head_dim
    rope_parameters (default | yarn)              rope_type 'rope' | 'yarn', rotary_base,
                                                  rotary_scaling_factor, beta_fast/slow, mscale..
    n_routed_experts / num_experts_per_tok        num_moe_experts / moe_router_topk
    moe_intermediate_size * n_shared_experts      moe_shared_expert_intermediate_size
    first_k_dense_replace                         moe_layer_freq = [0] * k + [1] * (L - k)
    routed_scaling_factor                         moe_router_topk_scaling_factor
    V2: softmax over all experts, no renorm       moe_router_pre_softmax=True
    V3: sigmoid, e_score_correction_bias,         moe_router_score_function='sigmoid',
        n_group / topk_group, renormalised        moe_router_enable_expert_bias,
                                                  moe_router_num_groups / moe_router_group_topk

Settings Megatron's MLA or router compute differently are a ValueError naming the key.
"""

from __future__ import annotations

import functools

import torch.nn.functional as F

from gigatron.convert._recipe_ops import glu, same, vocab
from gigatron.convert.families._family import Family
from gigatron.convert.families._family import config_error as _err
from gigatron.convert.families._registry import register


def _rope(family: str, cfg: dict) -> dict:
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    out = dict(rotary_base=float(theta), rotary_scaling_factor=1.0, mscale_all_dim=0.0)
    if kind == "default":
        return dict(out, rope_type="rope")
    if kind != "yarn":
        raise _err(family, "rope_parameters.rope_type", kind, "must be 'default' or 'yarn'")
    if rope.get("attention_factor") is not None or rope.get("truncate", True) is not True:
        raise _err(
            family, "rope_parameters", rope, "must not set attention_factor or truncate=false"
        )
    original = int(rope["original_max_position_embeddings"])
    factor = rope.get("factor") or cfg["max_position_embeddings"] / original
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if not (mscale and mscale_all_dim):  # HF then scales cos/sin by mscale(factor) alone
        mscale, mscale_all_dim = 1.0, 0.0
    return dict(
        out,
        rope_type="yarn",
        rotary_scaling_factor=float(factor),
        original_max_position_embeddings=original,
        beta_fast=float(rope.get("beta_fast") or 32),
        beta_slow=float(rope.get("beta_slow") or 1),
        mscale=float(mscale),
        mscale_all_dim=float(mscale_all_dim),
    )


def _router(family: str, cfg: dict) -> dict:
    topk, groups = cfg["num_experts_per_tok"], cfg.get("n_group") or 1
    topk_group = cfg.get("topk_group") or 1
    out = dict(moe_router_topk_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)))
    if family == "deepseek_v2":
        method = cfg.get("topk_method", "greedy")
        out.update(moe_router_score_function="softmax", moe_router_pre_softmax=True)
        if method == "greedy":
            return out
        if method != "group_limited_greedy":
            raise _err(family, "topk_method", method, "must be 'greedy' or 'group_limited_greedy'")
        if topk // topk_group != 1:  # HF ranks groups by their best expert
            raise _err(
                family,
                "num_experts_per_tok // topk_group",
                topk // topk_group,
                "must be 1 with group_limited_greedy (Megatron ranks a group by the sum of its "
                "top num_experts_per_tok // topk_group scores; HF by its best one)",
            )
        return dict(out, moe_router_num_groups=groups, moe_router_group_topk=topk_group)
    if cfg.get("topk_method", "noaux_tc") != "noaux_tc":
        raise _err(family, "topk_method", cfg["topk_method"], "must be 'noaux_tc'")
    if topk > 1 and not cfg.get("norm_topk_prob", True):
        raise _err(family, "norm_topk_prob", False, "must be true (Megatron renormalises)")
    out.update(
        moe_router_score_function="sigmoid",
        moe_router_pre_softmax=False,
        moe_router_enable_expert_bias=True,
    )
    if groups > 1:
        if topk // topk_group != 2:  # HF ranks groups by their top-2 scores
            raise _err(
                family,
                "num_experts_per_tok // topk_group",
                topk // topk_group,
                "must be 2 with n_group > 1 (HF ranks a group by its top-2 scores)",
            )
        out.update(moe_router_num_groups=groups, moe_router_group_topk=topk_group)
    return out


def parse_deepseek(family: str, cfg: dict) -> tuple[dict, dict, dict]:
    """(MLATransformerConfig kwargs, GPTModel kwargs, layer-spec kwargs) of a DeepSeek model."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise _err(family, "hidden_act", cfg.get("hidden_act"), "must be 'silu'")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise _err(family, key, cfg[key], "must be false")
    heads = cfg["num_attention_heads"]
    if cfg.get("num_key_value_heads", heads) != heads:
        raise _err(
            family, "num_key_value_heads", cfg["num_key_value_heads"],
            f"must equal num_attention_heads ({heads}) in MLA",
        )  # fmt: skip
    if family == "deepseek_v3" and cfg.get("rope_interleave", True) is not True:
        raise _err(family, "rope_interleave", False, "must be true (Megatron's MLA RoPE layout)")
    n, dense = cfg["num_hidden_layers"], cfg.get("first_k_dense_replace", 0)
    freq = cfg.get("moe_layer_freq", 1)
    if freq != 1:
        raise _err(family, "moe_layer_freq", freq, "must be 1")
    experts = cfg["n_routed_experts"]
    config_kwargs = dict(
        num_layers=n,
        hidden_size=cfg["hidden_size"],
        num_attention_heads=heads,
        ffn_hidden_size=cfg["intermediate_size"],
        normalization="RMSNorm",
        layernorm_epsilon=cfg.get("rms_norm_eps", 1e-6),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=cfg.get("attention_dropout", 0.0),
        init_method_std=cfg.get("initializer_range", 0.02),
        multi_latent_attention=True,
        qk_layernorm=True,
        q_lora_rank=cfg.get("q_lora_rank"),
        kv_lora_rank=cfg["kv_lora_rank"],
        qk_head_dim=cfg["qk_nope_head_dim"],
        qk_pos_emb_head_dim=cfg["qk_rope_head_dim"],
        v_head_dim=cfg["v_head_dim"],
        **_rope(family, cfg),
        num_moe_experts=experts,
        moe_layer_freq=[0] * dense + [1] * (n - dense),
        moe_router_topk=cfg["num_experts_per_tok"],
        moe_ffn_hidden_size=cfg["moe_intermediate_size"],
        moe_shared_expert_intermediate_size=(
            cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
            if cfg.get("n_shared_experts")
            else None
        ),
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_router_dtype="fp32",  # HF routes in fp32
        moe_token_dispatcher_type="alltoall",
        **_router(family, cfg),
    )
    model_kwargs = dict(
        max_sequence_length=cfg["max_position_embeddings"],
        position_embedding_type="rope",
        share_embeddings_and_output_weights=bool(cfg.get("tie_word_embeddings", False)),
        rotary_base=config_kwargs["rotary_base"],
    )
    spec_kwargs = dict(
        normalization="RMSNorm", multi_latent_attention=True, qk_layernorm=True,
        num_experts=experts,
    )  # fmt: skip
    return config_kwargs, model_kwargs, spec_kwargs


# ------------------------------------------------------------------------------- tensors
# DeepSeek-V2 / V3 tensors <-> gigatron's MLA + MoE checkpoint keys (see _recipe_ops.Recipe).
#
# HF `model.layers.{i}.self_attn.`: q_a_proj -> linear_q_down_proj, q_a_layernorm ->
# linear_q_up_proj.layer_norm_weight, q_b_proj -> linear_q_up_proj (or q_proj -> linear_q_proj when
# q_lora_rank is null), kv_a_proj_with_mqa -> linear_kv_down_proj, kv_a_layernorm ->
# linear_kv_up_proj.layer_norm_weight, kv_b_proj -> linear_kv_up_proj, o_proj -> linear_proj: the
# same rows (both lay heads out [nope | rope] and [k_nope | v] per head, the rotary channels as
# interleaved pairs). MLP: the first first_k_dense_replace layers are dense (GLU fc1 [gate; up]),
# the others MoE: gate -> router (+ V3's e_score_correction_bias -> router.expert_bias), experts and
# shared_experts as GLU MLPs.


def _attention(g: str, a: str, q_lora: bool) -> list:
    s = f"{g}self_attention."
    out = [
        same(f"{s}linear_kv_down_proj.weight", f"{a}kv_a_proj_with_mqa.weight"),
        same(f"{s}linear_kv_up_proj.layer_norm_weight", f"{a}kv_a_layernorm.weight"),
        same(f"{s}linear_kv_up_proj.weight", f"{a}kv_b_proj.weight"),
        same(f"{s}linear_proj.weight", f"{a}o_proj.weight"),
    ]
    if not q_lora:
        return [same(f"{s}linear_q_proj.weight", f"{a}q_proj.weight"), *out]
    return [
        same(f"{s}linear_q_down_proj.weight", f"{a}q_a_proj.weight"),
        same(f"{s}linear_q_up_proj.layer_norm_weight", f"{a}q_a_layernorm.weight"),
        same(f"{s}linear_q_up_proj.weight", f"{a}q_b_proj.weight"),
        *out,
    ]


def _glu_mlp(g: str, h: str) -> list:
    return [
        glu(f"{g}linear_fc1.weight", f"{h}gate_proj.weight", f"{h}up_proj.weight"),
        same(f"{g}linear_fc2.weight", f"{h}down_proj.weight"),
    ]


def _moe(spec, g: str, h: str) -> list:
    c = spec.config_kwargs
    out = [
        same(f"{g}pre_mlp_layernorm.weight", f"{h}post_attention_layernorm.weight"),
        same(f"{g}mlp.router.weight", f"{h}mlp.gate.weight"),
    ]
    if c.get("moe_router_enable_expert_bias"):
        out.append(same(f"{g}mlp.router.expert_bias", f"{h}mlp.gate.e_score_correction_bias"))
    for e in range(c["num_moe_experts"]):
        out += _glu_mlp(f"{g}mlp.experts.local_experts.{e}.", f"{h}mlp.experts.{e}.")
    if c.get("moe_shared_expert_intermediate_size"):
        out += _glu_mlp(f"{g}mlp.shared_experts.", f"{h}mlp.shared_experts.")
    return out


def deepseek_recipes(spec, names, padded: int) -> list:
    """All recipes of a DeepSeek-V2 / V3 model (`names` unused: no optional tensors)."""
    c = spec.config_kwargs
    out = [
        vocab(
            "embedding.word_embeddings.weight", "model.embed_tokens.weight", spec.vocab_size, padded
        )
    ]
    for i, is_moe in enumerate(c["moe_layer_freq"]):
        h, g = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.append(same(f"{g}input_layernorm.weight", f"{h}input_layernorm.weight"))
        out += _attention(g, f"{h}self_attn.", c["q_lora_rank"] is not None)
        if is_moe:
            out += _moe(spec, g, h)
        else:
            out.append(
                same(f"{g}mlp.linear_fc1.layer_norm_weight", f"{h}post_attention_layernorm.weight")
            )
            out += _glu_mlp(f"{g}mlp.", f"{h}mlp.")
    out.append(same("decoder.final_layernorm.weight", "model.norm.weight"))
    if not spec.tied:
        out.append(vocab("output_layer.weight", "lm_head.weight", spec.vocab_size, padded))
    return out


for _name in ("deepseek_v2", "deepseek_v3"):
    register(
        Family(
            _name, "DeepseekV3ForCausalLM" if _name == "deepseek_v3" else "DeepseekV2ForCausalLM",
            functools.partial(parse_deepseek, _name), deepseek_recipes,
            "MLA (q / kv LoRA, YaRN), dense first layers, routed + shared experts, "
            + ("sigmoid router with expert bias, group-limited top-k" if _name == "deepseek_v3"
               else "softmax router"),
            ep=True,
        )
    )  # fmt: skip
