"""A built (sharded) gigatron model -> HF tensors, streamed one tensor at a time from the ranks.

No counterpart in megatron.core; Megatron-Bridge's `export_hf_weights` does this on GPUs. Each
rank knows its pieces of the per-layer tensors from its chunks' `sharded_state_dict()` (global
offsets of TP slices, its pipeline stages, its experts; `_ckpt_layout.tensor_slices`). For each
recipe, in the family's order, every rank builds the full Megatron tensor: zeros, its main-replica
pieces copied in, then one all-reduce (sum) over the world of the tensor's bytes viewed as uint8.
Exactly one rank holds the main replica of each element (dist_checkpointing's own rule), so
every byte is its owner's byte plus zeros: the result is bitwise the model's value (a float sum
would turn -0.0 into +0.0). Then the recipe's `to_hf` gives the HF tensors. Peak memory is the
rank's model plus one recipe's tensors; every rank yields every tensor (Megatron-Bridge's
contract too), and a writer keeps rank 0's.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from gigatron.convert._ckpt_layout import _pieces, index_axes, tensor_slices
from gigatron.convert._recipe_ops import hf_outputs
from gigatron.convert._recipes import recipes_for_keys
from gigatron.core.dist_checkpointing import ShardedObject


def unwrap(chunk):
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def _is_main(replica_id) -> bool:
    ids = replica_id if isinstance(replica_id, tuple) else (replica_id,)
    return all(i == 0 for i in ids)


def local_pieces(chunks: list) -> dict[str, list[tuple[Tensor, tuple]]]:
    """{per-layer name: [(this rank's main-replica values, box in the full tensor)]}."""
    out: dict[str, list] = {}
    for chunk in chunks:
        for entry in unwrap(chunk).sharded_state_dict().values():
            if isinstance(entry, ShardedObject):
                continue
            for piece in _pieces(entry):
                if not _is_main(piece.replica_id):
                    continue
                for name, view, box in tensor_slices(piece):
                    out.setdefault(name, []).append((view.detach(), box))
    return out


def _world_objects(obj) -> list:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def global_shapes(chunks: list) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{per-layer name: (full shape, dtype)} over every rank's chunks (one all_gather_object)."""
    mine = {}
    for chunk in chunks:
        for entry in unwrap(chunk).sharded_state_dict().values():
            if isinstance(entry, ShardedObject):
                continue
            for piece in _pieces(entry):
                shape = tuple(piece.global_shape[index_axes(piece.key) :])
                for name, view, _ in tensor_slices(piece):
                    mine[name] = (shape, view.dtype)
    merged: dict = {}
    for part in _world_objects(mine):
        merged.update(part)
    return merged


def full_tensor(name: str, shape: tuple, dtype: torch.dtype, pieces: dict, group=None) -> Tensor:
    """The full per-layer tensor `name` [shape], assembled from every rank's pieces."""
    full = torch.zeros(shape, dtype=dtype)
    covered = 0
    for view, box in pieces.get(name, ()):
        full[box].copy_(view)
        covered += view.numel()
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        count = torch.tensor([covered], dtype=torch.int64)
        dist.all_reduce(count, group=group)
        if full.numel():  # the bytes, not the values: owner's bytes + zeros, -0.0 kept
            dist.all_reduce(full.view(-1).view(torch.uint8), group=group)
        covered = int(count)
    if covered != full.numel():
        raise ValueError(
            f"export: the ranks hold {covered} of the {full.numel()} elements of {name} "
            "(a main replica missing or held twice)"
        )
    return full


def plan_recipes(spec, shapes: dict) -> list:
    """The family's recipes of the model tensors in `shapes`, in the family's order."""
    emb = shapes.get("embedding.word_embeddings.weight") or shapes.get("output_layer.weight")
    return recipes_for_keys(spec, shapes, emb[0][0] if emb else None)


def hf_plan(recipes: list, shapes: dict) -> list[tuple[str, tuple, torch.dtype]]:
    """[(HF name, shape, dtype)] of what `iter_hf_tensors` yields, from meta tensors."""

    def meta(key):
        shape, dtype = shapes[key]
        return torch.empty(shape, dtype=dtype, device="meta")

    return [(k, tuple(t.shape), t.dtype) for k, t in hf_outputs(recipes, meta)]


def iter_hf_tensors(chunks: list, recipes: list, shapes: dict) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full tensor) in recipe order; every rank must iterate it to the end."""
    pieces = local_pieces(chunks)
    yield from hf_outputs(recipes, lambda key: full_tensor(key, *shapes[key], pieces))
