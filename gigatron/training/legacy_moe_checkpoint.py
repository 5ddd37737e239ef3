"""Load MoE training checkpoints in the layout gigatron wrote before megatron-core's.

Before gigatron's `sharded_state_dict()` became megatron-core's (commit 91b63fd and earlier), its
MoE checkpoints kept per-layer keys (`decoder.layers.{i}.<name>`), no `_extra_state` objects, and
experts keyed globally (global expert e = ep_rank * n_local + local j, of E):
- SequentialMLP: each expert under its own key, no expert axis
  (`decoder.layers.{i}.mlp.experts.local_experts.{e}.<name>`);
- GroupedMLP: its own tensors with a leading expert axis, `decoder.layers.{i}.mlp.experts.weight1`
  [E, h, glu*f] (columns `[gate | up]`, each half the whole f) and `weight2` [E, f, h].
Optimizer state followed those keys and layouts (`optimizer.state.exp_avg.<key>`).

`legacy_moe_request` rewrites a model's per-layer request (`sharded_state_dict(metadata=
PER_LAYER)`) into that layout (same tensors, only keys and boxes change), for
`dist_checkpointing.load` and for `gigatron.training.checkpointing.load_checkpoint`, which uses it
when `uses_legacy_moe_layout` finds such a checkpoint. Any EP x expert-TP layout loads. Saving
again writes megatron-core's layout.

Shapes: E: experts, n: this rank's experts, h: hidden, f: expert ffn, etp: expert-TP size,
glu: 2 with a gated linear unit, else 1.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from gigatron.core.dist_checkpointing.mapping import (
    ShardedObject,
    ShardedTensor,
    ShardedTensorFactory,
)

__all__ = ["PER_LAYER", "legacy_moe_request", "uses_legacy_moe_layout"]

PER_LAYER = {"non_homogeneous_layers": True}  # the metadata of the request to rewrite
_EXPERTS, _OLD_EXPERTS = ".experts.experts.", ".experts.local_experts."
_OLD_GROUPED = re.compile(r"^(?!optimizer\.).*\.experts\.weight[12]$")  # not optimizer state


def uses_legacy_moe_layout(checkpoint_keys) -> bool:
    """Whether a checkpoint's keys are the old MoE layout's (SequentialMLP experts per key, or
    GroupedMLP's own `weight1` / `weight2` as model tensors)."""
    return any(_OLD_EXPERTS in key or _OLD_GROUPED.match(key) for key in checkpoint_keys)


def _per_expert(sh: ShardedTensor) -> ShardedTensor:
    """An expert's ShardedTensor (expert axis prepended last) under its old per-expert key."""
    if _EXPERTS not in sh.key:
        return sh
    a = sh.prepend_axis_num - 1
    head, tail = sh.key.split(_EXPERTS)
    drop = lambda t: None if t is None else tuple(t[:a]) + tuple(t[a + 1 :])
    return dataclasses.replace(
        sh,
        key=f"{head}{_OLD_EXPERTS}{sh.global_offset[a]}.{tail}",
        global_shape=drop(sh.global_shape),
        global_offset=drop(sh.global_offset),
        axis_fragmentations=drop(sh.axis_fragmentations),
        prepend_axis_num=a,
    )


def _per_expert_pieces(build_fn):
    def build(*args):
        pieces = build_fn(*args)
        if isinstance(pieces, list):
            return [_per_expert(p) for p in pieces]
        return _per_expert(pieces)

    return build


def _grouped_pieces(key, view, ep_box, tp_rank, tp_size, replica_id) -> list[ShardedTensor]:
    """A GroupedMLP weight's old-layout boxes, as contiguous views of `view` (so its optimizer
    state, flat ranges of the weight, takes the same boxes).

    weight2: view [n, f/etp, h] -> one box of [E, f, h].
    weight1: view [n, h, glu, f/etp] (a rank's columns `[gate_r | up_r]`) -> [E, h, glu*f]: one
    box at etp 1; else half g's f/etp columns are piece g * etp + tp_rank of glu * etp along the
    last axis, contiguous only row by row: one [1, 1, f/etp] box per (expert, row, half).
    """
    if view.dim() == 3:
        tp_box = (1, tp_rank, tp_size)
        return [ShardedTensor.from_rank_offsets(key, view, ep_box, tp_box, replica_id=replica_id)]
    n, h, glu, f_local = view.shape
    if tp_size == 1:
        flat = view.view(n, h, glu * f_local)
        return [ShardedTensor.from_rank_offsets(key, flat, ep_box, replica_id=replica_id)]
    first, num_experts = ep_box[1] * n, ep_box[2] * n
    return [
        ShardedTensor.from_rank_offsets(
            key,
            view[j, r, g].view(1, 1, f_local),
            (0, first + j, num_experts),
            (1, r, h),
            (2, g * tp_size + tp_rank, glu * tp_size),
            replica_id=replica_id,
        )
        for j in range(n)
        for r in range(h)
        for g in range(glu)
    ]


def _old_grouped(factory) -> ShardedTensorFactory:
    """GroupedMLP's weight factory (`experts._GroupedWeightFactory`, per-layer request) in the
    old layout: `<prefix>mlp.experts.weight1` / `weight2` boxes of the weight as it lies in
    memory, its `parameter_boxes`, and not the transposed tensors megatron-core's layout saves."""
    view, offsets, name = factory.parameter_boxes
    if len(offsets) != 2:
        raise ValueError(f"{factory.key}: expected a per-layer request (metadata=PER_LAYER)")
    ep_box, (_, tp_rank, tp_size) = offsets
    key = factory.key.rsplit("experts.linear_fc", 1)[0] + name
    weight = factory.data

    def pieces(t: torch.Tensor, replica_id) -> list[ShardedTensor]:
        return _grouped_pieces(key, t.view(view.shape), ep_box, tp_rank, tp_size, replica_id)

    def merge(loaded: list[torch.Tensor]) -> torch.Tensor:
        out = torch.empty_like(weight)
        for piece, value in zip(pieces(out, factory.replica_id), loaded):
            piece.data.copy_(value.view(piece.data.shape))
        return out

    build = lambda _key, data, replica_id, _flat: pieces(data, replica_id)
    return ShardedTensorFactory(key, weight, build, merge, factory.replica_id)


def legacy_moe_request(sharded: dict) -> dict:
    """`sharded` (a per-layer `sharded_state_dict(metadata=PER_LAYER)`) in the old MoE checkpoint
    layout; module state-dict keys and the tensors stay, `_extra_state` objects are left out."""
    out = {}
    for key, entry in sharded.items():
        if isinstance(entry, ShardedObject):
            continue  # the old layout saved no `_extra_state`
        if getattr(entry, "parameter_boxes", None):  # GroupedMLP
            entry = _old_grouped(entry)
        elif isinstance(entry, ShardedTensorFactory):
            entry = dataclasses.replace(entry, build_fn=_per_expert_pieces(entry.build_fn))
        else:
            entry = _per_expert(entry)
        out[key] = entry
    return out
