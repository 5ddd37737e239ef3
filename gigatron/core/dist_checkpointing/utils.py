"""Helpers that turn a rank's tensors into ShardedTensors with Megatron's replica ids.

Mirrors `megatron.core.transformer.utils.make_sharded_tensor_for_checkpoint` /
`make_tp_sharded_tensor_for_checkpoint` (kept here so model code can call them without a cycle)
plus `sharded_state_dict_from_entries`, which converts the `{key: (tensor, tp_axis, stride,
allow_shape_mismatch)}` maps gigatron's modules describe themselves with.

Replica ids follow Megatron: `(0, tp_rank, dp_rank)` for a TP-replicated tensor and
`(0, 0, dp_rank)` for a TP-split one (dp over DP x CP), so exactly one rank writes each element.
A TP split with `partition_stride` s (GLU fc1: [gate_r; up_r] per rank) is written as s boxes at
fragments j * tp + tp_rank of s * tp, i.e. the checkpoint holds Megatron's [all gate; all up].
MoE expert entries (`entry.expert` set) use the expert-TP rank/size and the expert-DP rank
instead (Megatron's `(0, etp_rank or 0, expt_dp_rank)`); GroupedMLP entries (`expert_shape`)
are saved as a view with the leading axis = block ep_rank of ep_size of the global expert axis.
"""

from __future__ import annotations

import re

import torch

from gigatron.core.dist_checkpointing.mapping import (
    ShardedObject,
    ShardedTensor,
    ShardedTensorFactory,
)

__all__ = [
    "make_sharded_object_for_checkpoint",
    "make_sharded_tensor_for_checkpoint",
    "make_tp_sharded_tensor_for_checkpoint",
    "sharded_state_dict_from_entries",
]


def _ranks(tp_group=None, dp_group=None) -> tuple[int, int, int]:
    """(tp_rank, tp_size, dp_rank incl. CP); all trivial when parallel_state is not set up."""
    from gigatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 1, 0
    return (
        ps.get_tensor_model_parallel_rank(),
        ps.get_tensor_model_parallel_world_size(),
        ps.get_data_parallel_rank(with_context_parallel=True),
    )


def make_sharded_tensor_for_checkpoint(
    tensor: torch.Tensor, key: str, prepend_offsets=(), replica_id=None, **kwargs
) -> ShardedTensor:
    """A TP-replicated tensor: main replica on tp_rank 0 of dp_rank 0."""
    tp_rank, _, dp_rank = _ranks()
    if replica_id is None:
        replica_id = (0, tp_rank, dp_rank)
    return ShardedTensor.from_rank_offsets(
        key, tensor, *prepend_offsets, replica_id=replica_id,
        prepend_axis_num=len(prepend_offsets), **kwargs,
    )  # fmt: skip


def make_tp_sharded_tensor_for_checkpoint(
    tensor: torch.Tensor, key: str, tp_axis: int = 0, replica_id=None, prepend_offsets=(), **kwargs
) -> ShardedTensor:
    """A tensor split in TP-size pieces along `tp_axis` (of the local tensor)."""
    tp_rank, tp_size, dp_rank = _ranks()
    if replica_id is None:
        replica_id = (0, 0, dp_rank)
    p = len(prepend_offsets)
    return ShardedTensor.from_rank_offsets(
        key, tensor, *prepend_offsets, (tp_axis + p, tp_rank, tp_size), replica_id=replica_id,
        prepend_axis_num=p, **kwargs,
    )  # fmt: skip


def make_sharded_object_for_checkpoint(
    obj, key: str, sharded_offsets=(), replica_id=None, **kwargs
) -> ShardedObject:
    """An object (e.g. a layer's `_extra_state`) replicated over TP: `sharded_offsets` are
    (axis, offset, size) triples, e.g. ((0, i, L),) for layer i of a stack of L (shape (1,)
    without them); main replica on tp_rank 0 of dp_rank 0."""
    tp_rank, _, dp_rank = _ranks()
    if replica_id is None:
        replica_id = (0, tp_rank, dp_rank)
    shape = tuple(size for _, _, size in sharded_offsets) or (1,)
    offset = tuple(off for _, off, _ in sharded_offsets) or (0,)
    return ShardedObject(key, obj, shape, offset, replica_id=replica_id, **kwargs)


def _strided(key, tensor, axis, stride, tp_rank, tp_size, replica_id, mismatch, pre=()):
    """Factory: s pieces of the local tensor at fragments j * tp + tp_rank of s * tp."""
    p = len(pre)

    def build(key, data, replica_id, flattened_range):
        pieces = torch.chunk(data, stride, dim=axis)
        frag = stride * tp_size
        return [
            ShardedTensor.from_rank_offsets(
                key,
                piece,
                *pre,
                (axis + p, j * tp_size + tp_rank, frag),
                replica_id=replica_id,
                prepend_axis_num=p,
                allow_shape_mismatch=mismatch,
            )
            for j, piece in enumerate(pieces)
        ]

    merge = lambda pieces: torch.cat(pieces, dim=axis)
    return ShardedTensorFactory(key, tensor, build, merge, replica_id)


