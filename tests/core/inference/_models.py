"""Tiny GPTModel styles (megatron.core.models.gpt) shared by the inference tests: the unit
KV-cache tests (tests/core/inference/test_kv_cache.py) and the TP = 2 generation test
(tests/core/inference/test_tensor_parallel.py)."""

import torch
import torch.nn.functional as F

from gigatron.core import tensor_parallel
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_fast_spec,
    get_gpt_layer_local_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig

V = 64

# (TransformerConfig kwargs, GPTModel kwargs, spec function)
MHA_LEARNED = (
    dict(num_attention_heads=4, activation_func=F.gelu),
    dict(position_embedding_type="learned_absolute", share_embeddings_and_output_weights=True),
    get_gpt_layer_local_spec,
)


def gqa_rope(num_query_groups):
    """GQA + RoPE (base 100) + RMSNorm + SwiGLU, no linear biases, fast SDPA spec: 4 heads."""
    return (
        dict(
            num_attention_heads=4,
            num_query_groups=num_query_groups,
            normalization="RMSNorm",
            gated_linear_unit=True,
            activation_func=F.silu,
            add_bias_linear=False,
        ),
        dict(position_embedding_type="rope", rotary_base=100),
        get_gpt_layer_fast_spec,
    )


def build_model(style, cuda_seed=None):
    """A 2-layer, hidden-32 GPTModel of `style` in eval mode (no dropout, CPU init) for vocab V
    and up to 32 positions, after torch.manual_seed(0) (then model_parallel_cuda_manual_seed
    (cuda_seed) when given: it also seeds the CPU generator on CPU-only machines)."""
    config_kw, model_kw, spec = style
    torch.manual_seed(0)
    if cuda_seed is not None:
        tensor_parallel.model_parallel_cuda_manual_seed(cuda_seed)
    config = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        ffn_hidden_size=64,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        **config_kw,
    )
    return GPTModel(config, spec(), vocab_size=V, max_sequence_length=32, **model_kw).eval()
