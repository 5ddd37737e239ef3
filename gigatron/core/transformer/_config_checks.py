"""Validation and derived defaults of TransformerConfig, grouped by topic.

Each check raises ValueError naming the field, its value and the rule, before any collective runs.
"""

from __future__ import annotations

import math
import numbers

from gigatron.core.transformer._layer_split import layer_split

SUPPORTED_RECOMPUTE_MODULES = (
    "core_attn",
    "mlp",
    "moe",
    "shared_experts",
    "moe_act",
    "layernorm",
    "mla_up_proj",
)


def check_architecture(cfg) -> None:
    for name in ("num_layers", "num_attention_heads"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} ({getattr(cfg, name)}) must be set to a positive value")
    # 0 is Megatron's default: a config carrying only parallel / precision settings (as the one
    # DistributedDataParallel takes); MegatronModule refuses to build a layer from it.
    if cfg.hidden_size < 0:
        raise ValueError(f"hidden_size ({cfg.hidden_size}) must be positive (or 0: unset)")
    if cfg.fp16 and cfg.bf16:
        raise ValueError("fp16=True and bf16=True are exclusive; set at most one")
    if cfg.mtp_num_layers is not None and cfg.mtp_num_layers < 0:
        raise ValueError(f"mtp_num_layers ({cfg.mtp_num_layers}) must be None or >= 0")
    tp = cfg.tensor_model_parallel_size
    if cfg.num_attention_heads % tp != 0:
        raise ValueError(
            f"num_attention_heads ({cfg.num_attention_heads}) must be a multiple of "
            f"tensor_model_parallel_size ({tp})"
        )
    ng = cfg.num_query_groups if cfg.num_query_groups is not None else cfg.num_attention_heads
    if ng <= 0 or cfg.num_attention_heads % ng != 0:
        raise ValueError(
            f"num_query_groups ({ng}) must divide num_attention_heads ({cfg.num_attention_heads})"
        )
    if ng % tp != 0 and tp % ng != 0:
        raise ValueError(
            f"num_query_groups ({ng}) must be a multiple or divisor of "
            f"tensor_model_parallel_size ({tp})"
        )
    if cfg.normalization not in ("LayerNorm", "RMSNorm"):
        raise ValueError(f"normalization ({cfg.normalization!r}) must be 'LayerNorm' or 'RMSNorm'")
    for name in ("hidden_dropout", "attention_dropout"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"{name} ({getattr(cfg, name)}) must be in [0, 1]")
    if cfg.transformer_impl not in ("local", "transformer_engine", "inference_optimized"):
        raise ValueError(
            f"transformer_impl ({cfg.transformer_impl!r}) must be 'local', "
            "'transformer_engine' or 'inference_optimized'"
        )
    if cfg.num_moe_experts is not None and cfg.num_moe_experts <= 0:
        raise ValueError(f"num_moe_experts ({cfg.num_moe_experts}) must be positive or None")


# float fields (TransformerConfig and MLATransformerConfig) -> the values their math needs; an
# unset (None) field is skipped, a list (moe_aux_loss_coeff per balancing type) checked entrywise.
# NaN passes every `<` / `<=` test, so each rule is checked as "finite and ...".
_RULES = {
    "finite": lambda v: True,
    ">= 0": lambda v: v >= 0,
    "> 0": lambda v: v > 0,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "in (0, 1]": lambda v: 0 < v <= 1,
}
FLOAT_FIELDS = {
    "layernorm_epsilon": ">= 0",
    "init_method_std": ">= 0",
    "mtp_loss_scaling_factor": "finite",
    "embedding_init_method_std": ">= 0",
    "glu_linear_offset": "finite",
    "softmax_scale": "> 0",
    "moe_router_topk_scaling_factor": "> 0",
    "moe_router_bias_update_rate": ">= 0",
    "moe_aux_loss_coeff": ">= 0",  # NaN or < 0 turned load balancing off
    "moe_z_loss_coeff": ">= 0",
    "moe_input_jitter_eps": "in [0, 1)",  # noise U(1 - eps, 1 + eps) keeps the input's sign
    "moe_expert_capacity_factor": "> 0",
    "rotary_base": "> 0",
    "rotary_base_local": "> 0",
    "attn_logit_softcapping": "> 0",
    "final_logit_softcapping": "> 0",
    "rotary_percent": "in (0, 1]",
    "rotary_scaling_factor": "> 0",
    "beta_fast": "> 0",
    "beta_slow": "> 0",
    "mscale": ">= 0",
    "mscale_all_dim": ">= 0",
}


