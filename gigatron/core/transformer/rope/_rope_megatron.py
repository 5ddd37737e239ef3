"""Megatron's unfused RoPE entry points by their private names (`_apply_rotary_pos_emb_bshd`,
`_apply_rotary_pos_emb_thd`, `_get_thd_freqs_on_this_cp_rank`), re-exported by `rope_utils`.

t' = t cos(f) mscale + rotate(t) sin(f) mscale on the first rot_dim channels (sin negated for
`inverse`). MLA-style interleaving first gathers channels (even..., odd...) and, with
`mla_output_remove_interleaving`, puts them back afterwards.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor


def _rotate_half(x: Tensor, rotary_interleaved: bool) -> Tensor:
    if not rotary_interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _mla_flag(mla_rotary_interleaved: bool, multi_latent_attention) -> bool:
    if multi_latent_attention is None:
        return mla_rotary_interleaved
    warnings.warn(
        "multi_latent_attention is deprecated: pass mla_rotary_interleaved instead",
        DeprecationWarning,
        stacklevel=3,
    )
    return multi_latent_attention


def _apply_rotary_pos_emb_bshd(
    t: Tensor,
    freqs: Tensor,
    rotary_interleaved: bool = False,
    mla_rotary_interleaved: bool = False,
    mscale: float = 1.0,
    inverse: bool = False,
    mla_output_remove_interleaving: bool = False,
    multi_latent_attention: bool | None = None,
) -> Tensor:
    """t [s, ..., hn], freqs [s, ..., rot_dim] (one extra singleton axis allowed) -> t's shape."""
    mla = _mla_flag(mla_rotary_interleaved, multi_latent_attention)
    if freqs.dim() == t.dim() + 1 and freqs.size(-2) == 1:
        freqs = freqs.squeeze(-2)  # [s, 1, 1, d] against [s, b, d]: do not broadcast to [s, s, ..]
    rot_dim = freqs.shape[-1]
    x, x_pass = t[..., :rot_dim], t[..., rot_dim:]
    if mla:
        x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    cos = (torch.cos(freqs) * mscale).to(x.dtype)
    sin = (torch.sin(freqs) * mscale).to(x.dtype)
    if inverse:
        sin = -sin
    x = x * cos + _rotate_half(x, rotary_interleaved) * sin
    if mla and mla_output_remove_interleaving:
        first, second = torch.chunk(x, 2, dim=-1)
        x = torch.stack((first, second), dim=-1).flatten(-2)
    return torch.cat((x, x_pass), dim=-1)


def _get_thd_freqs_on_this_cp_rank(
    cp_rank: int, cp_size: int, x: Tensor, freqs: Tensor, offset: int = 0
) -> Tensor:
    """freqs rows of this CP rank's tokens `x` [s_local, ...] of one sequence starting at row
    `offset`: the zigzag halves (rank, 2 cp - 1 - rank) of 2 cp chunks, or the first s rows."""
    if cp_size == 1:
        return freqs[offset : offset + x.size(0)]
    seg = x.size(0) // 2
    full = cp_size * x.size(0)
    return torch.cat(
        [
            freqs[offset + cp_rank * seg : offset + (cp_rank + 1) * seg],
            freqs[offset + full - (cp_rank + 1) * seg : offset + full - cp_rank * seg],
        ]
    )


def _thd_freq_positions(cu_seqlens, n_tokens, cp_size, cp_rank, device):
    """(row of the global table's position for each local token, its sequence's global start)."""
    cu = cu_seqlens.to(torch.int64)
    seq_lens = cu[1:] - cu[:-1]
    local_lens = seq_lens // cp_size
    local_cu = torch.zeros_like(cu)
    local_cu[1:] = torch.cumsum(local_lens, dim=0)
    token = torch.arange(n_tokens, device=device, dtype=torch.int64)
    seq = (torch.searchsorted(local_cu, token, right=True) - 1).clamp(0, cu.numel() - 2)
    local_pos = token - local_cu[seq]
    if cp_size > 1:
        seg = local_lens[seq] // 2
        full = local_lens[seq] * cp_size
        pos = torch.where(
            local_pos < seg, cp_rank * seg + local_pos, full - (cp_rank + 1) * seg + local_pos - seg
        )
    else:
        pos = local_pos
    return pos, cu[seq]


def _apply_rotary_pos_emb_thd(
    t: Tensor,
    cu_seqlens: Tensor,
    freqs: Tensor,
    rotary_interleaved: bool = False,
    mla_rotary_interleaved: bool = False,
    mscale: float = 1.0,
    inverse: bool = False,
    mla_output_remove_interleaving: bool = False,
    cp_group=None,
    multi_latent_attention: bool | None = None,
    max_seqlen: int | None = None,
) -> Tensor:
    """t [t_local, n, hn] packed sequences (bounds `cu_seqlens` of the whole pack, this CP rank's
    tokens) -> t's shape. Positions restart at 0 in each sequence; when `freqs` covers the
    whole pack (more rows than `max_seqlen`, or exactly cu_seqlens[-1] rows without it) each
    sequence reads its own rows (offset by its start)."""
    mla = _mla_flag(mla_rotary_interleaved, multi_latent_attention)
    if cp_group is None:
        raise ValueError("cp_group must be provided for THD format RoPE")
    pos, seq_start = _thd_freq_positions(
        cu_seqlens, t.shape[0], cp_group.size(), cp_group.rank(), t.device
    )
    if max_seqlen is None:
        whole_pack = freqs.size(0) == int(cu_seqlens[-1])
    else:
        whole_pack = freqs.size(0) > max_seqlen
    if whole_pack:
        pos = pos + seq_start
    rows = freqs[pos.clamp(0, freqs.shape[0] - 1)]  # padding tokens read a harmless row
    out = _apply_rotary_pos_emb_bshd(
        t.unsqueeze(1),
        rows,
        rotary_interleaved=rotary_interleaved,
        mla_rotary_interleaved=mla,
        mscale=mscale,
        inverse=inverse,
        mla_output_remove_interleaving=mla_output_remove_interleaving,
    )
    return out.squeeze(1)
