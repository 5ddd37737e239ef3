"""hidden_size = 0 is Megatron's default: a TransformerConfig that carries only parallel and
precision settings (the one DistributedDataParallel takes) is accepted; building a layer or a
block from it, or a negative hidden_size, is refused."""

import pytest

from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.transformer import TransformerConfig
from gigatron.core.transformer.transformer_block import TransformerBlock
from gigatron.core.transformer.transformer_layer import TransformerLayer


def test_unset_hidden_size_config_is_accepted_but_builds_no_layer():
    cfg = TransformerConfig(num_attention_heads=1, num_layers=1)
    assert cfg.hidden_size == 0
    with pytest.raises(ValueError, match=r"TransformerLayer: config.hidden_size \(0\)"):
        TransformerLayer(cfg, get_gpt_layer_local_spec().submodules)


def test_block_refuses_unset_hidden_size():
    cfg = TransformerConfig(num_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match=r"hidden_size \(0\) must be set to a positive value"):
        TransformerBlock(cfg, get_gpt_layer_local_spec())


def test_negative_hidden_size_is_refused():
    with pytest.raises(ValueError, match=r"hidden_size \(-4\) must be positive"):
        TransformerConfig(num_attention_heads=1, num_layers=1, hidden_size=-4)
