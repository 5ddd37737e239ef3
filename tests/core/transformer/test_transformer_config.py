"""TransformerConfig: Megatron defaults, derived fields, validation messages, unknown names."""

import math

import pytest
import torch

from gigatron.core.transformer.transformer_config import TransformerConfig

BASE = dict(num_layers=4, hidden_size=64, num_attention_heads=8)


def test_megatron_defaults_and_derived_fields():
    c = TransformerConfig(**BASE)
    assert (c.ffn_hidden_size, c.kv_channels, c.num_query_groups) == (256, 8, 8)
    assert c.hidden_dropout == c.attention_dropout == 0.1  # dropout is on by default
    assert c.add_bias_linear and not c.gated_linear_unit and c.normalization == "LayerNorm"
    assert c.activation_func is torch.nn.functional.gelu
    assert c.recompute_modules == ["core_attn"] and c.num_moe_experts is None
    w = torch.empty(4000, 100)
    c.output_layer_init_method(w)  # N(0, 0.02 / sqrt(2 * num_layers))
    assert w.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.05)
    c.init_method(w)
    assert w.std().item() == pytest.approx(0.02, rel=0.05)


def test_query_key_layer_scaling_forces_fp32_softmax():
    c = TransformerConfig(
        **BASE, apply_query_key_layer_scaling=True, attention_softmax_in_fp32=False
    )
    assert c.attention_softmax_in_fp32


def test_unknown_name_suggests_the_closest_field():
    with pytest.raises(TypeError, match="did you mean 'num_query_groups'"):
        TransformerConfig(**BASE, num_query_group=2)
    with pytest.raises(TypeError, match="has no field 'zzz'"):
        TransformerConfig(**BASE, zzz=1)


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            dict(tensor_model_parallel_size=3),
            r"num_attention_heads \(8\) must be a multiple of "
            r"tensor_model_parallel_size \(3\)",
        ),
        (dict(num_query_groups=3), r"num_query_groups \(3\) must divide num_attention_heads"),
        (dict(normalization="L2"), "normalization"),
        (dict(fp16=True, bf16=True), "exclusive"),
        (dict(recompute_granularity="full"), "recompute_method"),
        (
            dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=9),
            r"recompute_num_layers \(9\)",
        ),
        (dict(recompute_granularity="selective", recompute_num_layers=1), "must be None"),
        (dict(recompute_granularity="selective", recompute_modules=["mhc"]), "'mhc' is not"),
        (
            dict(recompute_granularity="selective", recompute_modules=["moe_act"]),
            "moe_act in recompute_modules is only supported with moe_grouped_gemm",
        ),
        (dict(pipeline_model_parallel_size=3, pipeline_dtype=torch.float32), "divisible"),
        (dict(fp8="e4m3", fp8_recipe="mxfp8"), r"fp8_recipe='mxfp8' is not supported by gigatron"),
        (dict(fp8="e4m3", fp8_amax_history_len=0), r"fp8_amax_history_len \(0\) must be"),
        (dict(fp8="e4m3", fp8_amax_compute_algo="mean"), r"fp8_amax_compute_algo \('mean'\)"),
        (dict(fp8="e4m3", first_last_layers_bf16=True), "does not support first / last layers"),
        (dict(fp8="e5m2"), r"fp8 \('e5m2'\) must be one of"),
        (dict(window_size=(4,)), r"window_size \(\(4,\)\) must be a pair"),
        (dict(window_size=(4, 0), window_attn_skip_freq=[1, 0, 1]), "one int entry per layer"),
        (dict(window_attn_skip_freq=0), r"window_attn_skip_freq \(0\)"),
        (dict(rotary_base_local=1e4), "set window_size too"),
        (dict(attn_logit_softcapping=-1.0), "attn_logit_softcapping"),
        (
            dict(attn_logit_softcapping=50.0, apply_query_key_layer_scaling=True),
            "apply_query_key_layer_scaling",
        ),
        (dict(window_size=(4, 0, 1)), r"window_size \(\(4, 0, 1\)\) must be a pair"),
        (dict(hidden_dropout=1.5), r"hidden_dropout \(1.5\)"),
    ],
)
def test_invalid_settings_raise_value_error_naming_the_field(kw, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**{**BASE, **kw})


def test_required_sizes():
    # hidden_size 0 (unset) is legal in a config, as in Megatron; TransformerBlock refuses it
    # (tests/core/transformer/test_config_hidden_size_unset.py).
    with pytest.raises(ValueError, match=r"num_layers \(0\)"):
        TransformerConfig(num_layers=0, hidden_size=8, num_attention_heads=2)


def test_speed_hints_are_accepted():
    c = TransformerConfig(
        **BASE,
        masked_softmax_fusion=True,
        bias_dropout_fusion=True,
        apply_rope_fusion=True,
        persist_layer_norm=True,
    )
    assert c.masked_softmax_fusion


def test_window_skip_list_is_read_by_truth_as_megatron_does():
    from gigatron.core.transformer.utils import is_layer_window_attention

    config = TransformerConfig(
        num_layers=4, hidden_size=32, num_attention_heads=4, window_size=(8, 0),
        window_attn_skip_freq=[1, 0, 2, 0],
    )  # fmt: skip
    flags = [is_layer_window_attention(config.window_size, config.window_attn_skip_freq, n)
             for n in range(1, 5)]  # fmt: skip
    assert flags == [True, False, True, False]
