"""NoPE layers (no_rope_freq): the per-layer pattern, and attention skipping RoPE there."""

import pytest
import torch

from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.transformer.attention import SelfAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=123)
BASE = dict(num_layers=4, hidden_size=32, num_attention_heads=4)


def test_integer_freq_becomes_every_kth_layer_pattern():
    assert TransformerConfig(**BASE, no_rope_freq=2).no_rope_freq == [0, 1, 0, 1]


@pytest.mark.parametrize("freq", [3, [0, 1]])
def test_bad_patterns_are_megatrons_assertion(freq):
    with pytest.raises(AssertionError, match="no_rope_freq"):
        TransformerConfig(**BASE, no_rope_freq=freq)


def test_nope_layer_ignores_rotary_angles(single_rank):
    torch.manual_seed(0)
    config = TransformerConfig(**BASE, no_rope_freq=[0, 1, 0, 0])
    sub = get_gpt_layer_local_spec().submodules.self_attention.submodules
    attn = SelfAttention(config, sub, layer_number=1, attn_mask_type=AttnMaskType.causal).eval()
    x = torch.randn(6, 1, 32)
    angles = torch.randn(6, 1, 1, 8)
    with_rope = attn(x, None, rotary_pos_emb=angles)[0]
    plain = attn(x, None)[0]
    assert not torch.allclose(with_rope, plain)
    attn.layer_number = 2  # the NoPE layer of the pattern
    torch.testing.assert_close(attn(x, None, rotary_pos_emb=angles)[0], plain)


def test_flash_decode_with_nope_is_megatrons_assertion():
    with pytest.raises(AssertionError, match="flash_decode cannot be used with no_rope"):
        TransformerConfig(**BASE, no_rope_freq=2, flash_decode=True)