def _expert_ranks() -> tuple[int, int, int]:
    """(expert-TP rank, expert-TP size, expert-DP rank); trivial without parallel_state."""
    from gigatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 1, 0
    return (
        ps.get_expert_tensor_parallel_rank(),
        ps.get_expert_tensor_parallel_world_size(),
        ps.get_expert_data_parallel_rank(),
    )


def _grouped(key, tensor, shape, ep, axis, stride, tp_rank, tp_size, replica_id):
    """Factory: `tensor` viewed as `shape` [n_local, ...], expert block ep[0] of ep[1] along
    axis 0, TP piece(s) along `axis` (s = stride pieces at fragments j * tp + tp_rank)."""
    tp_size = 1 if axis is None else tp_size
    stride = stride if tp_size > 1 else 1

    def build(key, data, replica_id, flattened_range):
        view = data.view(shape)
        pieces = torch.chunk(view, stride, dim=axis) if stride > 1 else [view]
        frag = stride * tp_size
        return [
            ShardedTensor.from_rank_offsets(
                key,
                piece,
                (0, ep[0], ep[1]),
                *(((axis, j * tp_size + tp_rank, frag),) if frag > 1 else ()),
                replica_id=replica_id,
            )
            for j, piece in enumerate(pieces)
        ]

    def merge(pieces):
        whole = torch.cat(pieces, dim=axis) if len(pieces) > 1 else pieces[0]
        return whole.reshape(tensor.shape)

    return ShardedTensorFactory(key, tensor, build, merge, replica_id)


_LAYER_KEY = re.compile(
    r"^(?P<head>(?:.*\.)?(?P<stack>encoder|decoder)\.layers\.)(?P<i>\d+)\.(?P<rest>.+)$"
)


def _stacked(key: str, stack_layers) -> tuple[str, tuple]:
    """Megatron's stacked form: `<stack>.layers.{i}.x` -> (`<stack>.layers.x`, ((0, i, L),)),
    L = stack_layers[stack] (an int means {"decoder": int}); other keys stay as they are."""
    if isinstance(stack_layers, int):
        stack_layers = {"decoder": stack_layers}
    m = _LAYER_KEY.match(key) if stack_layers else None
    num_layers = stack_layers.get(m.group("stack")) if m else None
    if not num_layers:
        return key, ()
    i = int(m.group("i"))
    if i >= num_layers:
        raise ValueError(f"{key}: layer index {i} must be < num_layers ({num_layers})")
    return m.group("head") + m.group("rest"), ((0, i, num_layers),)


def sharded_state_dict_from_entries(
    entries: dict,
    *,
    prefix: str = "",
    replicated_on_pp_stage: bool = False,
    stack_layers: int | dict[str, int] | None = None,
) -> dict:
    """{key: ShardedTensor | ShardedTensorFactory} from {key: (tensor, tp_axis, stride, mismatch)}.

    `tp_axis` None means TP-replicated. `replicated_on_pp_stage` marks every entry as a
    non-main copy (e.g. the tied word embedding held again by the last pipeline stage).
    `stack_layers` = {stack: its total num_layers} for stack "encoder" / "decoder" (an int:
    the decoder's): per-layer keys `<stack>.layers.{i}.<name>` (global i) become Megatron's
    stacked `<stack>.layers.<name>` with a leading num_layers axis (what megatron-core writes
    for homogeneous stacks); stacks not named keep per-layer keys. Entries that already are
    ShardedTensors, factories or ShardedObjects pass through.
    """
    dense_ranks = _ranks()
    first = 1 if replicated_on_pp_stage else 0
    out = {}
    for key, entry in entries.items():
        if isinstance(entry, (ShardedTensor, ShardedTensorFactory, ShardedObject)):
            out[prefix + key] = entry
            continue
        tensor, axis, stride, mismatch = (tuple(entry) + (None, 1, False))[:4]
        tensor = tensor.detach()
        expert = getattr(entry, "expert", None)
        tp_rank, tp_size, dp_rank = dense_ranks if expert is None else _expert_ranks()
        shape = getattr(entry, "expert_shape", None)
        if shape is not None:  # GroupedMLP: a leading global expert axis
            replica = (first, 0, dp_rank)  # TP-split (or ETP 1): one writer per box
            out[prefix + key] = _grouped(
                prefix + key, tensor, shape, expert, axis, stride, tp_rank, tp_size, replica
            )
            continue
        skey, pre = _stacked(prefix + key, stack_layers)
        kw = dict(prepend_axis_num=len(pre), allow_shape_mismatch=mismatch)
        if axis is None or tp_size == 1:
            replica = (first, tp_rank, dp_rank)
            out[prefix + key] = ShardedTensor.from_rank_offsets(
                skey, tensor, *pre, replica_id=replica, **kw
            )
        elif stride == 1:
            split = (axis + len(pre), tp_rank, tp_size)
            out[prefix + key] = ShardedTensor.from_rank_offsets(
                skey, tensor, *pre, split, replica_id=(first, 0, dp_rank), **kw
            )
        else:
            out[prefix + key] = _strided(
                skey, tensor, axis, stride, tp_rank, tp_size, (first, 0, dp_rank), mismatch, pre
            )
    return out
