"""Packed sequences (the `thd` format): several documents in one sequence, none attending to
another. Mirrors `megatron.core.packed_seq_params.PackedSeqParams` (same fields), plus the index
math the attention, RoPE and the context-parallel split share.

Layout. Megatron's THD tensors are [t, h] tokens with a dummy batch of 1 ([t, 1, h] hidden
states, [1, t] token ids); gigatron keeps its [s, b, h] layout with b = 1 and s = t, so a packed
batch is an ordinary micro-batch of one row (`pretrain_gpt` flattens a [b, s] micro-batch into
[1, b*s] as Megatron's `flatten_batch_for_packed_sequences` does). `cu_seqlens_*` are the
cumulative document lengths [num_docs + 1] (0 .. t, int32) over the *whole* packed sequence,
before any sequence-parallel or context-parallel split; `*_padded` (when given) are the bounds
with each document padded (e.g. to a multiple of 2 x context_parallel_size) and are the ones the
token layout follows. Under context parallelism each document is cut into 2·cp chunks and CP rank
r keeps chunks r and 2·cp−1−r of every document (`gigatron.core.utils.get_batch_on_this_cp_rank`,
Transformer Engine's `thd_get_partitioned_indices`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "PackedSeqParams",
    "check_packed_seq_params",
    "layout_bounds",
    "thd_attention_mask",
    "thd_document_positions",
]


@dataclass
class PackedSeqParams:
    """Where the documents of a packed (`thd`) sequence start and end."""

    qkv_format: str = None
    """'thd' (packed); gigatron's attention takes no other format here."""
    cu_seqlens_q: Tensor = None
    """Cumulative query document lengths [num_docs + 1], 0 .. t (the whole packed sequence)."""
    cu_seqlens_kv: Tensor = None
    """Cumulative key/value document lengths (equal to cu_seqlens_q for self-attention)."""
    cu_seqlens_q_padded: Tensor = None
    """cu_seqlens_q with every document padded; the token layout follows these when given."""
    cu_seqlens_kv_padded: Tensor = None
    """cu_seqlens_kv with every document padded."""
    max_seqlen_q: int = None
    """Longest query document (the varlen kernels' tile bound)."""
    max_seqlen_kv: int = None
    """Longest key/value document."""
    local_cp_size: int = None
    """megatron-core's hybrid context parallelism: not supported by gigatron (must stay None)."""
    cp_group: object = None
    """megatron-core's hybrid-CP group: not supported by gigatron (must stay None)."""
    total_tokens: int = None
    """Tokens of the packed sequence (megatron-core 0.17+); with it `seq_idx` is filled in."""
    seq_idx: Tensor = None
    """Document index of every token [1, total_tokens] int32 (megatron-core's Mamba helper)."""
    tokens_per_sample: int = None
    """Sequence length of one sample before packing (megatron-core 0.19+, bookkeeping only)."""
    pad_between_seqs: bool = None
    """Whether documents carry padding between them (megatron-core 0.19+, bookkeeping only)."""
    cp_scatter_cache: object = None
    """megatron-core main's cache of CP scatter indices (unused by gigatron)."""

    def __post_init__(self):
        # megatron-core: with total_tokens, seq_idx [1, total_tokens] numbers each token's
        # document, one extra index for tokens past the last bound.
        cu_seqlens = (
            self.cu_seqlens_q_padded if self.cu_seqlens_q_padded is not None else self.cu_seqlens_q
        )
        if isinstance(cu_seqlens, Tensor) and self.total_tokens is not None:
            cu = cu_seqlens.reshape(-1)
            ends = torch.cat([cu, cu.new_tensor([self.total_tokens])])
            lengths = (ends[1:] - ends[:-1]).clamp(min=0)
            docs = torch.arange(lengths.numel(), device=cu.device)
            self.seq_idx = docs.repeat_interleave(lengths).to(torch.int32).unsqueeze(0)


