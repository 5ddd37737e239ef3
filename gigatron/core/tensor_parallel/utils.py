"""Tensor splitting helpers and vocabulary ranges for tensor parallelism.

Mirrors `megatron.core.tensor_parallel.utils`: `split_tensor_along_last_dim`,
`split_tensor_into_1d_equal_chunks`, `gather_split_1d_tensor`, `VocabUtility` and `divide`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gigatron.core.utils import (
    all_gather_into,
    divide,
    get_tensor_model_parallel_group_if_none,
    group_rank,
    group_size,
)

__all__ = [
    "divide",
    "split_tensor_along_last_dim",
    "split_tensor_into_1d_equal_chunks",
    "gather_split_1d_tensor",
    "VocabUtility",
]


def split_tensor_along_last_dim(
    tensor: torch.Tensor, num_partitions: int, contiguous_split_chunks: bool = False
) -> Sequence[torch.Tensor]:
    """Split `[..., n]` into `num_partitions` views `[..., n/num_partitions]`.

    Raises ValueError when the last dim is not divisible by `num_partitions`.
    """
    last = tensor.size(-1)
    if num_partitions < 1 or last % num_partitions != 0:
        raise ValueError(
            f"split_tensor_along_last_dim: last dim ({last}) must be divisible by "
            f"num_partitions ({num_partitions})"
        )
    chunks = torch.split(tensor, last // num_partitions, dim=-1)
    if contiguous_split_chunks:
        return tuple(chunk.contiguous() for chunk in chunks)
    return chunks


def split_tensor_into_1d_equal_chunks(
    tensor: torch.Tensor, new_buffer: bool = False, tp_group=None
) -> torch.Tensor:
    """This TP rank's 1-D slice of the flattened `tensor`: `[numel] -> [numel/tp]`.

    With `new_buffer` the slice is copied into fresh memory (so the full tensor can be freed).
    """
    tp_group = get_tensor_model_parallel_group_if_none(tp_group)
    tp_size, tp_rank = group_size(tp_group), group_rank(tp_group)
    numel = tensor.numel()
    if numel % tp_size != 0:
        raise ValueError(
            f"split_tensor_into_1d_equal_chunks: numel ({numel}) must be divisible by the "
            f"tensor-parallel size ({tp_size})"
        )
    per_rank = numel // tp_size
    flat = tensor.reshape(-1)[tp_rank * per_rank : (tp_rank + 1) * per_rank]
    if new_buffer:
        out = torch.empty(per_rank, dtype=tensor.dtype, device=tensor.device)
        out.copy_(flat)
        return out
    return flat


def gather_split_1d_tensor(tensor: torch.Tensor, tp_group=None) -> torch.Tensor:
    """Inverse of `split_tensor_into_1d_equal_chunks`: all-gather `[n] -> [n * tp]` (1-D)."""
    tp_group = get_tensor_model_parallel_group_if_none(tp_group)
    tp_size = group_size(tp_group)
    flat = tensor.reshape(-1).contiguous()
    if tp_size == 1:
        return flat
    out = torch.empty(flat.numel() * tp_size, dtype=tensor.dtype, device=tensor.device)
    all_gather_into(out, flat, tp_group)
    return out


class VocabUtility:
    """Contiguous vocabulary ranges `[first, last)` owned by each TP rank."""

    @staticmethod
    def vocab_range_from_per_partition_vocab_size(
        per_partition_vocab_size: int, rank: int, world_size: int
    ) -> tuple[int, int]:
        """`[rank * p, (rank + 1) * p)` for `p = per_partition_vocab_size`."""
        first = rank * per_partition_vocab_size
        return first, first + per_partition_vocab_size

    @staticmethod
    def vocab_range_from_global_vocab_size(
        global_vocab_size: int, rank: int, world_size: int
    ) -> tuple[int, int]:
        """Range of `rank` when `global_vocab_size` is split evenly over `world_size` ranks."""
        if global_vocab_size % world_size != 0:
            raise ValueError(
                f"vocabulary size ({global_vocab_size}) must be divisible by the "
                f"tensor-parallel size ({world_size}); pad the vocabulary"
            )
        per_partition = global_vocab_size // world_size
        return VocabUtility.vocab_range_from_per_partition_vocab_size(
            per_partition, rank, world_size
        )
