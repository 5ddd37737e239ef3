"""Shared pieces of the GPTModel layout-parity tests (test_tensor_parallel.py and
test_context_parallel.py beside this file): a one-rank reference model's full weights and grads
are computed first, then each rank loads its shards of those weights into the parallel model
(megatron.core.models.gpt under TP / CP)."""

import functools

import torch
import torch.nn.functional as F

from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.models.common.tp_state_dict import shard_for_rank

# Llama style: RoPE, GQA (8 heads / 4 groups), RMSNorm, SwiGLU, no linear biases.
LLAMA_CONFIG = dict(
    num_layers=2,
    hidden_size=32,
    num_attention_heads=8,
    num_query_groups=4,
    ffn_hidden_size=48,
    normalization="RMSNorm",
    gated_linear_unit=True,
    activation_func=F.silu,
    add_bias_linear=False,
)
LLAMA_MODEL = dict(position_embedding_type="rope", rotary_base=500)

# Gemma 2 / 3 style: x (1 + w) RMSNorm, sandwich norms, GeGLU, sqrt(h) embedding scale, softmax
# scale, attention / final logit soft-capping, sliding-window layer 1 (window 3 < the sequences)
# with its own RoPE base, global layer 2 with linearly scaled RoPE, tied embeddings.
GEMMA_CONFIG = dict(
    num_layers=2,
    hidden_size=32,
    num_attention_heads=8,
    num_query_groups=4,
    kv_channels=8,
    ffn_hidden_size=48,
    normalization="RMSNorm",
    layernorm_zero_centered_gamma=True,
    gated_linear_unit=True,
    activation_func=functools.partial(F.gelu, approximate="tanh"),
    add_bias_linear=False,
    softmax_scale=0.3,
    attn_logit_softcapping=2.0,
    final_logit_softcapping=3.0,
    post_self_attn_layernorm=True,
    post_mlp_layernorm=True,
    apply_embedding_scaling=True,
    window_size=(3, 0),
    window_attn_skip_freq=2,
    rotary_base_local=100,
)
GEMMA_MODEL = dict(
    position_embedding_type="rope",
    rotary_base=10000,
    seq_len_interpolation_factor=2.0,
    share_embeddings_and_output_weights=True,
)


def weights_and_grads(model):
    """Copies of the model's parameters and of their grads after a backward: (full, grads)."""
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return full, grads


def load_shards(model, full, tp_rank, tp):
    """Copies this TP rank's shard of every full weight into `model`; its named parameters."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(shard_for_rank(full[name], p, tp_rank, tp))
    return params


def references_then_layout(reference, styles, tp, cp=1):
    """Runs `reference(style)` for each style on a TP = CP = 1 layout (every rank computes the
    same), then initializes TP = tp x CP = cp; both seeded with model_parallel_cuda_manual_seed(1)
    on one torch thread. Returns {style: reference(style)}."""
    torch.set_num_threads(1)
    ps.initialize_model_parallel(1)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    refs = {style: reference(style) for style in styles}
    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tp, context_parallel_size=cp)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    return refs


def tp2_sp_fast_layer(**config):
    """One fast-spec GPT TransformerLayer (hidden 64, 4 heads, ffn 128, GELU, no dropout) under
    TP = 2 + SP, on a TP = 2 parallel_state initialised here; `config`: more TransformerConfig
    fields. Input `[8, b, 64]` (this rank's half of a 16-token sequence)."""
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_fast_spec
    from gigatron.core.models.gpt.gpt_model import GPTModel
    from gigatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        activation_func=F.gelu,
        tensor_model_parallel_size=2,
        sequence_parallel=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        **config,
    )
    return GPTModel(cfg, get_gpt_layer_fast_spec(), 128, 16).decoder.layers[0]
