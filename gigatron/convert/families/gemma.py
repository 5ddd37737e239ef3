"""Gemma 2 (`Gemma2ForCausalLM`) and Gemma 3 text (`Gemma3ForCausalLM`, model_type gemma3_text).

Megatron-Bridge's Gemma2 / Gemma3 providers hold the same settings. What each HF key becomes:

- `hidden_activation` gelu_pytorch_tanh -> GeGLU (gated_linear_unit, tanh GELU);
- Gemma's RMSNorm x * (1 + w) -> `layernorm_zero_centered_gamma` (the weight maps unchanged);
- the four norms of a layer -> the pre-norms plus `post_self_attn_layernorm` / `post_mlp_layernorm`;
- the sqrt(hidden) embedding normaliser -> `apply_embedding_scaling`;
- `query_pre_attn_scalar` -> `softmax_scale` = query_pre_attn_scalar ** -0.5;
- `attn_logit_softcapping` / `final_logit_softcapping` -> the fields of those names;
- `sliding_window` W and `layer_types` -> `window_size` (W - 1, 0) (HF counts the query itself) and
  `window_attn_skip_freq` (an int when the pattern is every k-th layer global, else a 0/1 list);
- Gemma 3's `rope_parameters["sliding_attention"]` -> `rotary_base_local`; the global layers'
  RoPE (`full_attention`, default or linear scaling) -> the model's `rotary_base` and
  `seq_len_interpolation_factor`; Gemma 3's q/k norms -> `qk_layernorm`.

Tensors: the Llama decoder's names (`llama.decoder_recipes`) with Gemma's four norms per layer:
input_layernorm -> `linear_qkv.layer_norm_weight`, post_attention_layernorm ->
`post_self_attn_layernorm`, pre_feedforward_layernorm -> `mlp.linear_fc1.layer_norm_weight`,
post_feedforward_layernorm -> `post_mlp_layernorm` (Megatron-Bridge's Gemma layer submodules).
The norm weights map unchanged (x * (1 + w) is layernorm_zero_centered_gamma).
"""

from __future__ import annotations

import functools

import torch.nn.functional as F

from gigatron.convert._recipe_ops import Recipe, glu, same
from gigatron.convert.families._family import Family, config_error
from gigatron.convert.families._registry import register
from gigatron.convert.families.llama import decoder_recipes

_TANH_GELU = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new", "gelu_fast")


def _base(theta) -> float | int:
    return int(theta) if float(theta).is_integer() else float(theta)


def _skip_freq(layer_types: list[str]) -> int | list[int] | None:
    """HF layer_types -> Megatron's window_attn_skip_freq (1 = sliding window)."""
    pattern = [int(t == "sliding_attention") for t in layer_types]
    if all(pattern):
        return None
    first_global = pattern.index(0) + 1
    if pattern == [int((i + 1) % first_global != 0) for i in range(len(pattern))]:
        return first_global
    return pattern


def _window(family: str, cfg: dict, num_layers: int) -> dict:
    kinds = cfg.get("layer_types") or (
        ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
        if family == "gemma2"
        else [
            "sliding_attention"
            if (i + 1) % cfg.get("sliding_window_pattern", 6)
            else "full_attention"
            for i in range(num_layers)
        ]
    )
    bad = set(kinds) - {"sliding_attention", "full_attention"}
    if bad or len(kinds) != num_layers:
        raise config_error(
            family, "layer_types", kinds, "must list sliding/full_attention per layer"
        )
    window = cfg.get("sliding_window")
    if window is None or "sliding_attention" not in kinds:
        return {}
    if int(window) < 1:
        raise config_error(family, "sliding_window", window, "must be >= 1")
    return dict(window_size=(int(window) - 1, 0), window_attn_skip_freq=_skip_freq(kinds))


def _global_rope(family: str, rope: dict, key: str) -> dict:
    kind = rope.get("rope_type", rope.get("type", "default"))
    out = dict(rotary_base=_base(rope.get("rope_theta", 10000.0)))
    if kind == "linear":
        out["seq_len_interpolation_factor"] = float(rope["factor"])
    elif kind != "default":
        raise config_error(family, f"{key}.rope_type", kind, "must be 'default' or 'linear'")
    return out


