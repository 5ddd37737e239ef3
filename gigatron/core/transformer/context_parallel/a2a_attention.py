"""All-to-all (Ulysses) context-parallel attention (cp_comm_type "a2a").

gigatron's plain-PyTorch counterpart of Transformer Engine's `AttnFuncWithCPAndQKVOA2A`
(DeepSpeed-Ulysses, Jacobs et al., 2023): an all-to-all turns "all heads, local tokens" into
"np/cp heads, all tokens", attention runs on whole sequences for those heads, and a second
all-to-all turns the output back. Needs np (query heads on this TP rank) divisible by cp; K/V heads
that do not split evenly over cp are repeated to np heads first (GQA). The gathered sequence is
in rank order (zigzag chunks); it is permuted to position order so a plain causal mask applies.

Shapes: s: local seq, S = cp*s, b: micro-batch, np / ng: query / K/V heads, hn: head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core.tensor_parallel.mappings import all_to_all
from gigatron.core.transformer.context_parallel import _kernels, _layout


def _seq_to_heads(x: Tensor, group, cp_size: int) -> Tensor:
    """[s, b, n, hn] (all heads, local tokens) -> [cp*s, b, n/cp, hn] (head slice, all tokens)."""
    s, b, n, hn = x.shape
    x = x.reshape(s, b, cp_size, n // cp_size, hn).permute(2, 0, 1, 3, 4)  # [cp, s, b, n/cp, hn]
    x = all_to_all(group, x.reshape(cp_size * s, b, n // cp_size, hn))
    return x  # block j along dim 0 = rank j's tokens


def _heads_to_seq(x: Tensor, group, cp_size: int) -> Tensor:
    """[cp*s, b, n/cp, hn] -> [s, b, n, hn] (inverse of `_seq_to_heads`)."""
    S, b, n_local, hn = x.shape
    s = S // cp_size
    x = all_to_all(group, x.contiguous()).view(cp_size, s, b, n_local, hn)  # block j = heads j
    return x.permute(1, 2, 0, 3, 4).reshape(s, b, cp_size * n_local, hn)


def a2a_attention(
    query: Tensor, key: Tensor, value: Tensor, *, scale: float, causal: bool, group,
    window=None, softcap=None, sink=None,
) -> Tensor:  # fmt: skip
    """q [s, b, np, hn], k/v [s, b, ng, hn] (this rank's zigzag tokens) -> [s, b, np, hn].
    window (left, right) / softcap / sink [np] (all np heads; this rank uses its slice): as
    `_kernels.attention`, on the position-ordered whole sequence."""
    cp_size = group.size()
    s, _, np_, _ = query.shape
    ng = key.shape[2]
    if np_ % cp_size:
        raise ValueError(
            f"attention heads per tensor-parallel rank ({np_}) must be divisible by "
            f"context_parallel_size ({cp_size}) for cp_comm_type 'a2a' "
            "(context_parallel/a2a_attention.py)"
        )
    if ng % cp_size:  # repeat K/V heads so each rank gets whole groups of its query heads
        key = key.repeat_interleave(np_ // ng, dim=2)
        value = value.repeat_interleave(np_ // ng, dim=2)
    q = _seq_to_heads(query, group, cp_size)  # [S, b, np/cp, hn], rank order
    k = _seq_to_heads(key, group, cp_size)
    v = _seq_to_heads(value, group, cp_size)
    # rank order -> position order (and back): the gathered sequence is a permutation
    pos = _layout.gathered_positions(cp_size, s, device=query.device)  # [S] position of row i
    to_pos = torch.argsort(pos)
    q, k, v = (t.index_select(0, to_pos) for t in (q, k, v))
    qg, kg, vg = _layout.to_grouped(q, k, v)
    if sink is not None:  # rank r holds heads block r after the all-to-all
        per_rank = np_ // cp_size
        sink = sink[group.rank() * per_rank : (group.rank() + 1) * per_rank]
    out = _kernels.attention(qg, kg, vg, scale, causal, window=window, softcap=softcap, sink=sink)
    out = _layout.from_grouped(out)  # [S, b, np/cp, hn]
    out = out.index_select(0, pos)  # position order -> rank order
    return _heads_to_seq(out, group, cp_size)