def _real(v) -> float | None:
    """`v` as a float when it is a real number (numpy scalars and 0-d tensors included, bools
    not), else None."""
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return None
    if isinstance(v, numbers.Real):
        return float(v)
    if getattr(v, "ndim", None) == 0 and hasattr(v, "is_floating_point"):  # a 0-d torch tensor
        if str(v.dtype) == "torch.bool" or v.is_complex():
            return None
        return float(v)
    return None


def check_value_ranges(cfg) -> None:
    """Each `FLOAT_FIELDS` field set on `cfg` is a finite number within its rule (one
    ValueError naming the field, the value and the rule)."""
    for name, rule in FLOAT_FIELDS.items():
        value = getattr(cfg, name, None)
        if value is None:
            continue
        entries = value if isinstance(value, (list, tuple)) else [value]
        for i, v in enumerate(entries):
            x = _real(v)
            ok = x is not None and math.isfinite(x)
            if not (ok and _RULES[rule](x)):
                where = f"{name}[{i}]" if entries is value else name
                tail = "" if rule == "finite" else f" {rule}"
                raise ValueError(f"{where} ({v!r}) must be a finite number{tail}")


def fill_defaults(cfg) -> None:
    from gigatron.core.transformer.utils import init_method_normal, scaled_init_method_normal

    if cfg.ffn_hidden_size is None:
        cfg.ffn_hidden_size = 4 * cfg.hidden_size
    if cfg.kv_channels is None:
        cfg.kv_channels = cfg.hidden_size // cfg.num_attention_heads
    if cfg.num_query_groups is None:
        cfg.num_query_groups = cfg.num_attention_heads
    if cfg.init_method is None:
        cfg.init_method = init_method_normal(cfg.init_method_std)
    if cfg.output_layer_init_method is None:
        cfg.output_layer_init_method = scaled_init_method_normal(
            cfg.init_method_std, cfg.num_layers
        )
    if cfg.embedding_init_method is None:
        if cfg.embedding_init_method_std is None:
            cfg.embedding_init_method = cfg.init_method
        else:
            cfg.embedding_init_method = init_method_normal(cfg.embedding_init_method_std)
    if cfg.apply_query_key_layer_scaling:
        cfg.attention_softmax_in_fp32 = True
    if cfg.moe_ffn_hidden_size is None and cfg.num_moe_experts is not None:
        cfg.moe_ffn_hidden_size = cfg.ffn_hidden_size


def check_recompute(cfg) -> None:
    gran, method, n = cfg.recompute_granularity, cfg.recompute_method, cfg.recompute_num_layers
    if gran not in (None, "full", "selective"):
        raise ValueError(f"recompute_granularity ({gran!r}) must be None, 'full' or 'selective'")
    if method not in (None, "uniform", "block"):
        raise ValueError(f"recompute_method ({method!r}) must be None, 'uniform' or 'block'")
    if gran == "full":
        if method is None:
            raise ValueError(
                "recompute_granularity='full' requires recompute_method (uniform|block)"
            )
        layers_per_stage = cfg.num_layers // cfg.pipeline_model_parallel_size
        if n is None or not 1 <= n <= layers_per_stage:
            raise ValueError(
                f"recompute_num_layers ({n}) must be between 1 and the layers per pipeline stage "
                f"({layers_per_stage}) when recompute_granularity='full'"
            )
    elif gran == "selective":
        if n is not None:
            raise ValueError(
                f"recompute_num_layers ({n}) must be None when recompute_granularity='selective'"
            )
    elif method is not None:
        raise ValueError(f"recompute_method ({method!r}) needs recompute_granularity to be set")
    if cfg.recompute_modules is None:
        cfg.recompute_modules = ["core_attn"]
    for module in cfg.recompute_modules:
        if module not in SUPPORTED_RECOMPUTE_MODULES:
            raise ValueError(
                f"recompute_modules entry {module!r} is not supported by gigatron "
                f"(supported: {', '.join(SUPPORTED_RECOMPUTE_MODULES)})"
            )
    if gran == "selective":  # Megatron's rules for the module names
        modules = cfg.recompute_modules
        if "moe_act" in modules and not cfg.moe_grouped_gemm:
            raise ValueError("moe_act in recompute_modules is only supported with moe_grouped_gemm")
        if "mla_up_proj" in modules and not getattr(cfg, "multi_latent_attention", False):
            raise ValueError(
                "mla_up_proj in recompute_modules is only supported with multi_latent_attention"
            )
        if (
            "shared_experts" in modules
            and cfg.moe_shared_expert_intermediate_size is not None
            and cfg.moe_shared_expert_overlap
        ):
            raise ValueError(
                "shared_experts recompute cannot work with moe_shared_expert_overlap=True"
            )


