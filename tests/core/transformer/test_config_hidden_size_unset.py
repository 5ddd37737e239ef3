"""hidden_size 0 (Megatron's unset default) is a legal config; building a block needs it."""

import pytest

from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.transformer.transformer_block import TransformerBlock
from gigatron.core.transformer.transformer_config import TransformerConfig


def test_config_without_hidden_size_builds():
    cfg = TransformerConfig(num_layers=1, num_attention_heads=2)
    assert cfg.hidden_size == 0


def test_negative_hidden_size_is_refused():
    with pytest.raises(ValueError, match=r"hidden_size \(-8\)"):
        TransformerConfig(num_layers=1, num_attention_heads=2, hidden_size=-8)


def test_block_refuses_unset_hidden_size():
    cfg = TransformerConfig(num_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match=r"hidden_size \(0\) must be set to a positive value"):
        TransformerBlock(cfg, get_gpt_layer_local_spec())
