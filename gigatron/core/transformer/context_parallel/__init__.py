"""Context parallelism in plain PyTorch (no Transformer Engine): ring (p2p), all-gather and
all-to-all (Ulysses) core attention over the zigzag sequence split."""

from gigatron.core.transformer.context_parallel._layout import get_pos_emb_on_this_cp_rank
from gigatron.core.transformer.context_parallel.a2a_attention import a2a_attention
from gigatron.core.transformer.context_parallel.all_gather_attention import all_gather_attention
from gigatron.core.transformer.context_parallel.context_parallel_attention import (
    ContextParallelAttention,
    get_cp_core_attention,
    resolve_cp_comm_type,
)
from gigatron.core.transformer.context_parallel.ring_attention import ring_attention

__all__ = [
    "ContextParallelAttention",
    "a2a_attention",
    "all_gather_attention",
    "get_cp_core_attention",
    "get_pos_emb_on_this_cp_rank",
    "resolve_cp_comm_type",
    "ring_attention",
]