def check_pipeline(cfg) -> None:
    """The layer split must exist: even (L divisible by PP, and by VPP per stage) or uneven with
    num_layers_in_first/last_pipeline_stage and the accounting flags (same rules as Megatron)."""
    layer_split(
        cfg.num_layers,
        cfg.pipeline_model_parallel_size,
        cfg.virtual_pipeline_model_parallel_size,
        num_layers_in_first_pipeline_stage=cfg.num_layers_in_first_pipeline_stage,
        num_layers_in_last_pipeline_stage=cfg.num_layers_in_last_pipeline_stage,
        account_for_embedding_in_pipeline_split=cfg.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=cfg.account_for_loss_in_pipeline_split,
    )


def check_context_parallel(cfg) -> None:
    """gigatron's context-parallel attention has no dropout: refuse it here rather than at the
    first training forward."""
    cp = cfg.context_parallel_size
    if cp > 1 and cfg.attention_dropout > 0:
        raise ValueError(
            f"attention_dropout ({cfg.attention_dropout}) must be 0 when context_parallel_size "
            f"({cp}) > 1: gigatron's context-parallel attention has no dropout; set "
            "attention_dropout=0.0"
        )


def check_mla(cfg) -> None:
    """MLATransformerConfig: positive ranks and head dims, a known RoPE type, no Megatron-only
    MLA kernels (latent cache, fused down-projection)."""
    names = ["kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"]
    if cfg.q_lora_rank is not None:
        names.insert(0, "q_lora_rank")
    for name in names:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} ({getattr(cfg, name)}) must be positive")
    if cfg.qk_pos_emb_head_dim % 2:
        raise ValueError(f"qk_pos_emb_head_dim ({cfg.qk_pos_emb_head_dim}) must be even (RoPE)")
    if cfg.rope_type not in ("rope", "yarn"):
        raise ValueError(f"rope_type ({cfg.rope_type!r}) must be 'rope' or 'yarn'")
    for name in ("cache_mla_latents", "mla_down_proj_fusion"):
        if getattr(cfg, name):
            raise ValueError(
                f"{name}=True is not supported by gigatron's multi-latent attention; leave it False"
            )


