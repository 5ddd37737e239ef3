"""All-gather context-parallel attention (cp_comm_type "all_gather").

gigatron's plain-PyTorch counterpart of Transformer Engine's `AttnFuncWithCPAndKVAllGather`:
all-gather K and V over the CP group (no overlap), then the local queries attend to the whole
sequence. Under the zigzag layout the gathered keys are in rank order, not position order, so the
causal mask is built from global positions: query at position p sees keys at positions <= p.
Backward of the gather is a reduce-scatter of dK/dV (tensor_parallel's mapping, CP group).

Shapes: s: local seq, b: micro-batch, np / ng: query / K/V heads, hn: head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from gigatron.core.transformer.context_parallel import _kernels, _layout


def all_gather_attention(
    query: Tensor, key: Tensor, value: Tensor, *, scale: float, causal: bool, group
) -> Tensor:
    """q [s, b, np, hn], k/v [s, b, ng, hn] (this rank's zigzag tokens) -> [s, b, np, hn]."""
    cp_size, cp_rank = group.size(), group.rank()
    s = query.shape[0]
    kv = torch.stack([key, value], dim=1)  # [s, 2, b, ng, hn]
    kv = gather_from_sequence_parallel_region(kv, True, group=group)  # [cp*s, 2, b, ng, hn]
    q, k, v = _layout.to_grouped(query, kv[:, 0], kv[:, 1])  # k/v [b, ng, cp*s, hn]
    mask = None
    if causal:
        q_pos = _layout.zigzag_positions(cp_size, cp_rank, s, device=query.device)
        k_pos = _layout.gathered_positions(cp_size, s, device=query.device)
        mask = k_pos[None, :] > q_pos[:, None]  # [s, cp*s], True = masked (a future key)
    return _layout.from_grouped(_kernels.attention(q, k, v, scale, mask))
