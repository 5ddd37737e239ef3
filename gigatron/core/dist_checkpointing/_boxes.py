"""Pure geometry: which rectangular boxes of the global tensor a ShardedTensor covers.

A non-flat shard is one box. A `flattened_range` [start, stop) of a row-major box of shape
`local_shape` is a partial leading row, some full rows, and a partial trailing row, recursively:
at most 2 * ndim - 1 boxes, each contiguous in flat order. Writing those boxes (instead of a
flat 1D tensor) keeps the checkpoint a plain global tensor that any layout can read.
"""

from __future__ import annotations

import math

import torch

__all__ = ["Box", "flat_range_boxes", "sharded_tensor_boxes"]

# (global_offsets, sizes, flat_start): flat_start indexes the 1D `data` of a flat shard
# (0 for a non-flat shard). offsets/sizes include the prepended singleton axes.
Box = tuple[tuple[int, ...], tuple[int, ...], int]


def flat_range_boxes(
    shape: tuple[int, ...], start: int, stop: int
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Boxes (offsets, sizes) inside `shape` covering flat indices [start, stop), in flat order."""
    if start >= stop:
        return []
    if len(shape) <= 1:
        return [((start,), (stop - start,))] if shape else [((), ())]
    inner = math.prod(shape[1:])
    if inner == 0:
        return []
    first, last = start // inner, (stop - 1) // inner
    lift = lambda row, boxes: [((row,) + o, (1,) + s) for o, s in boxes]
    if first == last:
        return lift(first, flat_range_boxes(shape[1:], start - first * inner, stop - first * inner))
    out = []
    if start % inner:
        out += lift(first, flat_range_boxes(shape[1:], start % inner, inner))
        first += 1
    full_end = last if stop % inner else last + 1
    if full_end > first:
        out.append(((first,) + (0,) * (len(shape) - 1), (full_end - first,) + tuple(shape[1:])))
    if stop % inner:
        out += lift(last, flat_range_boxes(shape[1:], 0, stop - last * inner))
    return out


def sharded_tensor_boxes(sh_ten) -> list[Box]:
    """Global boxes of a ShardedTensor (prepended axes included), with their flat starts."""
    p = sh_ten.prepend_axis_num
    pre_off, pre_size = tuple(sh_ten.global_offset[:p]), (1,) * p
    base = sh_ten.global_offset[p:]
    if sh_ten.flattened_range is None:
        return [(tuple(sh_ten.global_offset), pre_size + tuple(sh_ten.local_shape), 0)]
    r = sh_ten.flattened_range
    out, pos = [], 0
    for offs, sizes in flat_range_boxes(tuple(sh_ten.local_shape), r.start, r.stop):
        glob = pre_off + tuple(b + o for b, o in zip(base, offs))
        out.append((glob, pre_size + sizes, pos))
        pos += math.prod(sizes)
    return out


def box_view(sh_ten, box: Box) -> torch.Tensor:
    """The part of `sh_ten.data` that holds `box`, shaped like the box (a view when possible)."""
    _, sizes, flat_start = box
    if sh_ten.flattened_range is None:
        return (
            sh_ten.data.view(sizes) if sh_ten.data.is_contiguous() else sh_ten.data.reshape(sizes)
        )
    return sh_ten.data[flat_start : flat_start + math.prod(sizes)].view(sizes)