def expand_no_rope_freq(cfg) -> None:
    """NoPE layers: `no_rope_freq` k -> per-layer pattern [0]*(k-1)+[1] repeated (every k-th
    layer skips RoPE); a list must have one 0/1 entry per layer. Megatron asserts both rules
    (AssertionError, the type its tests expect)."""
    freq = cfg.no_rope_freq
    if not freq:
        return
    if getattr(cfg, "multi_latent_attention", False):
        raise ValueError("no_rope_freq is not supported by gigatron with multi_latent_attention")
    if isinstance(freq, int):
        if cfg.num_layers % freq != 0:
            raise AssertionError(f"no_rope_freq={freq} should divide num_layers ({cfg.num_layers})")
        cfg.no_rope_freq = ([0] * (freq - 1) + [1]) * (cfg.num_layers // freq)
    elif len(freq) != cfg.num_layers:
        raise AssertionError(
            f"no_rope_freq has {len(freq)} entries; it needs one per layer ({cfg.num_layers})"
        )


SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")


def check_attention_variants(cfg) -> None:
    """Sliding windows, soft-capping, the local RoPE base (Gemma / Mistral / GPT-OSS), attention
    sinks and the GLU clamp (GPT-OSS): well-formed values; window_size becomes a tuple and a
    window_attn_skip_freq pattern a list (YAML and JSON give lists)."""
    if cfg.softmax_type not in SOFTMAX_TYPES:
        raise ValueError(f"softmax_type ({cfg.softmax_type!r}) must be one of {SOFTMAX_TYPES}")
    _check_window(cfg)
    if cfg.attn_logit_softcapping and cfg.apply_query_key_layer_scaling:
        raise ValueError(
            f"attn_logit_softcapping ({cfg.attn_logit_softcapping}) caps the true scores; "
            "apply_query_key_layer_scaling (True) divides them by layer_number first: set it False"
        )
    if cfg.rotary_base_local is not None and cfg.window_size is None:
        raise ValueError(
            f"rotary_base_local ({cfg.rotary_base_local}) applies to sliding-window layers: set "
            "window_size too"
        )
    _check_clamp(cfg)


def _check_window(cfg) -> None:
    """window_size: two ints >= -1 (-1 = unbounded); window_attn_skip_freq: an int >= 1 or
    one int per layer (its truth: sliding window)."""
    window, freq = cfg.window_size, cfg.window_attn_skip_freq
    if window is not None:
        if (
            not isinstance(window, (tuple, list))
            or len(window) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window)
        ):
            raise ValueError(
                f"window_size ({window!r}) must be a pair of ints (left, right), each >= -1 "
                "(-1 = unbounded)"
            )
        cfg.window_size = tuple(window)
    if isinstance(freq, (list, tuple)):
        if len(freq) != cfg.num_layers or not all(isinstance(v, int) for v in freq):
            raise ValueError(
                f"window_attn_skip_freq ({list(freq)}) needs one int entry per layer "
                f"(num_layers = {cfg.num_layers}; 0 = full attention, non-zero = sliding "
                "window, as Megatron reads it)"
            )
        cfg.window_attn_skip_freq = list(freq)
    elif freq is not None and (isinstance(freq, bool) or not isinstance(freq, int) or freq < 1):
        raise ValueError(
            f"window_attn_skip_freq ({freq!r}) must be an int >= 1, a list of ints or None"
        )


def check_clamped_swiglu_te(cfg) -> None:
    """Megatron's clamped-SwiGLU rule on use_te_activation_func, checked before gigatron's
    refusal of that Transformer Engine field (which names another reason)."""
    import torch.nn.functional as F

    clamped_swiglu = cfg.activation_func_clamp_value is not None and cfg.activation_func is F.silu
    if clamped_swiglu and cfg.use_te_activation_func:
        raise ValueError(
            "use_te_activation_func must be False when activation_func_clamp_value is not None "
            "for SwiGLU"
        )


def _check_clamp(cfg) -> None:
    clamp = cfg.activation_func_clamp_value
    if clamp is None:
        return
    if not (math.isfinite(clamp) and clamp > 0):
        raise ValueError(
            f"activation_func_clamp_value ({clamp}) must be finite and greater than zero"
        )
    if not cfg.gated_linear_unit:
        raise ValueError(
            f"activation_func_clamp_value ({clamp}) clamps a gated linear unit's halves: it needs "
            "gated_linear_unit=True (--swiglu or --quick-geglu)"
        )
    import torch.nn.functional as F

    if cfg.activation_func is F.silu:  # Megatron's rules for the clamped SwiGLU
        if cfg.num_moe_experts is None:
            raise ValueError("activation_func_clamp_value for SwiGLU is only supported with MoE.")
        if cfg.glu_linear_offset != 0.0:
            raise ValueError(
                "glu_linear_offset must be zero when activation_func_clamp_value is set for SwiGLU."
            )
