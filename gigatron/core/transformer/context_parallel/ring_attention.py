"""Ring attention (cp_comm_type "p2p"): K/V blocks travel around the context-parallel ring.

gigatron's plain-PyTorch counterpart of Transformer Engine's `AttnFuncWithCPAndKVP2P`, which
Megatron's `TEDotProductAttention` uses for `cp_comm_type="p2p"` (Megatron has no TE-free path).
Step i of cp: every rank posts the send of the K/V block it holds to the next rank and the receive
of the previous rank's block (one `batch_isend_irecv`), *then* runs attention on the block it holds,
so the transfer of block i+1 overlaps the compute of block i. Partial results are merged with the
online softmax (running log-sum-exp). Backward runs the ring again: K/V travel as in forward and
each block's dK/dV accumulator travels with it, collecting every rank's contribution, until a last
hop brings it home.

Causal attention on the zigzag layout (rank r holds chunks r and 2cp-1-r, see `_layout.py`), with
the block from rank src:
- src == r: causal attention on the local sequence (both diagonal chunks causal, chunk 2cp-1-r
  sees chunk r fully);
- src < r: both local query chunks see the block's first chunk (src) fully and its second chunk
  (2cp-1-src, later than all local tokens) not at all;
- src > r: only the second local query chunk (2cp-1-r) sees the block, fully; the first does not.
Every step costs the same (c x 2c scores for c = chunk length), which is the point of the layout.

Shapes: q [b, ng, g, s, hn], k/v [b, ng, s, hn] (grouped heads, see `_kernels.py`), s = 2c local.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gigatron.core.transformer.context_parallel import _kernels, _layout

_KV_TAG, _DKV_TAG = 0, 1  # distinct tags: forward K/V and backward dK/dV may be in flight together


class _RingComm:
    """Send to the next CP rank and receive from the previous one, without blocking."""

    def __init__(self, group, global_ranks: list[int]):
        self.group = group
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.next_rank = global_ranks[(rank + 1) % size]
        self.prev_rank = global_ranks[(rank - 1) % size]

    def send_recv(self, tensor: Tensor, tag: int = _KV_TAG) -> tuple[Tensor, list]:
        """Post isend(tensor -> next) and irecv(prev -> buffer); returns (buffer, requests)."""
        buf = torch.empty_like(tensor)
        ops = [
            dist.P2POp(dist.isend, tensor, self.next_rank, self.group, tag),
            dist.P2POp(dist.irecv, buf, self.prev_rank, self.group, tag),
        ]
        return buf, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(requests: list) -> None:
        for req in requests:
            req.wait()


def _block_plan(step: int, cp_rank: int, cp_size: int, causal: bool, s: int):
    """(query rows, key cols, diagonal-causal) of ring step `step`, or None if nothing to do."""
    everything = slice(0, s)
    if not causal:
        return everything, everything, False
    src = (cp_rank - step) % cp_size
    c = s // 2
    if src == cp_rank:
        return everything, everything, True
    if src < cp_rank:
        return everything, slice(0, c), False
    return slice(c, s), everything, False


class _RingAttention(torch.autograd.Function):
    """Attention of local queries against all ranks' K/V, passed around the CP ring.

    forward:  q [b, ng, g, s, hn], k/v [b, ng, s, hn] -> out [b, ng, g, s, hn]  (cp-1 K/V hops)
    backward: dq from local work; dk/dv accumulators ride the ring with K/V (cp hops) back home
    """

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, group, global_ranks):
        comm = _RingComm(group, global_ranks)
        cp_rank, cp_size = dist.get_rank(group), dist.get_world_size(group)
        s = q.shape[3]
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]).contiguous()  # [2, b, ng, s, hn]: one message per hop
        metas = []  # per-step metadata of the fused kernel (None on the plain path)
        for step in range(cp_size):
            if step < cp_size - 1:  # post the next block's transfer before computing this one
                next_kv, reqs = comm.send_recv(kv)
            rows, cols, diag = _block_plan(step, cp_rank, cp_size, causal, s)
            block_out, block_lse, meta = _kernels.block_forward(
                q[..., rows, :], kv[0, ..., cols, :], kv[1, ..., cols, :], scale, diag
            )
            metas.append(meta)
            _kernels.merge(out, lse, block_out, block_lse, rows)
            if step < cp_size - 1:
                comm.wait(reqs)
                kv = next_kv
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.causal, ctx.group, ctx.global_ranks = scale, causal, group, global_ranks
        ctx.metas = metas
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        comm = _RingComm(group, ctx.global_ranks)
        cp_rank, cp_size = dist.get_rank(group), dist.get_world_size(group)
        s = q.shape[3]
        dout = dout.float()
        delta = (dout * out).sum(dim=-1)  # [b, ng, g, s]
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        dkv_in, dkv_reqs = None, []
        for step in range(cp_size):
            if step < cp_size - 1:
                next_kv, kv_reqs = comm.send_recv(kv)
            rows, cols, diag = _block_plan(step, cp_rank, cp_size, ctx.causal, s)
            dq_part, dk_part, dv_part = _kernels.block_backward(
                dout[..., rows, :],
                out[..., rows, :],
                delta[..., rows],
                q[..., rows, :],
                kv[0, ..., cols, :],
                kv[1, ..., cols, :],
                lse[..., rows],
                ctx.scale,
                diag,
                ctx.metas[step],
            )
            dq[..., rows, :] += dq_part
            dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
            dkv[0, ..., cols, :] = dk_part
            dkv[1, ..., cols, :] = dv_part
            if dkv_in is not None:  # the other ranks' contributions to the block we hold
                comm.wait(dkv_reqs)
                dkv += dkv_in
            # pass the accumulator on with the block; after the last step it reaches the owner
            dkv_in, dkv_reqs = comm.send_recv(dkv, _DKV_TAG)
            if step < cp_size - 1:
                comm.wait(kv_reqs)
                kv = next_kv
        comm.wait(dkv_reqs)
        dk, dv = dkv_in[0].to(k.dtype), dkv_in[1].to(v.dtype)
        return dq.to(q.dtype), dk, dv, None, None, None, None


def ring_attention(
    query: Tensor, key: Tensor, value: Tensor, *, scale: float, causal: bool, group, global_ranks
) -> Tensor:
    """q [s, b, np, hn], k/v [s, b, ng, hn] (this rank's zigzag tokens) -> [s, b, np, hn]."""
    q, k, v = _layout.to_grouped(query, key, value)
    out = _RingAttention.apply(q, k, v, scale, causal, group, list(global_ranks))
    return _layout.from_grouped(out)
