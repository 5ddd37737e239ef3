"""Zigzag (load-balanced) sequence layout of context parallelism and head-layout helpers.

The sequence is cut into 2·cp chunks; CP rank r holds chunks r and 2·cp−1−r (Megatron's
`get_batch_on_this_cp_rank`), so each rank's local sequence is `[chunk r, chunk 2cp-1-r]`.
Shapes: s: local seq, b: micro-batch, np / ng: query / K/V heads, g = np / ng, hn: head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor


def zigzag_positions(cp_size: int, cp_rank: int, local_seq: int, device=None) -> Tensor:
    """Global positions `[local_seq]` of CP rank `cp_rank`'s tokens."""
    chunk = local_seq // 2
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk, device=device)
    second_start = (2 * cp_size - 1 - cp_rank) * chunk
    return torch.cat([first, torch.arange(second_start, second_start + chunk, device=device)])


def gathered_positions(cp_size: int, local_seq: int, device=None) -> Tensor:
    """Global positions `[cp * local_seq]` of the rank-ordered concatenation of all ranks."""
    return torch.cat([zigzag_positions(cp_size, r, local_seq, device) for r in range(cp_size)])


def get_pos_emb_on_this_cp_rank(pos_emb: Tensor, seq_dim: int, cp_group) -> Tensor:
    """This CP rank's zigzag rows of a full-sequence table (e.g. RoPE angles `[s, 1, 1, d]`).

    Mirrors `megatron.core.models.common.embeddings.rope_utils.get_pos_emb_on_this_cp_rank`.
    """
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    seq = pos_emb.shape[seq_dim]
    if seq % (2 * cp_size):
        raise ValueError(
            f"sequence length ({seq}) must be divisible by 2 x context_parallel_size "
            f"({2 * cp_size}) (context_parallel/_layout.py)"
        )
    index = zigzag_positions(cp_size, cp_rank, seq // cp_size, device=pos_emb.device)
    return pos_emb.index_select(seq_dim, index)


def to_grouped(query: Tensor, key: Tensor, value: Tensor):
    """q [s, b, np, hn], k/v [s, b, ng, hn] -> q [b, ng, g, s, hn], k/v [b, ng, s, hn]."""
    s, b, np_, hn = query.shape
    ng = key.shape[2]
    q = query.permute(1, 2, 0, 3).reshape(b, ng, np_ // ng, s, hn)
    return q, key.permute(1, 2, 0, 3), value.permute(1, 2, 0, 3)


def from_grouped(out: Tensor) -> Tensor:
    """[b, ng, g, s, hn] -> [s, b, np, hn]."""
    b, ng, g, s, hn = out.shape
    return out.reshape(b, ng * g, s, hn).permute(2, 0, 1, 3)
