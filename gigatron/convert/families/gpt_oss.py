"""GPT-OSS (`GptOssForCausalLM`): attention sinks, alternating sliding-window layers, YaRN
RoPE, and a top-k MoE block whose experts are stored stacked, with biases and clamped SwiGLU.

What each HF key becomes (Megatron-Bridge's GPT-OSS provider holds the same settings):

- `self_attn.sinks` [np] -> `softmax_type='learnable'`, `core_attention.softmax_offset`;
- `sliding_window` W and `layer_types` -> `window_size` (W - 1, 0) (HF counts the query itself)
  and `window_attn_skip_freq` (2 for GPT-OSS's sliding / full alternation);
- `rope_parameters` (yarn, `truncate: false`) -> position_embedding_type 'yarn' and the config's
  `yarn_*` fields (`_rope.yarn_kwargs`);
- `attention_bias` (q/k/v/o biases; the router and experts always carry biases) ->
  `add_bias_linear` (which also gives the router and the experts their biases, as in Megatron);
- the experts' clamped SwiGLU `(clamp(up, -l, l) + 1) * g * sigmoid(1.702 g)`, g = clamp(gate,
  max=l) -> `quick_gelu` GLU, `glu_linear_offset=1.0`, `activation_func_clamp_value=l`
  (`swiglu_alpha` must be 1.702: quick_gelu's constant);
- router: softmax over the top-k logits -> `moe_router_pre_softmax=False`.

Tensors (`stacked` recipes, one per global expert): `mlp.experts.gate_up_proj` [E, h, 2f] with
gate / up columns interleaved -> `local_experts.{e}.linear_fc1.weight` [2f, h] = [gate; up] rows
(transposed, de-interleaved); `gate_up_proj_bias` [E, 2f] likewise; `down_proj` [E, f, h] ->
`linear_fc2.weight` [h, f] (transposed); `down_proj_bias` [E, h] -> `linear_fc2.bias`.
GroupedMLP has no biases: GPT-OSS builds SequentialMLP experts.
"""

from __future__ import annotations

from gigatron.convert._recipe_ops import Recipe, interleave_glu, interleaved_glu, same, stacked
from gigatron.convert.families._family import Family, config_error
from gigatron.convert.families._registry import register
from gigatron.convert.families._rope import yarn_kwargs
from gigatron.convert.families.gemma import _skip_freq
from gigatron.convert.families.llama import decoder_recipes, parse_llama_like
from gigatron.core.activations import quick_gelu

_FAMILY = "gpt_oss"


def _window(cfg: dict, num_layers: int) -> dict:
    kinds = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)
    ]
    if set(kinds) - {"sliding_attention", "full_attention"} or len(kinds) != num_layers:
        raise config_error(
            _FAMILY, "layer_types", kinds, "must list sliding/full_attention per layer"
        )
    window = cfg.get("sliding_window")
    if window is None or "sliding_attention" not in kinds:
        return {}
    if not isinstance(window, int) or window < 1:
        raise config_error(_FAMILY, "sliding_window", window, "must be null or a positive int")
    return dict(window_size=(window - 1, 0), window_attn_skip_freq=_skip_freq(kinds))


def parse(cfg: dict):
    if not cfg.get("attention_bias", True):
        raise config_error(
            _FAMILY, "attention_bias", False,
            "must be true (add_bias_linear covers attention, router and experts together)",
        )  # fmt: skip
    if float(cfg.get("swiglu_alpha", 1.702)) != 1.702:
        raise config_error(_FAMILY, "swiglu_alpha", cfg["swiglu_alpha"],
                           "must be 1.702 (quick_gelu's constant)")  # fmt: skip
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("yarn", "default"):
        raise config_error(_FAMILY, "rope_parameters.rope_type", kind,
                           "must be 'yarn' or 'default'")  # fmt: skip
    # the Llama mapping for shapes, norms and the default RoPE; then what GPT-OSS changes
    base_cfg = {**cfg, "rope_parameters": {"rope_type": "default",
                                           "rope_theta": rope.get("rope_theta", 150000.0)},
                "rope_scaling": None, "layer_types": None, "attention_bias": True,
                "mlp_bias": True, "hidden_act": "silu"}  # fmt: skip
    config_kwargs, model_kwargs, spec_kwargs = parse_llama_like(_FAMILY, base_cfg)
    experts = cfg.get("num_local_experts") or cfg["num_experts"]  # HF's attribute_map alias
    config_kwargs.update(
        activation_func=quick_gelu,
        glu_linear_offset=1.0,
        activation_func_clamp_value=float(cfg.get("swiglu_limit", 7.0)),
        softmax_type="learnable",
        num_moe_experts=experts,
        moe_router_topk=cfg["num_experts_per_tok"],
        moe_ffn_hidden_size=cfg["intermediate_size"],
        moe_aux_loss_coeff=cfg.get("router_aux_loss_coef", 0.0),
        moe_router_pre_softmax=False,
        moe_token_dispatcher_type="alltoall",
        **_window(cfg, config_kwargs["num_layers"]),
    )
    if kind == "yarn":
        yarn_config, yarn_model = yarn_kwargs(_FAMILY, rope, "rope_parameters", cfg)
        config_kwargs.update(yarn_config)
        model_kwargs.update(yarn_model)
    return config_kwargs, model_kwargs, {**spec_kwargs, "num_experts": experts}


def _transpose(t):
    return t.t()


def _fc1_weight(t):  # HF [h, 2f] columns interleaved -> [2f, h] rows [gate; up]
    return interleaved_glu(t.t())


def _fc1_weight_back(t):
    return interleave_glu(t).t()


def gpt_oss_mlp(spec, i: int, names) -> list[Recipe]:
    """Layer i's sinks, pre-MLP norm, router (weight + bias) and the stacked experts."""
    c = spec.config_kwargs
    h, g = f"model.layers.{i}.", f"decoder.layers.{i}."
    m, x = f"{h}mlp.", f"{h}mlp.experts."
    out = [
        same(f"{g}self_attention.core_attention.softmax_offset", f"{h}self_attn.sinks"),
        same(f"{g}mlp.linear_fc1.layer_norm_weight", f"{h}post_attention_layernorm.weight"),
        same(f"{g}mlp.router.weight", f"{m}router.weight"),
        same(f"{g}mlp.router.bias", f"{m}router.bias"),
    ]
    num = c["num_moe_experts"]
    for e in range(num):
        y = f"{g}mlp.experts.local_experts.{e}."
        out += [
            stacked(f"{y}linear_fc1.weight", f"{x}gate_up_proj", e, num, _fc1_weight,
                    _fc1_weight_back),
            stacked(f"{y}linear_fc1.bias", f"{x}gate_up_proj_bias", e, num, interleaved_glu,
                    interleave_glu),
            stacked(f"{y}linear_fc2.weight", f"{x}down_proj", e, num, _transpose, _transpose),
            stacked(f"{y}linear_fc2.bias", f"{x}down_proj_bias", e, num),
        ]  # fmt: skip
    return out


def recipes(spec, names, padded: int):
    return decoder_recipes(spec, names, padded, mlp=gpt_oss_mlp)


register(
    Family(
        _FAMILY, "GptOssForCausalLM", parse, recipes,
        "attention sinks, alternating sliding window, YaRN RoPE, top-k MoE with stacked "
        "experts, expert / router biases, clamped SwiGLU",
        ep=True,
    )
)  # fmt: skip
