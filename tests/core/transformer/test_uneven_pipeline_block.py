"""TransformerBlock's layer count and offsets follow uneven first/last pipeline stages."""

import torch

from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.core.transformer.transformer_layer import (
    get_num_layers_to_build,
    get_transformer_layer_offset,
)


def _cfg(**kw):
    return TransformerConfig(
        num_layers=7,
        hidden_size=16,
        num_attention_heads=2,
        pipeline_model_parallel_size=3,
        pipeline_dtype=torch.float32,
        **kw,
    )


def test_uneven_first_and_last_stage():
    cfg = _cfg(num_layers_in_first_pipeline_stage=1, num_layers_in_last_pipeline_stage=2)
    counts = [get_num_layers_to_build(cfg, pp_rank=r) for r in range(3)]
    offsets = [get_transformer_layer_offset(cfg, pp_rank=r) for r in range(3)]
    assert counts == [1, 4, 2]
    assert offsets == [0, 1, 5]


def test_embedding_and_loss_accounting():
    cfg = TransformerConfig(
        num_layers=6,
        hidden_size=16,
        num_attention_heads=2,
        pipeline_model_parallel_size=4,
        pipeline_dtype=torch.float32,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    # 6 layers + embedding + loss = 8 slots over 4 stages: the first and last give one slot away.
    assert [get_num_layers_to_build(cfg, pp_rank=r) for r in range(4)] == [1, 2, 2, 1]
