"""Checks before a save or load: every element written exactly once, keys and shapes agree.

Mirrors `megatron.core.dist_checkpointing.validation` (StrictHandling, parse_strict_flag,
determine_global_metadata, validate_sharding_integrity). Every rank runs the same checks on the
same all-gathered metadata, so a bad sharding raises on all ranks alike instead of leaving the
others waiting in a collective.
"""

from __future__ import annotations

import logging
import math
from enum import Enum

from gigatron.core.dist_checkpointing._boxes import sharded_tensor_boxes
from gigatron.core.dist_checkpointing.core import CheckpointingException
from gigatron.core.dist_checkpointing.dict_utils import nested_values
from gigatron.core.dist_checkpointing.mapping import (
    ShardedBase,
    ShardedObject,
    ShardedTensor,
    is_main_replica,
)
from gigatron.core.dist_checkpointing.strategies.torch import _all_gather_object

logger = logging.getLogger(__name__)

__all__ = [
    "StrictHandling",
    "determine_global_metadata",
    "gather_compact_metadata",
    "parse_strict_flag",
    "validate_sharding_integrity",
]


class StrictHandling(Enum):
    """What `load` does about key mismatches between the request and the checkpoint.

    "Unexpected" = requested but absent from the checkpoint; "missing" = in the checkpoint
    but requested by no rank (needs a metadata exchange: the *_ALL variants).
    """

    ASSUME_OK_UNEXPECTED = "assume_ok_unexpected"
    LOG_UNEXPECTED = "log_unexpected"
    LOG_ALL = "log_all"
    RAISE_UNEXPECTED = "raise_unexpected"
    RAISE_ALL = "raise_all"
    RETURN_UNEXPECTED = "return_unexpected"
    RETURN_ALL = "return_all"
    IGNORE_ALL = "ignore_all"

    @staticmethod
    def requires_explicit_ckpt_mismatch_check(val: StrictHandling) -> bool:
        return val != StrictHandling.ASSUME_OK_UNEXPECTED

    @staticmethod
    def requires_global_app_metadata(val: StrictHandling) -> bool:
        return val in (
            StrictHandling.IGNORE_ALL,
            StrictHandling.RAISE_ALL,
            StrictHandling.RETURN_ALL,
            StrictHandling.LOG_ALL,
        )

    @staticmethod
    def requires_returning_mismatch_keys(val: StrictHandling) -> bool:
        return val in (StrictHandling.RETURN_UNEXPECTED, StrictHandling.RETURN_ALL)


def parse_strict_flag(strict: str | StrictHandling | bool) -> StrictHandling:
    """StrictHandling from an enum, its string value, or a bool (True: raise on any mismatch)."""
    if isinstance(strict, StrictHandling):
        return strict
    if isinstance(strict, bool):
        return StrictHandling.RAISE_ALL if strict else StrictHandling.LOG_UNEXPECTED
    try:
        return StrictHandling(strict)
    except ValueError as e:
        allowed = [s.value for s in StrictHandling]
        raise ValueError(f"strict ({strict!r}) must be one of {allowed}") from e


def _local_metadata(sharded_tensors: list[ShardedTensor], sharded_objects: list[ShardedObject]):
    tensors = []
    for sh in sharded_tensors:
        boxes = [b[:2] for b in sharded_tensor_boxes(sh)] if is_main_replica(sh.replica_id) else []
        tensors.append((sh.key, sh.global_shape, str(sh.dtype), sh.allow_shape_mismatch, boxes))
    objects = [(sh.unique_key, is_main_replica(sh.replica_id)) for sh in sharded_objects]
    return tensors, objects


def determine_global_metadata(sharded_state_dict, process_group=None):
    """(local, all ranks') metadata of a sharded state dict (collective over `process_group`,
    default the world): Megatron's form, each rank's ShardedBase leaves without data.
    `validate_sharding_integrity` takes the second element."""
    local = [
        v.without_data() for v in nested_values(sharded_state_dict) if isinstance(v, ShardedBase)
    ]
    return local, _all_gather_object(local, process_group)


def gather_compact_metadata(sharded_tensors, sharded_objects, group=None):
    """(local, all ranks') compact metadata: keys, global shapes, dtypes, main-replica boxes
    (what save / load exchange: no ShardedTensor objects pickled)."""
    local = _local_metadata(sharded_tensors, sharded_objects)
    return local, _all_gather_object(local, group)


def _compact(rank_leaves: list) -> tuple:
    tensors = [v for v in rank_leaves if isinstance(v, ShardedTensor)]
    objects = [v for v in rank_leaves if isinstance(v, ShardedObject)]
    return _local_metadata(tensors, objects)


def _overlap(a, b) -> bool:
    return all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a[0], a[1], b[0], b[1]))


def validate_sharding_integrity(global_metadata, common_state_dict=None) -> None:
    """Raise CheckpointingException unless every element of every key has exactly one writer.

    global_metadata: per rank, either `determine_global_metadata`'s ShardedBase list or the
    compact form of `gather_compact_metadata`. common_state_dict is accepted (Megatron checks
    it is equal on all ranks; gigatron takes rank 0's).
    """
    global_metadata = [_compact(md) if isinstance(md, list) else md for md in global_metadata]
    shapes: dict[str, tuple] = {}
    boxes: dict[str, list] = {}
    for rank, (tensors, _) in enumerate(global_metadata):
        for key, gshape, dtype, mismatch, bxs in tensors:
            seen = shapes.setdefault(key, (gshape, dtype, rank))
            if (seen[0] != gshape and not mismatch) or seen[1] != dtype:
                raise CheckpointingException(
                    f"{key}: rank {seen[2]} has global shape {seen[0]} dtype {seen[1]} but rank "
                    f"{rank} has {gshape} {dtype}"
                )
            boxes.setdefault(key, []).extend((tuple(o), tuple(s), rank) for o, s in bxs)
    for key, bxs in boxes.items():
        gshape = shapes[key][0]
        volume = sum(math.prod(s) for _, s, _ in bxs)
        bxs.sort()
        for i, a in enumerate(bxs):  # sweep along the first axis
            for b in bxs[i + 1 :]:
                if a[0] and b[0][0] >= a[0][0] + a[1][0]:
                    break
                if _overlap(a, b):
                    raise CheckpointingException(
                        f"{key}: ranks {a[2]} and {b[2]} both write the box at offset {b[0]} "
                        "as main replica (replica_id must be nonzero on all but one copy)"
                    )
        if volume != math.prod(gshape):
            raise CheckpointingException(
                f"{key}: main replicas cover {volume} of {math.prod(gshape)} elements of global "
                f"shape {gshape}: some shard has no main replica (all-zero replica_id)"
            )
    writers: dict[str, int] = {}
    for tensors_objs in global_metadata:
        for ukey, main in tensors_objs[1]:
            writers[ukey] = writers.get(ukey, 0) + int(main)
    bad = {k: n for k, n in writers.items() if n != 1}
    if bad:
        raise CheckpointingException(
            f"sharded objects need exactly one main replica each; writer counts: {bad}"
        )
