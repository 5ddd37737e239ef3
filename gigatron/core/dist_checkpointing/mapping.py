"""What a rank holds of each global tensor or object: the sharded-state-dict vocabulary.

Mirrors `megatron.core.dist_checkpointing.mapping`. A `ShardedTensor` says "my local `data` is the
box at `global_offset` of size `local_shape` inside the global tensor `global_shape` saved under
`key`" (optionally only a contiguous `flattened_range` of that box, as the distributed optimizer
holds it). `replica_id` marks copies: only the main replica (all zeros) writes. A `ShardedObject`
is any picklable object placed on a grid of objects; `LocalNonpersistentObject` is restored
locally and never stored; `ShardedTensorFactory` transforms a tensor on save and merges it back
on load.

gigatron difference: `flattened_range` is supported for any ND shard (megatron-core 0.16 rejects
it): the range is written as the few rectangular boxes it covers, so the checkpoint holds the
plain global tensor and any other layout (flat or not) can read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gigatron.core.dist_checkpointing.core import CheckpointingException
from gigatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace

__all__ = [
    "ShardedBase",
    "ShardedTensor",
    "ShardedObject",
    "ShardedTensorFactory",
    "LocalNonpersistentObject",
    "apply_factories",
    "apply_factory_merges",
    "is_main_replica",
    "StateDict",
    "ShardedStateDict",
    "ReplicaId",
]

StateDict = dict[str, Any]
ShardedStateDict = dict[str, Any]
ReplicaId = int | tuple[int, ...]


def is_main_replica(replica_id: ReplicaId) -> bool:
    """True for 0 or an all-zeros tuple: the copy that writes."""
    if isinstance(replica_id, int):
        return replica_id == 0
    return all(r == 0 for r in replica_id)


class ShardedBase:
    """Common base of ShardedTensor and ShardedObject (has `key`, `data`, `replica_id`)."""

    key: str
    data: Any
    replica_id: ReplicaId


@dataclass
class ShardedTensor(ShardedBase):
    """A local box (or a flat slice of one) of the global tensor `key`.

    Shapes: `data` is `local_shape` (or 1D of `flattened_range` length); `global_shape` and
    `global_offset` have `prepend_axis_num + len(local_shape)` entries: the leading
    (prepended) axes are singleton on this rank (e.g. the stacked-layer axis).
    """

    key: str
    data: torch.Tensor | None = field(repr=False)
    dtype: torch.dtype
    local_shape: tuple[int, ...]
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    axis_fragmentations: tuple[int, ...] | None
    replica_id: ReplicaId = 0
    prepend_axis_num: int = 0
    allow_shape_mismatch: bool = False
    flattened_range: slice | None = None

    def __post_init__(self):
        self.local_shape = tuple(self.local_shape)
        self.global_shape = tuple(self.global_shape)
        self.global_offset = tuple(self.global_offset)
        self.validate_metadata_integrity()

    def validate_metadata_integrity(self) -> None:
        """Raise CheckpointingException when shapes, offsets, dtype or range disagree."""
        ndim = self.prepend_axis_num + len(self.local_shape)
        if len(self.global_shape) != ndim or len(self.global_offset) != ndim:
            raise CheckpointingException(
                f"{self.key}: global_shape {self.global_shape} and global_offset "
                f"{self.global_offset} must have prepend_axis_num ({self.prepend_axis_num}) + "
                f"len(local_shape {self.local_shape}) = {ndim} entries"
            )
        local_full = (1,) * self.prepend_axis_num + self.local_shape
        for off, loc, glob in zip(self.global_offset, local_full, self.global_shape):
            if off < 0 or (off + loc > glob and not self.allow_shape_mismatch):
                raise CheckpointingException(
                    f"{self.key}: box at offset {self.global_offset} of size {local_full} "
                    f"does not fit in global_shape {self.global_shape}"
                )
        if self.flattened_range is not None:
            r = self.flattened_range
            if r.step not in (None, 1) or not 0 <= r.start <= r.stop <= self.local_numel:
                raise CheckpointingException(
                    f"{self.key}: flattened_range {r} must be a step-1 slice inside "
                    f"[0, {self.local_numel}] (local_shape {self.local_shape})"
                )
        if self.data is None:
            return
        if self.data.dtype != self.dtype:
            raise CheckpointingException(
                f"{self.key}: data dtype {self.data.dtype} != dtype {self.dtype}"
            )
        expected = (
            self.local_shape
            if self.flattened_range is None
            else (self.flattened_range.stop - self.flattened_range.start,)
        )
        if tuple(self.data.shape) != expected:
            raise CheckpointingException(
                f"{self.key}: data shape {tuple(self.data.shape)} != expected {expected} "
                f"(local_shape {self.local_shape}, flattened_range {self.flattened_range})"
            )

    @property
    def local_numel(self) -> int:
        return math.prod(self.local_shape)

    @property
    def has_regular_grid(self) -> bool:
        return self.axis_fragmentations is not None

    def global_slice(self) -> tuple[int | slice, ...]:
        """Index of this (non-flat) box in the global tensor: ints on prepended axes."""
        p = self.prepend_axis_num
        return tuple(self.global_offset[:p]) + tuple(
            slice(o, o + s) for o, s in zip(self.global_offset[p:], self.local_shape)
        )

    def narrow(self, dim: int, start: int, length: int) -> list[ShardedTensor]:
        """`torch.narrow` of every rank's local box: keep `length` elements from `start` along
        local axis `dim` (prepended axes not counted). The global tensor shrinks the same way on
        every rank, so the boxes must form a regular grid along `dim`:

            global_shape[d]  -> global_shape[d] * length / local_shape[dim]
            global_offset[d] -> global_offset[d] * length / local_shape[dim]

        Returns a one-element list (Megatron's signature)."""
        if self.flattened_range is not None:
            raise CheckpointingException(
                f"{self.key}: narrow of a flat ShardedTensor (flattened_range "
                f"{self.flattened_range}) is not supported; narrow before flattening"
            )
        if not 0 <= dim < len(self.local_shape):
            raise CheckpointingException(
                f"{self.key}: narrow dim ({dim}) must index local_shape {self.local_shape}"
            )
        local_len, d = self.local_shape[dim], dim + self.prepend_axis_num
        if not (0 <= start and 0 < length and start + length <= local_len):
            raise CheckpointingException(
                f"{self.key}: narrow [{start}, {start + length}) must lie within local axis "
                f"{dim} of length {local_len}"
            )
        if self.global_shape[d] % local_len or self.global_offset[d] % local_len:
            raise CheckpointingException(
                f"{self.key}: narrow needs a regular grid along axis {dim}: global_shape "
                f"{self.global_shape} and global_offset {self.global_offset} must be multiples "
                f"of the local length {local_len}"
            )
        global_shape, global_offset = list(self.global_shape), list(self.global_offset)
        global_shape[d] = global_shape[d] // local_len * length
        global_offset[d] = global_offset[d] // local_len * length
        data = None if self.data is None else self.data.narrow(dim, start, length)
        local_shape = list(self.local_shape)
        local_shape[dim] = length
        narrowed = replace(
            self, data=data, local_shape=tuple(local_shape), global_shape=tuple(global_shape),
            global_offset=tuple(global_offset),
        )  # fmt: skip
        return [narrowed]

    def without_data(self) -> ShardedTensor:
        return replace(self, data=None)

    def init_data(self, device: str | torch.device = "cpu", init_fn=torch.empty) -> None:
        """Allocate `data` (used on load when the caller gave only the layout)."""
        if self.data is not None:
            return
        shape = (
            self.local_shape
            if self.flattened_range is None
            else (self.flattened_range.stop - self.flattened_range.start,)
        )
        self.data = init_fn(shape, dtype=self.dtype, device=device)

    @classmethod
    def from_rank_offsets(
        cls,
        key: str,
        data: torch.Tensor,
        *rank_offsets: tuple[int, int, int],
        replica_id: ReplicaId = 0,
        prepend_axis_num: int = 0,
        flattened_range: None = None,
        **init_kwargs,
    ) -> ShardedTensor:
        """Build from `(axis, axis_rank_offset, axis_fragmentations)` triples.

        Each triple says: along global `axis` the tensor is cut into `axis_fragmentations` equal
        pieces and `data` is piece `axis_rank_offset`. Axes < `prepend_axis_num` are the
        prepended singleton axes (piece size 1).
        """
        if flattened_range is not None:
            raise ValueError(
                f"{key}: flattened_range must be None in from_rank_offsets; "
                "use from_rank_offsets_flat"
            )
        return cls._from_offsets(
            key, data, tuple(data.shape), rank_offsets, replica_id, prepend_axis_num, None,
            init_kwargs,
        )  # fmt: skip

    @classmethod
    def from_rank_offsets_flat(
        cls,
        key: str,
        data: torch.Tensor,
        non_flat_local_shape: tuple[int, ...],
        *rank_offsets: tuple[int, int, int],
        flattened_range: slice,
        replica_id: ReplicaId = 0,
        prepend_axis_num: int = 0,
        **init_kwargs,
    ) -> ShardedTensor:
        """Like `from_rank_offsets` for a 1D `data` = flat slice `flattened_range` of the box.

        The box has shape `non_flat_local_shape`; this is how the distributed optimizer's
        contiguous shard of a parameter (and its Adam moments) is described.
        """
        if data.ndim != 1:
            raise ValueError(f"{key}: flat data must be 1D, got shape {tuple(data.shape)}")
        return cls._from_offsets(
            key, data, tuple(non_flat_local_shape), rank_offsets, replica_id, prepend_axis_num,
            flattened_range, init_kwargs,
        )  # fmt: skip

    @classmethod
    def _from_offsets(
        cls, key, data, local_shape, rank_offsets, replica_id, prepend_axis_num, frange, kw
    ):
        ndim = prepend_axis_num + len(local_shape)
        offset, shape, frags = [0] * ndim, [1] * prepend_axis_num + list(local_shape), [1] * ndim
        seen = set()
        for axis, axis_rank_offset, axis_fragm in rank_offsets:
            if not (0 <= axis < ndim) or axis in seen:
                raise ValueError(
                    f"{key}: rank_offsets axis {axis} invalid or repeated (ndim {ndim})"
                )
            if axis_fragm < 1 or not 0 <= axis_rank_offset < axis_fragm:
                raise ValueError(
                    f"{key}: rank_offsets ({axis}, {axis_rank_offset}, {axis_fragm}) needs "
                    "0 <= axis_rank_offset < axis_fragmentations"
                )
            seen.add(axis)
            piece = 1 if axis < prepend_axis_num else local_shape[axis - prepend_axis_num]
            shape[axis] = axis_fragm * piece
            offset[axis] = axis_rank_offset * piece
            frags[axis] = axis_fragm
        return cls(
            key, data, data.dtype, local_shape, tuple(shape), tuple(offset), tuple(frags),
            replica_id, prepend_axis_num, flattened_range=frange, **kw,
        )  # fmt: skip


@dataclass
class ShardedObject(ShardedBase):
    """A picklable object at `global_offset` in a grid `global_shape` of objects (not reshardable).

    Stored under `unique_key` = "{key}/shard_{offsets joined by .}_{shape joined by .}".
    """

    key: str
    data: object
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    replica_id: ReplicaId = 0

    def __post_init__(self):
        self.global_shape = tuple(self.global_shape)
        self.global_offset = tuple(self.global_offset)
        if len(self.global_shape) != len(self.global_offset):
            raise CheckpointingException(
                f"{self.key}: global_shape {self.global_shape} and global_offset "
                f"{self.global_offset} differ in length"
            )

    @property
    def unique_key(self) -> str:
        offs = ".".join(map(str, self.global_offset))
        shape = ".".join(map(str, self.global_shape))
        return f"{self.key}/shard_{offs}_{shape}"

    def without_data(self) -> ShardedObject:
        return replace(self, data=None)

    @classmethod
    def empty_from_unique_key(cls, unique_key: str, replica_id: ReplicaId = 0) -> ShardedObject:
        """Inverse of `unique_key` (data None)."""
        key, _, shard = unique_key.rpartition("/shard_")
        offs, _, shape = shard.partition("_")
        to_tuple = lambda s: tuple(int(x) for x in s.split(".")) if s else ()
        return cls(key, None, to_tuple(shape), to_tuple(offs), replica_id)


@dataclass
class ShardedTensorFactory(ShardedBase):
    """Turns one local tensor into a sub-state-dict of ShardedBase on save; merges it on load.

    `build_fn(key, data, replica_id, flattened_range) -> ShardedStateDict`;
    `merge_fn(loaded_sub_state_dict) -> torch.Tensor`.
    """

    key: str
    data: torch.Tensor
    build_fn: Callable[..., ShardedStateDict]
    merge_fn: Callable[[StateDict], torch.Tensor]
    replica_id: ReplicaId = 0
    flattened_range: slice | None = None

    def build(self) -> ShardedStateDict:
        return self.build_fn(self.key, self.data, self.replica_id, self.flattened_range)


@dataclass
class LocalNonpersistentObject:
    """An object restored from the caller's own value on load and never written."""

    obj: Any

    def unwrap(self) -> Any:
        return self.obj


def apply_factories(sharded_state_dict: ShardedStateDict) -> None:
    """Replace every ShardedTensorFactory by what it builds (in place)."""
    dict_list_map_inplace(
        lambda x: x.build() if isinstance(x, ShardedTensorFactory) else x, sharded_state_dict
    )


def apply_factory_merges(x1: StateDict, x2: ShardedStateDict, key: tuple = ()) -> StateDict:
    """Merge what was loaded for each factory's built pieces (`x1`) with the factories of the
    request (`x2`, same nesting) back into one tensor each (in place); returns `x1`."""
    if isinstance(x2, ShardedTensorFactory):
        return x2.merge_fn(x1)
    if isinstance(x1, dict) and isinstance(x2, dict):
        for k, v2 in x2.items():
            if k not in x1:
                raise ValueError(f"apply_factory_merges: key {key + (k,)} is not in the state dict")
            x1[k] = apply_factory_merges(x1[k], v2, key + (k,))
    elif isinstance(x1, list) and isinstance(x2, (list, dict)):
        items = enumerate(x2) if isinstance(x2, list) else x2.items()
        if isinstance(x2, list) and len(x1) != len(x2):
            raise ValueError(
                f"apply_factory_merges: lists of lengths {len(x1)} and {len(x2)} at {key}"
            )
        for i, v2 in items:
            if not isinstance(i, int) or not 0 <= i < len(x1):
                raise ValueError(f"apply_factory_merges: index {i!r} not in a list at {key}")
            x1[i] = apply_factory_merges(x1[i], v2, key + (i,))
    else:
        raise ValueError(f"apply_factory_merges: two non-container values at {key}")
    return x1
