"""A tiny GQA GPTModel (hidden 32, 4 heads, 2 K/V groups, 2 layers, vocab 64) for optimizer
tests: fused QKV rows per group are 16 (Q) + 8 (K) + 8 (V)."""

import torch

from gigatron.core import tensor_parallel
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig


def tiny_gpt(tp: int = 1, seed: int = 0, **config) -> GPTModel:
    """On an initialised parallel_state of TP `tp`; seeded, TP-invariant CPU initialisation."""
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=64,
        tensor_model_parallel_size=tp,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        **config,
    )
    return GPTModel(cfg, get_gpt_layer_local_spec(), 64, 16, position_embedding_type="rope")
