"""Load MoE training checkpoints in the layout gigatron wrote before megatron-core's.

Before gigatron's `sharded_state_dict()` became megatron-core's, its MoE checkpoints kept
per-layer keys (`decoder.layers.{i}.<name>`), each SequentialMLP expert under its own key with
the global expert index (`decoder.layers.{i}.mlp.experts.local_experts.{e}.<name>`, no expert
axis) and no `_extra_state` objects; optimizer state followed those keys. `legacy_moe_request`
rewrites a model's per-layer request (`sharded_state_dict(metadata={"non_homogeneous_layers":
True})`) into that layout (same tensors, only keys and the expert axis change), which
`gigatron.training.checkpointing.load_checkpoint` uses when `uses_legacy_moe_layout` finds such a
checkpoint. Saving again writes megatron-core's layout. GroupedMLP checkpoints of that time (a
`mlp.experts.weight1` tensor of gigatron's own) are not covered.
"""

from __future__ import annotations

import dataclasses

from gigatron.core.dist_checkpointing.mapping import (
    ShardedObject,
    ShardedTensor,
    ShardedTensorFactory,
)

__all__ = ["PER_LAYER", "legacy_moe_request", "uses_legacy_moe_layout"]

PER_LAYER = {"non_homogeneous_layers": True}  # the metadata of the request to rewrite
_EXPERTS, _OLD_EXPERTS = ".experts.experts.", ".experts.local_experts."


def uses_legacy_moe_layout(checkpoint_keys) -> bool:
    """Whether a checkpoint's keys are the old MoE layout's (SequentialMLP experts per key)."""
    return any(_OLD_EXPERTS in key for key in checkpoint_keys)


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


def legacy_moe_request(sharded: dict) -> dict:
    """`sharded` (a per-layer `sharded_state_dict()`) in the old MoE checkpoint layout."""
    out = {}
    for key, entry in sharded.items():
        if isinstance(entry, ShardedObject):
            continue  # the old layout saved no `_extra_state`
        if isinstance(entry, ShardedTensorFactory):
            entry = dataclasses.replace(entry, build_fn=_per_expert_pieces(entry.build_fn))
        else:
            entry = _per_expert(entry)
        out[key] = entry
    return out
