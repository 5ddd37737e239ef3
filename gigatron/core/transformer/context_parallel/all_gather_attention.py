"""All-gather context-parallel attention (cp_comm_type "all_gather").

gigatron's plain-PyTorch counterpart of Transformer Engine's `AttnFuncWithCPAndKVAllGather`:
all-gather K and V over the CP group (no overlap), then the local queries attend to the whole
sequence. Under the zigzag layout the gathered keys are in rank order; they are put in position
order and each of the two local query chunks attends to the keys up to its own end (causal,
aligned bottom-right), so no [s, cp*s] mask is built.
Backward of the gather is a reduce-scatter of dK/dV (tensor_parallel's mapping, CP group).

Shapes: s: local seq, b: micro-batch, np / ng: query / K/V heads, hn: head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from gigatron.core.transformer.context_parallel import _kernels, _layout


def all_gather_attention(
    query: Tensor, key: Tensor, value: Tensor, *, scale: float, causal: bool, group,
    window=None, softcap=None, sink=None,
) -> Tensor:  # fmt: skip
    """q [s, b, np, hn], k/v [s, b, ng, hn] (this rank's zigzag tokens) -> [s, b, np, hn].
    window (left, right) / softcap / sink [np]: `_kernels.attention`'s (each chunk's queries
    are its keys' last c; a window needs causal)."""
    extra = dict(window=window, softcap=softcap, sink=sink)
    cp_size, cp_rank = group.size(), group.rank()
    s = query.shape[0]
    kv = torch.stack([key, value], dim=1)  # [s, 2, b, ng, hn]
    kv = gather_from_sequence_parallel_region(kv, True, group=group)  # [cp*s, 2, b, ng, hn]
    if not causal:  # key order does not matter
        q, k, v = _layout.to_grouped(query, kv[:, 0], kv[:, 1])  # k/v [b, ng, cp*s, hn]
        if window is not None:
            raise ValueError("a sliding window needs causal attention under context parallelism")
        return _layout.from_grouped(_kernels.attention(q, k, v, scale, False, **extra))
    # rank order -> position order; then each local chunk sees the keys up to its own end
    pos = _layout.gathered_positions(cp_size, s, device=query.device)
    kv = kv.index_select(0, torch.argsort(pos))
    c = s // 2
    outs = []
    for chunk, rows in ((cp_rank, slice(0, c)), (2 * cp_size - 1 - cp_rank, slice(c, s))):
        end = (chunk + 1) * c  # keys 0 .. end-1; the last c of them form the causal diagonal
        q, k, v = _layout.to_grouped(query[rows], kv[:end, 0], kv[:end, 1])
        outs.append(_layout.from_grouped(_kernels.attention(q, k, v, scale, True, **extra)))
    return torch.cat(outs, dim=0)  # [s, b, np, hn]
