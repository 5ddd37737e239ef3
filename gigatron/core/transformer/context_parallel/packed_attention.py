"""Context-parallel attention over packed sequences (thd; `cp_comm_type` "all_gather" for
every mode).

Each CP rank holds chunks r and 2·cp−1−r of every document (`get_batch_on_this_cp_rank`'s
per-document split). K and V are all-gathered over the CP group (backward: reduce-scatter of
dK/dV), every gathered token's document and position come from the bounds alone (no
communication), and the local queries attend to the keys of their own document, causally by
position. Transformer Engine runs its ring over the documents instead; gigatron uses the gather
for p2p and a2a too (the same numbers, more memory: [s, cp*s] scores per head).

Shapes: s: local tokens (t / cp), b: 1, np / ng: query / K/V heads on this TP rank, hn: head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gigatron.core.packed_seq_params import (
    layout_bounds,
    thd_attention_mask,
    thd_document_positions,
)
from gigatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from gigatron.core.transformer.context_parallel import _layout


def packed_attention(
    query: Tensor, key: Tensor, value: Tensor, packed_seq_params, *, scale: float, causal: bool,
    group,
) -> Tensor:  # fmt: skip
    """q [s, 1, np, hn], k/v [s, 1, ng, hn] (this rank's per-document chunks) -> [s, 1, np, hn]."""
    cp_size, cp_rank = group.size(), group.rank()
    s = query.shape[0]
    kv = torch.stack([key, value], dim=1)  # [s, 2, 1, ng, hn]
    kv = gather_from_sequence_parallel_region(kv, True, group=group)  # [cp*s, 2, 1, ng, hn]
    bounds = layout_bounds(packed_seq_params).to(query.device)
    q_doc, q_pos = thd_document_positions(bounds, s, cp_size, cp_rank)
    keys = [thd_document_positions(bounds, s, cp_size, r) for r in range(cp_size)]
    k_doc = torch.cat([doc for doc, _ in keys])  # gathered keys are in rank order
    k_pos = torch.cat([pos for _, pos in keys])
    masked = thd_attention_mask(q_doc, q_pos, k_doc, k_pos, causal)[0, 0]  # [s, cp*s]
    q, k, v = _layout.to_grouped(query, kv[:, 0], kv[:, 1])  # q [1, ng, g, s, hn]
    if q.is_cuda:  # fused kernel; SDPA's bool mask is True where attention is allowed
        b, ng, g, _, hn = q.shape
        out = F.scaled_dot_product_attention(
            q.reshape(b, ng * g, s, hn), k, v, attn_mask=~masked, scale=scale, enable_gqa=g > 1
        ).view(b, ng, g, s, hn)
    else:
        scores = torch.matmul(q.float(), k.float().unsqueeze(2).transpose(-1, -2)) * scale
        probs = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1)
        out = torch.matmul(probs, v.float().unsqueeze(2)).to(q.dtype)  # [1, ng, g, s, hn]
    return _layout.from_grouped(out)  # [s, 1, np, hn]
