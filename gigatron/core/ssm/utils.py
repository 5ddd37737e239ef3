"""Helpers of the SSM layers: per-component TP slices and the split checkpoint entries.

A Mamba in_proj packs components of different sizes ([z | x | B | C | dt]) in one
column-parallel weight, and each TP rank holds its slice of *each* component
([z_r | x_r | B_r | C_r | dt_r]), not a contiguous block of the whole. `shard_sections` takes
that slice from the full tensor; `split_tensor_factory` saves the rank's tensor as one
checkpoint entry per component (`in_proj.weight.z`, ...), as Megatron's
`megatron.core.ssm.utils._split_tensor_factory` does, so checkpoints reshard across TP sizes.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gigatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory


def shard_sections(
    full: torch.Tensor, sections: list[int], tp_rank: int, tp_size: int, dim: int = 0
) -> torch.Tensor:
    """[sum(sections), ...] -> [sum(sections) / tp, ...]: rank `tp_rank`'s equal slice of each
    section along `dim`, concatenated in section order."""
    for size in sections:
        if size % tp_size:
            raise ValueError(f"section size {size} must be divisible by tp_size ({tp_size})")
    pieces = full.split(sections, dim=dim)
    return torch.cat([p.chunk(tp_size, dim=dim)[tp_rank] for p in pieces], dim=dim)


def split_tensor_factory(
    sharded: ShardedTensor, sections: list[int], names: list[str], dim: int
) -> ShardedTensorFactory:
    """One ShardedTensor whose local rows are [part_0 | part_1 | ...] (local sizes `sections`)
    -> a factory saving each part as its own TP-sharded entry `key.<name>`; load concatenates."""
    if sum(sections) != sharded.local_shape[dim]:
        raise ValueError(
            f"{sharded.key}: split sections {sections} must cover local axis {dim} "
            f"({sharded.local_shape[dim]})"
        )
    layout = sharded.without_data()

    def build(key, data, replica_id, flattened_range):
        whole = replace(layout, key=key, data=data, dtype=data.dtype, replica_id=replica_id,
                        flattened_range=flattened_range)  # fmt: skip
        parts, start = [], 0
        for size, name in zip(sections, names):
            (part,) = whole.narrow(dim, start, size)
            part.key = f"{key}.{name}"
            parts.append(part)
            start += size
        return parts

    def merge(pieces):
        return torch.cat(list(pieces), dim=dim)

    return ShardedTensorFactory(sharded.key, sharded.data, build, merge, sharded.replica_id)
