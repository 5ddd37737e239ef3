"""Attention math shared by the context-parallel modes: one block of queries against one block
of keys, with the log-sum-exp (LSE) the ring needs to merge partial results.

Layouts (grouped heads, so GQA never repeats K/V): q `[b, ng, g, sq, hn]`, k/v `[b, ng, sk, hn]`
where ng = K/V heads (query groups), g = query heads per group (np = ng * g). All math runs in
fp32 and follows FlashAttention's formulation (Dao et al., 2022): `lse = logsumexp(q.k^T * scale)`,
`p = exp(s - lse)`; backward with `D = rowsum(dout * out)`, `ds = p * (dp - D)`.

Plain PyTorch is the reference path. Fused path (the one adapter to PyTorch's kernels): for CUDA
fp16/bf16 blocks the ring calls the FlashAttention op that returns the LSE
(`aten._scaled_dot_product_flash_attention` and its backward), so no `[sq, sk]` score matrix is
materialised; `FUSED_ON_CPU = True` routes CPU blocks through PyTorch's CPU flash kernel
(`_scaled_dot_product_flash_attention_for_cpu`), which is how the adapter is tested without a GPU.
`attention` (the differentiable, masked entry used by the all-gather and a2a modes) takes
`F.scaled_dot_product_attention` on CUDA tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gigatron.core.transformer.utils import get_sliding_window_causal_mask, logit_softcapping


def _scores(q: Tensor, k: Tensor, scale: float, causal: bool) -> Tensor:
    """q [b, ng, g, sq, hn], k [b, ng, sk, hn] -> fp32 scores [b, ng, g, sq, sk]."""
    s = torch.matmul(q.float(), k.float().unsqueeze(2).transpose(-1, -2)) * scale
    if causal:  # diagonal block: query i sees keys 0..i (sq == sk, same positions)
        sq, sk = s.shape[-2:]
        future = torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


FUSED_ON_CPU = False


def _fused(q: Tensor) -> bool:
    if q.is_cuda:
        return q.dtype in (torch.float16, torch.bfloat16)
    return FUSED_ON_CPU


def _heads(q: Tensor, k: Tensor, v: Tensor):
    """Grouped layout -> the fused kernels' [b, np, s, hn] (K/V repeated per query head)."""
    b, ng, g, sq, hn = q.shape
    q4 = q.reshape(b, ng * g, sq, hn)
    k4 = k.repeat_interleave(g, dim=1).contiguous()
    v4 = v.repeat_interleave(g, dim=1).contiguous()
    return q4, k4, v4


def _fused_forward(q, k, v, scale, causal):
    b, ng, g, sq, hn = q.shape
    q4, k4, v4 = _heads(q, k, v)
    if q.is_cuda:
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            q4, k4, v4, 0.0, causal, False, scale=scale
        )
        out, lse, meta = res[0], res[1], tuple(res[2:8])
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q4, k4, v4, 0.0, causal, scale=scale
        )
        meta = None
    lse = lse[..., :sq].float().reshape(b, ng, g, sq)
    return out.float().reshape(b, ng, g, sq, hn), lse, meta


def _fused_backward(dout, out, q, k, v, lse, scale, causal, meta):
    b, ng, g, sq, hn = q.shape
    q4, k4, v4 = _heads(q, k, v)
    dout4 = dout.to(q.dtype).reshape(b, ng * g, sq, hn).contiguous()
    out4 = out.to(q.dtype).reshape(b, ng * g, sq, hn).contiguous()
    lse4 = lse.reshape(b, ng * g, sq).contiguous()
    if q.is_cuda:
        cum_q, cum_k, max_q, max_k, seed, offset = meta
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout4, q4, k4, v4, out4, lse4, cum_q, cum_k, max_q, max_k, 0.0, causal, seed,
            offset, scale=scale,
        )  # fmt: skip
    else:
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout4, q4, k4, v4, out4, lse4, 0.0, causal, scale=scale
        )
    sk = k.shape[2]
    dk = dk.float().reshape(b, ng, g, sk, hn).sum(dim=2)
    dv = dv.float().reshape(b, ng, g, sk, hn).sum(dim=2)
    return dq.float().reshape(b, ng, g, sq, hn), dk, dv


