"""GPT-OSS's clamped quick GEGLU and Megatron's clamped SwiGLU (`activation_func_clamp_value`,
`glu_linear_offset`): the GLU activation equals transformers' GPT-OSS formula, clamping changes the
numbers where the pre-activations pass the clamp, and the config's rules are Megatron's."""

import pytest
import torch
import torch.nn.functional as F

from gigatron.core.activations import quick_gelu
from gigatron.core.transformer.mlp import glu_activation
from gigatron.core.transformer.transformer_config import TransformerConfig

BASE = dict(num_layers=1, hidden_size=16, num_attention_heads=2, gated_linear_unit=True)


def _gpt_oss_reference(x, limit, alpha=1.702):
    """transformers' GptOssExperts activation, halves already split (not interleaved)."""
    gate, up = x.chunk(2, dim=-1)
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def test_clamped_quick_geglu_is_gpt_oss_activation():
    cfg = TransformerConfig(**BASE, activation_func=quick_gelu, glu_linear_offset=1.0,
                            activation_func_clamp_value=7.0)  # fmt: skip
    x = torch.randn(64, 12) * 10  # many entries beyond +-7
    got = glu_activation(x, cfg, cfg.activation_func)
    torch.testing.assert_close(got, _gpt_oss_reference(x, 7.0), rtol=1e-6, atol=1e-6)
    unclamped = quick_gelu(x[:, :6]) * (x[:, 6:] + 1)
    assert (got - unclamped).abs().max() > 1.0  # the clamp is applied


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(activation_func=F.silu, activation_func_clamp_value=7.0), "only supported with MoE"),
        (dict(activation_func=quick_gelu, activation_func_clamp_value=-1.0), "greater than zero"),
        (
            dict(
                activation_func=F.silu,
                num_moe_experts=2,
                glu_linear_offset=1.0,
                activation_func_clamp_value=7.0,
            ),  # fmt: skip
            "glu_linear_offset must be zero",
        ),
        (dict(gated_linear_unit=False, activation_func_clamp_value=7.0), "gated_linear_unit"),
        (  # Megatron's rule, ahead of gigatron's refusal of the TE field itself
            dict(
                activation_func=F.silu,
                num_moe_experts=2,
                use_te_activation_func=True,
                activation_func_clamp_value=7.0,
            ),  # fmt: skip
            "use_te_activation_func must be False",
        ),
    ],
)
def test_bad_clamp_settings_are_one_line_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**{**BASE, **kw})
