"""Rename the keys of a sharded state dict in place.

Mirrors the key helpers of `megatron.core.dist_checkpointing.utils`: the dict keys (the module's
own state-dict names) stay; only the checkpoint keys (`.key` of each ShardedTensor,
ShardedTensorFactory, ShardedObject) change. TransformerBlock uses `replace_prefix_for_sharding`
to turn `decoder.layers.3.` into the stacked `decoder.layers.`, TransformerLayer uses
`apply_prefix_mapping` for its spec's `sharded_state_dict_keys_map`.
"""

from __future__ import annotations

from gigatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace
from gigatron.core.dist_checkpointing.mapping import (
    ShardedBase,
    ShardedObject,
    ShardedStateDict,
    ShardedTensor,
    ShardedTensorFactory,
)

__all__ = ["add_prefix_for_sharding", "apply_prefix_mapping", "replace_prefix_for_sharding"]

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