def _rope(family: str, cfg: dict) -> tuple[dict, dict]:
    """(TransformerConfig kwargs, GPTModel kwargs) of the RoPE settings."""
    rope = dict(cfg.get("rope_parameters") or {})
    if family == "gemma2":
        rope = rope or dict(rope_theta=cfg.get("rope_theta", 10000.0))
        return {}, _global_rope(family, rope, "rope_parameters")
    full = dict(rope.get("full_attention") or {"rope_theta": cfg.get("rope_theta", 1e6)})
    if not rope and cfg.get("rope_scaling"):
        full.update(cfg["rope_scaling"])
    local = dict(
        rope.get("sliding_attention") or {"rope_theta": cfg.get("rope_local_base_freq", 1e4)}
    )
    if local.get("rope_type", "default") != "default":
        raise config_error(
            family,
            "rope_parameters.sliding_attention.rope_type",
            local.get("rope_type"),
            "must be 'default'",
        )
    config = dict(rotary_base_local=_base(local.get("rope_theta", 10000.0)))
    return config, _global_rope(family, full, "rope_parameters.full_attention")


def parse_gemma(family: str, cfg: dict):
    """(TransformerConfig kwargs, GPTModel kwargs, layer-spec kwargs) of a Gemma 2 / 3 text
    config.json; ValueError naming the key for a setting gigatron cannot reproduce."""
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in _TANH_GELU:
        raise config_error(family, "hidden_activation", act, f"must be one of {_TANH_GELU}")
    if cfg.get("attention_bias"):
        raise config_error(family, "attention_bias", True, "must be false (Gemma has no biases)")
    if cfg.get("use_bidirectional_attention"):
        raise config_error(
            family, "use_bidirectional_attention", True, "must be false (causal only)"
        )
    heads = cfg["num_attention_heads"]
    layers = cfg["num_hidden_layers"]
    rope_config, model_rope = _rope(family, cfg)
    config_kwargs = dict(
        num_layers=layers,
        hidden_size=cfg["hidden_size"],
        num_attention_heads=heads,
        num_query_groups=cfg.get("num_key_value_heads") or heads,
        kv_channels=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        ffn_hidden_size=cfg["intermediate_size"],
        normalization="RMSNorm",
        layernorm_zero_centered_gamma=True,
        layernorm_epsilon=cfg.get("rms_norm_eps", 1e-6),
        gated_linear_unit=True,
        activation_func=functools.partial(F.gelu, approximate="tanh"),
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=cfg.get("attention_dropout", 0.0),
        init_method_std=cfg.get("initializer_range", 0.02),
        softmax_scale=cfg.get("query_pre_attn_scalar", 256) ** -0.5,
        attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        post_self_attn_layernorm=True,
        post_mlp_layernorm=True,
        apply_embedding_scaling=True,
        qk_layernorm=family == "gemma3_text",
        **_window(family, cfg, layers),
        **rope_config,
    )
    model_kwargs = dict(
        max_sequence_length=cfg["max_position_embeddings"],
        position_embedding_type="rope",
        share_embeddings_and_output_weights=bool(cfg.get("tie_word_embeddings", True)),
        **model_rope,
    )
    spec_kwargs = {"normalization": "RMSNorm", "qk_layernorm": family == "gemma3_text"}
    return config_kwargs, model_kwargs, spec_kwargs


def gemma_mlp(spec, i: int, names) -> list[Recipe]:
    """Layer i's sandwich norms and GeGLU MLP (the llama decoder's `mlp` slot)."""
    h, g = f"model.layers.{i}.", f"decoder.layers.{i}."
    out = [
        same(f"{g}post_self_attn_layernorm.weight", f"{h}post_attention_layernorm.weight"),
        same(f"{g}mlp.linear_fc1.layer_norm_weight", f"{h}pre_feedforward_layernorm.weight"),
        glu(f"{g}mlp.linear_fc1.weight", f"{h}mlp.gate_proj.weight", f"{h}mlp.up_proj.weight"),
        same(f"{g}mlp.linear_fc2.weight", f"{h}mlp.down_proj.weight"),
        same(f"{g}post_mlp_layernorm.weight", f"{h}post_feedforward_layernorm.weight"),
    ]
    return out


_GEMMA = (
    "RMSNorm x (1 + w), sandwich norms, GeGLU, sqrt(h) embedding scale, query_pre_attn_scalar, "
    "sliding-window / global layers"
)
register(
    Family(
        "gemma2", "Gemma2ForCausalLM", functools.partial(parse_gemma, "gemma2"),
        functools.partial(decoder_recipes, mlp=gemma_mlp),
        _GEMMA + ", attention / final logit soft-capping",
    )
)  # fmt: skip
register(
    Family(
        "gemma3_text", "Gemma3ForCausalLM", functools.partial(parse_gemma, "gemma3_text"),
        functools.partial(decoder_recipes, mlp=gemma_mlp),
        _GEMMA + ", QK norm, local RoPE base, linear RoPE scaling",
    )
)  # fmt: skip