def block_forward(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool):
    """One block: (out fp32 [b, ng, g, sq, hn], lse fp32 [b, ng, g, sq], kernel metadata that
    the fused backward needs, or None)."""
    if _fused(q):
        return _fused_forward(q, k, v, scale, causal)
    s = _scores(q, k, scale, causal)
    lse = torch.logsumexp(s, dim=-1)  # [b, ng, g, sq]
    p = torch.exp(s - lse.unsqueeze(-1))
    out = torch.matmul(p, v.float().unsqueeze(2))  # [b, ng, g, sq, hn]
    return out, lse, None


def block_backward(
    dout: Tensor, out: Tensor, delta: Tensor, q: Tensor, k: Tensor, v: Tensor, lse: Tensor,
    scale: float, causal: bool, meta=None,
):  # fmt: skip
    """Gradients of one block given the *final* (merged) out, lse and delta = rowsum(dout * out).

    dout/out [b, ng, g, sq, hn] fp32, delta/lse [b, ng, g, sq] -> dq [b, ng, g, sq, hn],
    dk / dv [b, ng, sk, hn] (summed over the g query heads of each group), all fp32.
    """
    if _fused(q):
        return _fused_backward(dout, out, q, k, v, lse, scale, causal, meta)
    s = _scores(q, k, scale, causal)
    p = torch.exp(s - lse.unsqueeze(-1))  # this block's share of the final softmax
    dv = torch.matmul(p.transpose(-1, -2), dout).sum(dim=2)  # [b, ng, sk, hn]
    dp = torch.matmul(dout, v.float().unsqueeze(2).transpose(-1, -2))  # [b, ng, g, sq, sk]
    ds = p * (dp - delta.unsqueeze(-1))
    dq = torch.matmul(ds, k.float().unsqueeze(2)) * scale  # [b, ng, g, sq, hn]
    dk = torch.matmul(ds.transpose(-1, -2), q.float()).sum(dim=2) * scale  # [b, ng, sk, hn]
    return dq, dk, dv


def merge(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor, rows: slice) -> None:
    """Online-softmax merge of a block's result into rows `rows` of (out, lse), in place."""
    old = lse[..., rows]
    new = torch.logaddexp(old, block_lse)
    out[..., rows, :] = out[..., rows, :] * torch.exp(old - new).unsqueeze(
        -1
    ) + block_out * torch.exp(block_lse - new).unsqueeze(-1)
    lse[..., rows] = new


def attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool,
    window=None, softcap=None, sink=None,
) -> Tensor:  # fmt: skip
    """Differentiable attention, causal aligned bottom-right (query i of sq sees keys up to
    sk - sq + i) or full. q [b, ng, g, sq, hn], k/v [b, ng, sk, hn] -> [b, ng, g, sq, hn].
    window: (left, right) sliding window, aligned the same way (utils.sliding_window_mask);
    softcap: caps the scaled scores (cap * tanh(x / cap)); sink: [ng * g] per-head sink logits
    in the softmax denominator. Any of them takes the plain path (no fused kernel has them)."""
    b, ng, g, sq, hn = q.shape
    sk = k.shape[2]
    if q.is_cuda and window is None and not softcap and sink is None:
        # fused kernels; the causal bias object never materialises a [sq, sk] mask
        from torch.nn.attention.bias import causal_lower_right

        q4, k4, v4 = _heads(q, k, v)
        bias = causal_lower_right(sq, sk) if causal and sq != sk else None
        out = F.scaled_dot_product_attention(
            q4, k4, v4, attn_mask=bias, is_causal=causal and sq == sk, scale=scale
        )
        return out.view(b, ng, g, sq, hn)
    s = torch.matmul(q.float(), k.float().unsqueeze(2).transpose(-1, -2)) * scale
    s = logit_softcapping(s, softcap)
    if causal:
        future = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(1 + sk - sq)
        s = s.masked_fill(future, float("-inf"))
    if window is not None:
        s = s.masked_fill(get_sliding_window_causal_mask(sq, sk, window, q.device), float("-inf"))
    if sink is None:
        p = torch.softmax(s, dim=-1)
    else:  # one more logit per head, dropped after the softmax
        sink = sink.float().reshape(1, ng, g, 1, 1).expand(b, ng, g, sq, 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(p, v.float().unsqueeze(2)).to(q.dtype)


def causal_mask(s: int, device=None) -> Tensor:
    """bool [s, s], True above the diagonal (future keys masked)."""
    return torch.ones(s, s, dtype=torch.bool, device=device).triu(1)
