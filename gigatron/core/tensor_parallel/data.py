"""Broadcast a batch from tensor-parallel rank 0 to the other TP ranks.

Mirrors `megatron.core.tensor_parallel.data.broadcast_data`: TP rank 0 sends the sizes of the
named tensors (up to `_MAX_DATA_DIM - 1` dims each), then all their data flattened into one
buffer: two broadcasts in total. Tensors land on the current CUDA device, or on the CPU when
there is no CUDA (so gloo-only runs work).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gigatron.core.utils import (
    default_device,
    get_tensor_model_parallel_group_if_none,
    group_rank,
    group_src_rank,
)

__all__ = ["broadcast_data"]

_MAX_DATA_DIM = 5


def _check_data_types(keys, data, target_dtype) -> None:
    for key in keys:
        if data[key].dtype != target_dtype:
            raise ValueError(
                f"broadcast_data: {key!r} has dtype {data[key].dtype}, expected {target_dtype}"
            )


def _build_key_size_numel_dictionaries(keys, data, group, rank, src_rank):
    """Broadcast the tensor shapes from the source: (key -> shape, key -> numel, total numel)."""
    sizes = [0] * (_MAX_DATA_DIM * len(keys))
    if rank == 0:
        for k, key in enumerate(keys):
            shape = data[key].shape
            if len(shape) >= _MAX_DATA_DIM:
                raise ValueError(
                    f"broadcast_data: {key!r} has {len(shape)} dims; at most {_MAX_DATA_DIM - 1}"
                )
            if any(s == 0 for s in shape):
                raise ValueError(f"broadcast_data: {key!r} has an empty dim (shape {tuple(shape)})")
            sizes[k * _MAX_DATA_DIM : k * _MAX_DATA_DIM + len(shape)] = shape
    sizes_t = torch.tensor(sizes, dtype=torch.long, device=default_device())
    dist.broadcast(sizes_t, src_rank, group=group)
    sizes = sizes_t.cpu().tolist()

    key_size, key_numel, total_numel = {}, {}, 0
    for k, key in enumerate(keys):
        row = sizes[k * _MAX_DATA_DIM : (k + 1) * _MAX_DATA_DIM]
        shape = row[: row.index(0)] if 0 in row else row
        numel = 1
        for s in shape:
            numel *= s
        key_size[key], key_numel[key] = shape, numel
        total_numel += numel
    return key_size, key_numel, total_numel


def broadcast_data(keys, data, datatype, tp_group=None) -> dict[str, torch.Tensor]:
    """Return `{key: tensor}` on every TP rank, taken from `data` on TP rank 0.

    All tensors must have `datatype`. Other ranks may pass `data` without the keys.
    """
    tp_group = get_tensor_model_parallel_group_if_none(tp_group)
    rank, src_rank = group_rank(tp_group), group_src_rank(tp_group)
    key_size, key_numel, total_numel = _build_key_size_numel_dictionaries(
        keys, data, tp_group, rank, src_rank
    )
    device = default_device()
    if rank == 0:
        _check_data_types(keys, data, datatype)
        flat = torch.cat([data[key].contiguous().view(-1) for key in keys], dim=0).to(device)
    else:
        flat = torch.empty(total_numel, device=device, dtype=datatype)
    dist.broadcast(flat, src_rank, group=tp_group)

    output, offset = {}, 0
    for key in keys:
        numel = key_numel[key]
        output[key] = flat.narrow(0, offset, numel).view(key_size[key])
        offset += numel
    return output
