"""Llama 1-3 / Mistral / Qwen2, and the Llama-style pieces other families build on.

Llama-style decoder (`model.layers.{i}.`): input_layernorm -> self_attn q/k/v/o_proj (RoPE,
grouped-query) -> post_attention_layernorm -> mlp gate/up/down_proj (SwiGLU), RMSNorm,
`model.norm`, `lm_head` (or tied). Other families reuse `parse_llama_like` (config) and
`decoder_recipes` (tensors) and change what differs: QK norm, fused projections, an MoE block.

Megatron names: num_key_value_heads -> num_query_groups, head_dim -> kv_channels,
intermediate_size -> ffn_hidden_size, rms_norm_eps -> layernorm_epsilon, rope_theta ->
rotary_base, Llama-3.1 `rope_type: llama3` -> rope_scaling / rope_scaling_factor (Megatron's
fixed low / high frequency factors 1 and 4 and original context 8192), `rope_type: linear` ->
seq_len_interpolation_factor (positions / factor: HF's frequencies / factor).
"""

from __future__ import annotations

import functools

import torch.nn.functional as F

from gigatron.convert._recipe_ops import Recipe, fused_qkv, glu, optional, qkv, same, vocab
from gigatron.convert.families._family import Family, config_error
from gigatron.convert.families._registry import register


def rope_kwargs(family: str, cfg: dict) -> dict:
    """GPTModel rotary kwargs from `rope_parameters` (transformers 5) or `rope_scaling` +
    `rope_theta` (transformers 4)."""
    rope, key = dict(cfg.get("rope_parameters") or {}), "rope_parameters"
    if not rope and cfg.get("rope_scaling"):
        rope, key = dict(cfg["rope_scaling"]), "rope_scaling"
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    out = dict(rotary_base=int(theta) if float(theta).is_integer() else theta)
    if kind == "default":
        return out
    if kind == "linear":  # HF inv_freq / factor == Megatron's positions / factor
        return {**out, "seq_len_interpolation_factor": float(rope["factor"])}
    if kind != "llama3":
        raise config_error(
            family, f"{key}.rope_type", kind, "must be 'default', 'linear' or 'llama3'"
        )
    for name, want in (
        ("low_freq_factor", 1.0),
        ("high_freq_factor", 4.0),
        ("original_max_position_embeddings", 8192),
    ):
        if float(rope.get(name, want)) != float(want):
            raise config_error(
                family, f"{key}.{name}", rope.get(name),
                f"must be {want} (Megatron's fixed Llama-3.1 scaling)",
            )  # fmt: skip
    out.update(rope_scaling=True, rope_scaling_factor=float(rope.get("factor", 8.0)))
    return out


