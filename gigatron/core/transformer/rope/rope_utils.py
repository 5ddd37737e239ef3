"""Applying rotary angles to query/key heads (mirrors
`megatron.core.models.common.embeddings.rope_utils.apply_rotary_pos_emb`, bshd and thd layouts).

t' = t * cos(freqs) + rotate(t) * sin(freqs) on the first rot_dim channels; rotate is
[-x2, x1] of the two halves (default, HF Llama convention) or of interleaved (even, odd) pairs.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from gigatron.core.packed_seq_params import thd_document_positions
from gigatron.core.transformer.rope._rope_megatron import (
    _apply_rotary_pos_emb_bshd,
    _apply_rotary_pos_emb_thd,
    _get_thd_freqs_on_this_cp_rank,
    _rotate_half,
)

__all__ = [
    "_apply_rotary_pos_emb_bshd",
    "_apply_rotary_pos_emb_thd",
    "_get_thd_freqs_on_this_cp_rank",
    "apply_rotary_pos_emb",
    "get_pos_emb_on_this_cp_rank",
]

# Transformer Engine's fused RoPE kernels: None (Megatron's value without TE); gigatron always
# takes the unfused path, whatever config.apply_rope_fusion says.
fused_apply_rotary_pos_emb = None
fused_apply_rotary_pos_emb_thd = None


@torch.library.custom_op("gigatron::rope_cos_sin", mutates_args=())
def rope_cos_sin(freqs: Tensor, mscale: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """`(cos(freqs) * mscale, sin(freqs) * mscale)` in `dtype`, shaped as `freqs` `[s, 1, 1, dim]`.

    One opaque op, so the tables are computed once per call and read by the rotation. Written
    inline, torch.compile fuses `cos`/`sin` into the kernels that rotate q and k (forward and
    backward) and evaluates them again for every batch row and head: on an H200 those kernels took
    ~0.2-0.4 ms each at Llama-3-8B's shape, several times their memory traffic."""
    return _cos_sin(freqs, mscale, dtype)


def _cos_sin(freqs: Tensor, mscale: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    cos = (torch.cos(freqs) * mscale).to(dtype).contiguous()
    return cos, (torch.sin(freqs) * mscale).to(dtype).contiguous()


@rope_cos_sin.register_fake
def _(freqs: Tensor, mscale: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    def table():
        return torch.empty(freqs.shape, dtype=dtype, device=freqs.device)

    return table(), table()


class _NoContextParallel:
    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def _warn_unfusable(mscale: float, mla_rotary_interleaved: bool, inverse: bool) -> None:
    """Megatron's warnings when apply_rope_fusion is asked for options fused RoPE lacks."""
    unfused = "using the unfused one"
    if mscale != 1.0:
        warnings.warn(f"mscale={mscale} is not supported by fused RoPE; {unfused}", stacklevel=3)
    if mla_rotary_interleaved:
        warnings.warn(f"fused RoPE lacks MLA-style interleaving; {unfused}", stacklevel=3)
    if inverse:
        warnings.warn(f"inverse RoPE is not supported by fused RoPE; {unfused}", stacklevel=3)


def apply_rotary_pos_emb(
    t: Tensor,
    freqs: Tensor,
    config=None,
    cu_seqlens=None,
    mscale: float = 1.0,
    cp_group=None,
    mla_rotary_interleaved: bool = False,
    inverse: bool = False,
    mla_output_remove_interleaving: bool = False,
    max_seqlen: int | None = None,
) -> Tensor:
    """Rotate `t` [s, b, n, hn] by angles `freqs` [s, 1, 1, dim]; dims past `dim` pass through.

    Packed (thd) when `cu_seqlens` [n_docs + 1] is given: `t` is [t, n, hn] (Megatron) or
    [t, 1, n, hn] (gigatron's b = 1), this CP rank's tokens of the whole packed sequence whose
    document bounds are `cu_seqlens`; `freqs` [>= longest document, 1, 1, dim] is the unsplit
    table, and every document's positions restart at 0 (its CP rank's zigzag chunks under
    `cp_group` of size > 1).
    """
    interleaved = bool(config.rotary_interleaved) if config is not None else False
    if config is not None and getattr(config, "apply_rope_fusion", False):
        _warn_unfusable(mscale, mla_rotary_interleaved, inverse)
    megatron_options = dict(
        rotary_interleaved=interleaved,
        mla_rotary_interleaved=mla_rotary_interleaved,
        mscale=mscale,
        inverse=inverse,
        mla_output_remove_interleaving=mla_output_remove_interleaving,
    )
    if cu_seqlens is not None and (max_seqlen is not None or mla_rotary_interleaved or inverse):
        cp = cp_group if cp_group is not None else _NoContextParallel()
        packed = t.squeeze(1) if t.dim() == 4 else t  # gigatron's [t, 1, n, hn] -> [t, n, hn]
        out = _apply_rotary_pos_emb_thd(
            packed, cu_seqlens, freqs, cp_group=cp, max_seqlen=max_seqlen, **megatron_options
        )
        return out.view(t.shape)
    if mla_rotary_interleaved or inverse:
        return _apply_rotary_pos_emb_bshd(t, freqs, **megatron_options)
    if cu_seqlens is not None:
        cp_size, cp_rank = (1, 0) if cp_group is None else (cp_group.size(), cp_group.rank())
        _, pos = thd_document_positions(cu_seqlens, t.shape[0], cp_size, cp_rank, freqs.device)
        freqs = freqs[pos.clamp(max=freqs.shape[0] - 1)]  # [t, 1, 1, dim]
        if t.dim() == 3:  # Megatron's [t, n, hn]
            return apply_rotary_pos_emb(t.unsqueeze(1), freqs, config, mscale=mscale).squeeze(1)
    rot_dim = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    # learned or differentiated angles take the plain ops (autograd); others the opaque op
    cos, sin = (_cos_sin if freqs.requires_grad else rope_cos_sin)(freqs, mscale, t.dtype)
    t_rot = t_rot * cos + _rotate_half(t_rot, interleaved) * sin
    return torch.cat((t_rot, t_pass), dim=-1)


def get_pos_emb_on_this_cp_rank(pos_emb: Tensor, seq_dim: int, cp_group) -> Tensor:
    """This context-parallel rank's positions of `pos_emb`: of 2 x CP chunks along `seq_dim`,
    chunks `rank` and `2 * CP - 1 - rank` (the load-balanced split of the sequence)."""
    if cp_group is None:
        raise ValueError("cp_group must be provided to get positional embedding per CP rank")
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    if pos_emb.shape[seq_dim] % (2 * cp_size):
        raise ValueError(
            f"get_pos_emb_on_this_cp_rank: sequence length {pos_emb.shape[seq_dim]} is not "
            f"divisible by 2 x context parallel size ({2 * cp_size})"
        )
    chunks = pos_emb.chunk(2 * cp_size, dim=seq_dim)
    return torch.cat([chunks[cp_rank], chunks[2 * cp_size - 1 - cp_rank]], dim=seq_dim)
