"""Checkpoint boxes of FSDP-sharded params: the model's `sharded_state_dict` (written for whole
TP-local tensors) cut down to the rows this DP rank holds.

FSDP2 shards each TP-local param `[R, ...]` along dim 0 in chunks of ceil(R / dp): DP rank c
holds rows [c * chunk, min((c + 1) * chunk, R)). Every ShardedTensor the model builds over the
TP-local tensor (or each piece a factory builds, e.g. GLU fc1's gate and up row blocks) becomes
the box of those rows it overlaps, at the same global coordinates, viewing the local shard. So
an FSDP checkpoint holds the same global tensors as a DDP one: either layout, at any DP (and
TP) size, loads it, and the reshardable optimizer state (`dist_checkpointing.optimizer`) follows
the same boxes. A rank whose shard of a param is empty writes nothing for it.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.distributed.tensor import DTensor, Shard

from gigatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory


def _local_rows(param: DTensor) -> tuple[int, int]:
    """[r0, r1): the rows of dim 0 this rank's shard of `param` holds."""
    rows = param.shape[0]
    r0, r1 = 0, rows
    for mesh_dim, placement in enumerate(param.placements):
        if isinstance(placement, Shard):
            if placement.dim != 0:
                raise ValueError(f"FSDP shard on dim {placement.dim}: only dim 0 is supported")
            n = param.device_mesh.size(mesh_dim)
            chunk = -(-rows // n)
            r0 = min(param.device_mesh.get_local_rank(mesh_dim) * chunk, rows)
            r1 = min(r0 + chunk, rows)
    return r0, r1


def _pieces(entry, full: torch.Tensor) -> list[ShardedTensor]:
    """The ShardedTensors `entry` stands for, their data views of `full` (a meta tensor shaped
    like the whole TP-local param)."""
    if isinstance(entry, ShardedTensorFactory):
        pieces = entry.build_fn(entry.key, full, entry.replica_id, None)
        return pieces if isinstance(pieces, list) else [pieces]
    return [dataclasses.replace(entry, data=full)]


def _row_boxes(entry, param: DTensor, sharded: bool) -> list[ShardedTensor]:
    local = param.to_local()
    r0, r1 = _local_rows(param)
    full = torch.empty(param.shape, dtype=param.dtype, device="meta")
    row = full.stride(0) if full.dim() else 1
    boxes = []
    for piece in _pieces(entry, full):
        start = piece.data.storage_offset() // row
        n = piece.data.shape[0] if piece.data.dim() else 1
        if tuple(piece.data.shape[1:]) != tuple(full.shape[1:]) or not piece.data.is_contiguous():
            raise ValueError(
                f"{piece.key}: FSDP checkpoints need whole-row pieces of the param "
                f"(got {tuple(piece.data.shape)} of {tuple(full.shape)})"
            )
        a, b = max(r0, start), min(r1, start + n)
        if a >= b:
            continue
        p = piece.prepend_axis_num
        offset = list(piece.global_offset)
        offset[p] += a - start
        replica = piece.replica_id
        if sharded and isinstance(replica, tuple) and len(replica) == 3:
            replica = (replica[0], replica[1], 0)  # DP ranks hold disjoint rows
        boxes.append(
            dataclasses.replace(
                piece,
                data=local[a - r0 : b - r0],
                local_shape=(b - a, *piece.local_shape[1:]),
                global_offset=tuple(offset),
                axis_fragmentations=None,
                replica_id=replica,
            )
        )
    return boxes


def fsdp_sharded_state_dict(sharded_sd: dict, *, sharded: bool) -> dict:
    """`sharded_sd` with each entry over a DTensor param replaced by the boxes of this rank's
    rows (module doc): one ShardedTensor, or a factory over the local shard whose pieces are
    those boxes (loaded in place, merged by concatenating the rows). `sharded`: False for
    `no_shard`, whose DP ranks hold replicas."""
    out = {}
    for name, entry in sharded_sd.items():
        param = getattr(entry, "data", None)
        if not isinstance(param, DTensor):
            out[name] = entry
            continue
        boxes = _row_boxes(entry, param, sharded)
        if not boxes:
            continue
        if len(boxes) == 1:
            out[name] = boxes[0]
            continue
        out[name] = ShardedTensorFactory(
            entry.key,
            param.to_local(),
            lambda key, data, replica_id, flattened_range, boxes=boxes: boxes,
            lambda loaded: torch.cat(loaded),
            boxes[0].replica_id,
        )
    return out