def thd_document_positions(
    cu_seqlens: Tensor, num_tokens: int, cp_size: int = 1, cp_rank: int = 0, device=None
) -> tuple[Tensor, Tensor]:
    """Document index and position inside its document of this CP rank's tokens.

    cu_seqlens [n + 1] (or [1, n + 1]): bounds over the whole packed sequence, each length
    divisible by 2·cp_size when cp_size > 1; num_tokens: this rank's token count (t / cp_size).
    Returns (doc [num_tokens], pos [num_tokens]) int64 on `device` (default: cu_seqlens').
    Sync-free: nothing is read on the host.
    Under CP a document of length L contributes L/cp local tokens: its chunk cp_rank (positions
    r·L/2cp ..) then its chunk 2·cp−1−r (positions L − (r+1)·L/2cp ..).
    """
    cu = cu_seqlens.reshape(-1).to(device=device, dtype=torch.int64)
    lengths = cu[1:] - cu[:-1]  # [n]
    local_lengths = lengths // cp_size
    local_cu = torch.cat([cu.new_zeros(1), torch.cumsum(local_lengths, 0)])  # [n + 1]
    token = torch.arange(num_tokens, device=cu.device)
    # right=True skips empty documents (repeated bounds): a token goes to the last equal bound
    doc = (torch.searchsorted(local_cu, token, right=True) - 1).clamp(0, lengths.numel() - 1)
    local_pos = token - local_cu[doc]
    if cp_size == 1:
        return doc, local_pos
    half = local_lengths[doc] // 2  # chunk length L / (2 cp)
    first = local_pos < half
    pos = torch.where(
        first, cp_rank * half + local_pos, lengths[doc] - (cp_rank + 1) * half + local_pos - half
    )
    return doc, pos


def thd_attention_mask(
    q_doc: Tensor, q_pos: Tensor, k_doc: Tensor, k_pos: Tensor, causal: bool
) -> Tensor:
    """bool [1, 1, sq, sk], True = masked: keys of another document (and, causal, later keys)."""
    masked = q_doc[:, None] != k_doc[None, :]
    if causal:
        masked = masked | (k_pos[None, :] > q_pos[:, None])
    return masked[None, None]


def check_packed_seq_params(packed_seq_params, seq_len: int, batch_size: int, cp_size: int):
    """Raise ValueError when `packed_seq_params` cannot describe a [seq_len, batch_size] packed
    sequence (seq_len: the whole sequence, before SP/CP splits). Reads the bounds on the host:
    call once per forward, not per layer."""
    p = packed_seq_params
    if p.qkv_format != "thd":
        raise ValueError(f"PackedSeqParams.qkv_format ({p.qkv_format!r}) must be 'thd'")
    if p.local_cp_size is not None or p.cp_group is not None:
        raise ValueError(
            "PackedSeqParams.local_cp_size / cp_group (hybrid context parallelism) are not "
            "supported by gigatron; leave them None"
        )
    if batch_size != 1:
        raise ValueError(
            f"packed sequences need micro-batch dimension 1 (got {batch_size}): the thd layout "
            "is one row [1, t]; flatten [b, s] batches to [1, b*s] (pretrain_gpt does)"
        )
    for name in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
        bounds = getattr(p, name)
        if bounds is None:
            if name == "cu_seqlens_q":
                raise ValueError("PackedSeqParams.cu_seqlens_q must be given")
            continue
        values = bounds.reshape(-1).tolist()
        # with padded bounds the real ones count real tokens only: they end before seq_len
        laid_out = name.endswith("_padded") or getattr(p, name + "_padded") is None
        if len(values) < 2 or values[0] != 0 or (laid_out and values[-1] != seq_len):
            raise ValueError(
                f"PackedSeqParams.{name} {values} must run from 0 to the packed sequence length "
                f"({seq_len})"
            )
        lengths = [b - a for a, b in zip(values[:-1], values[1:])]
        if min(lengths) < 0:
            raise ValueError(f"PackedSeqParams.{name} {values} must not decrease")
        if cp_size > 1 and (name.endswith("_padded") or p.cu_seqlens_q_padded is None):
            bad = [n for n in lengths if n % (2 * cp_size)]
            if bad:
                raise ValueError(
                    f"PackedSeqParams.{name}: document lengths {bad} must be divisible by "
                    f"2 x context_parallel_size ({2 * cp_size}); pad them (cu_seqlens_*_padded)"
                )
    kv = p.cu_seqlens_kv_padded if p.cu_seqlens_q_padded is not None else p.cu_seqlens_kv
    q = p.cu_seqlens_q_padded if p.cu_seqlens_q_padded is not None else p.cu_seqlens_q
    if kv is not None and not torch.equal(kv.reshape(-1).cpu(), q.reshape(-1).cpu()):
        raise ValueError(
            "PackedSeqParams: cu_seqlens_kv must equal cu_seqlens_q (self-attention over "
            "packed documents)"
        )


def layout_bounds(packed_seq_params) -> Tensor:
    """The bounds the token layout follows: cu_seqlens_q_padded when given, else cu_seqlens_q."""
    p = packed_seq_params
    return p.cu_seqlens_q if p.cu_seqlens_q_padded is None else p.cu_seqlens_q_padded
