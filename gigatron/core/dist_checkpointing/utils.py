"""Rename the keys of a sharded state dict in place.

Mirrors the key helpers of `megatron.core.dist_checkpointing.utils`: the dict keys (the module's
own state-dict names) stay; only the checkpoint keys (`.key` of each ShardedTensor,
ShardedTensorFactory, ShardedObject) change. TransformerBlock uses `replace_prefix_for_sharding`
to turn `decoder.layers.3.` into the stacked `decoder.layers.`, TransformerLayer uses
`apply_prefix_mapping` for its spec's `sharded_state_dict_keys_map`.
"""

from __future__ import annotations

from gigatron.core.dist_checkpointing.dict_utils import (
    dict_list_map_inplace,
    extract_matching_values,
)
from gigatron.core.dist_checkpointing.mapping import (
    LocalNonpersistentObject,
    ShardedBase,
    ShardedObject,
    ShardedStateDict,
    ShardedTensor,
    ShardedTensorFactory,
)

__all__ = [
    "add_prefix_for_sharding",
    "apply_prefix_mapping",
    "extract_nonpersistent",
    "extract_sharded_base",
    "extract_sharded_tensors",
    "extract_sharded_tensors_and_factories",
    "replace_prefix_for_sharding",
    "zip_strict",
]

_KEYED = (ShardedTensor, ShardedTensorFactory, ShardedObject)


def add_prefix_for_sharding(sharded_state_dict: ShardedStateDict, prefix: str) -> None:
    """Prepend `prefix` to every checkpoint key."""

    def add(x):
        if isinstance(x, ShardedBase):
            x.key = f"{prefix}{x.key}"
        return x

    dict_list_map_inplace(add, sharded_state_dict)


def replace_prefix_for_sharding(
    sharded_state_dict: ShardedStateDict, old_prefix: str, new_prefix: str
) -> None:
    """Replace `old_prefix` by `new_prefix` in every checkpoint key; ValueError naming the key
    when one does not start with `old_prefix`."""

    def replace(x):
        if isinstance(x, _KEYED):
            if not x.key.startswith(old_prefix):
                raise ValueError(f"checkpoint key {x.key!r} must begin with {old_prefix!r}")
            x.key = f"{new_prefix}{x.key[len(old_prefix) :]}"
        return x

    dict_list_map_inplace(replace, sharded_state_dict)


def apply_prefix_mapping(sharded_state_dict: ShardedStateDict, prefix_map: dict[str, str]) -> None:
    """Rename the checkpoint keys that start with a prefix of `prefix_map` (old -> new; the first
    matching prefix wins); other keys stay."""

    def rename(x):
        if isinstance(x, _KEYED):
            for old, new in prefix_map.items():
                if x.key.startswith(old):
                    x.key = f"{new}{x.key[len(old) :]}"
                    break
        return x

    dict_list_map_inplace(rename, sharded_state_dict)


# The extract_* helpers split a state dict into (matching leaves, the rest), both keeping the
# original nesting (`dict_utils.extract_matching_values`); Megatron's semantics.


def extract_sharded_tensors(sharded_state_dict: ShardedStateDict) -> tuple[dict, dict]:
    """(ShardedTensors, everything else)."""
    return extract_matching_values(sharded_state_dict, lambda v: isinstance(v, ShardedTensor))


def extract_sharded_tensors_and_factories(sharded_state_dict: ShardedStateDict):
    """(ShardedTensors and ShardedTensorFactories, everything else)."""
    kinds = (ShardedTensor, ShardedTensorFactory)
    return extract_matching_values(sharded_state_dict, lambda v: isinstance(v, kinds))


def extract_sharded_base(sharded_state_dict: ShardedStateDict) -> tuple[dict, dict]:
    """(every ShardedBase: tensors, objects, factories; everything else)."""
    return extract_matching_values(sharded_state_dict, lambda v: isinstance(v, ShardedBase))


def extract_nonpersistent(sharded_state_dict: ShardedStateDict) -> tuple[dict, dict]:
    """(LocalNonpersistentObjects, everything else)."""
    return extract_matching_values(
        sharded_state_dict, lambda v: isinstance(v, LocalNonpersistentObject)
    )


def zip_strict(*args):
    """`zip` over lists of equal length; AssertionError naming the lengths otherwise."""
    args = [list(a) for a in args]
    lens = [len(a) for a in args]
    assert len(set(lens)) <= 1, f"Tried to zip iterables of unequal lengths: {lens}!"
    return zip(*args)


# A shard's identity, equal on every rank that holds a copy: (key, global offset, flat range).
_ShardId = tuple


def _sharded_tensor_shard_id(sharded_tensor) -> _ShardId:
    """(key, global_offset, (start, stop) of flattened_range or None)."""
    r = sharded_tensor.flattened_range
    flat = None if r is None else (r.start, r.stop)
    return (sharded_tensor.key, tuple(sharded_tensor.global_offset), flat)


def _sharded_object_id(sharded_object) -> _ShardId:
    """(key, global_offset, global_shape) of a ShardedObject."""
    obj = sharded_object
    return (obj.key, tuple(obj.global_offset), tuple(obj.global_shape))
