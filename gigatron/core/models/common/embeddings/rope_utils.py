"""Applying rotary angles to query/key heads (mirrors
`megatron.core.models.common.embeddings.rope_utils.apply_rotary_pos_emb`, bshd layout).

t' = t * cos(freqs) + rotate(t) * sin(freqs) on the first rot_dim channels; rotate is
[-x2, x1] of the two halves (default, HF Llama convention) or of interleaved (even, odd) pairs.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _rotate_half(x: Tensor, rotary_interleaved: bool) -> Tensor:
    if not rotary_interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb(
    t: Tensor, freqs: Tensor, config=None, cu_seqlens=None, mscale: float = 1.0, cp_group=None
) -> Tensor:
    """Rotate `t` [s, b, n, hn] by angles `freqs` [s, 1, 1, dim]; dims past `dim` pass through."""
    if cu_seqlens is not None:
        raise ValueError("packed sequences (cu_seqlens) are not supported by gigatron's RoPE")
    interleaved = bool(config.rotary_interleaved) if config is not None else False
    rot_dim = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    cos = (torch.cos(freqs) * mscale).to(t.dtype)
    sin = (torch.sin(freqs) * mscale).to(t.dtype)
    t_rot = t_rot * cos + _rotate_half(t_rot, interleaved) * sin
    return torch.cat((t_rot, t_pass), dim=-1)