def check_full_attention(family: str, cfg: dict) -> None:
    """Refuse sliding-window settings that would change the attention (full attention only);
    Mistral's and Mixtral's `sliding_window` is mapped instead (`sliding_window_kwargs`)."""
    if cfg.get("use_sliding_window", False):
        raise config_error(family, "use_sliding_window", True, "is not supported (full attention)")
    kinds = set(cfg.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise config_error(family, "layer_types", sorted(kinds), "must all be 'full_attention'")


def sliding_window_kwargs(family: str, cfg: dict) -> dict:
    """Mistral / Mixtral `sliding_window` W (each query sees itself and the W - 1 keys before
    it, transformers' rule) -> Megatron's window_size (W - 1, 0) on every layer; none (null, or
    a window covering the context) -> {}."""
    window = cfg.get("sliding_window")
    if family not in ("mistral", "mixtral") or window is None:
        return {}
    if not isinstance(window, int) or window < 1:
        raise config_error(family, "sliding_window", window, "must be null or a positive int")
    if window >= cfg["max_position_embeddings"]:
        return {}
    return {"window_size": (window - 1, 0)}


def parse_llama_like(family: str, cfg: dict, *, qkv_bias_only: bool = False):
    """(config_kwargs, model_kwargs, spec_kwargs) of a Llama-style decoder.

    qkv_bias_only: q/k/v carry a bias, o_proj and the MLP none (Qwen2); otherwise HF's
    `attention_bias` (q/k/v and o_proj) must equal `mlp_bias` (Megatron's add_bias_linear)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise config_error(family, "hidden_act", act, "must be 'silu'")
    check_full_attention(family, cfg)
    heads = cfg["num_attention_heads"]
    if qkv_bias_only:
        add_bias, add_qkv_bias = False, True
    else:
        attn_bias, mlp_bias = bool(cfg.get("attention_bias")), bool(cfg.get("mlp_bias"))
        if attn_bias != mlp_bias:  # HF's attention_bias also covers o_proj
            raise config_error(
                family, "attention_bias/mlp_bias", (attn_bias, mlp_bias),
                "must be equal (gigatron's add_bias_linear covers both)",
            )  # fmt: skip
        add_bias = add_qkv_bias = attn_bias
    config_kwargs = dict(
        num_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        num_attention_heads=heads,
        num_query_groups=cfg.get("num_key_value_heads") or heads,
        kv_channels=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        ffn_hidden_size=cfg["intermediate_size"],
        normalization="RMSNorm",
        layernorm_epsilon=cfg.get("rms_norm_eps", 1e-6),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=add_bias,
        add_qkv_bias=add_qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=cfg.get("attention_dropout", 0.0),
        init_method_std=cfg.get("initializer_range", 0.02),
        **sliding_window_kwargs(family, cfg),
    )
    model_kwargs = dict(
        max_sequence_length=cfg["max_position_embeddings"],
        position_embedding_type="rope",
        share_embeddings_and_output_weights=bool(cfg.get("tie_word_embeddings", False)),
        **rope_kwargs(family, cfg),
    )
    return config_kwargs, model_kwargs, {"normalization": "RMSNorm"}


def with_qk_norm(parse):
    """A parse function plus per-head q / k RMSNorm (Megatron's qk_layernorm)."""

    @functools.wraps(parse)
    def wrapped(cfg: dict):
        config_kwargs, model_kwargs, spec_kwargs = parse(cfg)
        config_kwargs["qk_layernorm"] = True
        return config_kwargs, model_kwargs, {**spec_kwargs, "qk_layernorm": True}

    return wrapped


# ------------------------------------------------------------------------------- tensors
def attention_recipes(spec, g: str, a: str, names, *, fused: bool = False) -> list[Recipe]:
    """Megatron `{g}self_attention.` <- HF `{a}` (`model.layers.{i}.self_attn.`): q/k/v_proj
    (or one fused qkv_proj), o_proj, optional biases and q_norm / k_norm."""
    c, s = spec.config_kwargs, f"{g}self_attention."
    heads, groups = c["num_attention_heads"], c["num_query_groups"]
    out = []
    for b in ("weight", "bias"):
        if fused:
            fused_rows = fused_qkv(f"{s}linear_qkv.{b}", f"{a}qkv_proj.{b}", heads, groups)
            out += optional(names, fused_rows)
        else:
            parts = (f"{a}q_proj.{b}", f"{a}k_proj.{b}", f"{a}v_proj.{b}")
            out += optional(names, qkv(f"{s}linear_qkv.{b}", *parts, heads, groups))
        out += optional(names, same(f"{s}linear_proj.{b}", f"{a}o_proj.{b}"))
    if c.get("qk_layernorm"):
        out += [
            same(f"{s}q_layernorm.weight", f"{a}q_norm.weight"),
            same(f"{s}k_layernorm.weight", f"{a}k_norm.weight"),
        ]
    return out


def dense_mlp(spec, i: int, names, *, fused: bool = False) -> list[Recipe]:
    """Layer i's pre-MLP RMSNorm + SwiGLU MLP (gate_proj / up_proj, or one gate_up_proj
    already in Megatron's [gate; up] row order) + down_proj."""
    h, g = f"model.layers.{i}.", f"decoder.layers.{i}.mlp."
    out = [same(f"{g}linear_fc1.layer_norm_weight", f"{h}post_attention_layernorm.weight")]
    for b in ("weight", "bias"):
        if fused:
            out += optional(names, same(f"{g}linear_fc1.{b}", f"{h}mlp.gate_up_proj.{b}"))
        else:
            fc1 = glu(f"{g}linear_fc1.{b}", f"{h}mlp.gate_proj.{b}", f"{h}mlp.up_proj.{b}")
            out += optional(names, fc1)
        out += optional(names, same(f"{g}linear_fc2.{b}", f"{h}mlp.down_proj.{b}"))
    return out


def decoder_recipes(spec, names, padded: int, *, mlp=dense_mlp, fused_qkv: bool = False):
    """Every tensor of a Llama-style model; `mlp(spec, i, names)` gives layer i's MLP block."""
    out = [
        vocab("embedding.word_embeddings.weight", "model.embed_tokens.weight", spec.vocab_size,
              padded)
    ]  # fmt: skip
    for i in range(spec.config_kwargs["num_layers"]):
        h, g = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.append(
            same(f"{g}self_attention.linear_qkv.layer_norm_weight", f"{h}input_layernorm.weight")
        )
        out += attention_recipes(spec, g, f"{h}self_attn.", names, fused=fused_qkv)
        out += mlp(spec, i, names)
    out.append(same("decoder.final_layernorm.weight", "model.norm.weight"))
    if not spec.tied:
        out.append(vocab("output_layer.weight", "lm_head.weight", spec.vocab_size, padded))
    return out


_LLAMA = "RMSNorm, RoPE (default / llama3 / linear scaling), GQA, SwiGLU, optional biases"
for _name, _cls, _parse, _features in (
    ("llama", "LlamaForCausalLM", functools.partial(parse_llama_like, "llama"), _LLAMA),
    ("mistral", "MistralForCausalLM", functools.partial(parse_llama_like, "mistral"),
     _LLAMA + ", head_dim, sliding_window (window_size (W - 1, 0))"),
    ("qwen2", "Qwen2ForCausalLM",
     functools.partial(parse_llama_like, "qwen2", qkv_bias_only=True), "Llama + q/k/v biases"),
):  # fmt: skip
    register(Family(_name, _cls, _parse, decoder_recipes, _features))
