"""Megatron checkpoint key names and TP sharding of a GPTModel's tensors.

What `sharded_state_dict` will turn into ShardedTensors once `gigatron.core.dist_checkpointing`
exists. Keys follow Megatron's per-layer form `decoder.layers.{global_i}.<name>` (global index:
pipeline/virtual offset included) with the local-spec norms renamed through each layer's
`sharded_state_dict_keys_map` to Transformer Engine's names
(`self_attention.linear_qkv.layer_norm_weight`, `mlp.linear_fc1.layer_norm_weight`).
Not done yet: stacking homogeneous layers under `decoder.layers.<name>` with a leading
num_layers axis, `_extra_state` ShardedObjects, replica ids.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from gigatron.core.models.common.tp_state_dict import tp_split_of


class ShardedEntry(NamedTuple):
    """One tensor of this rank: its TP split (None = replicated over TP) and stride."""

    tensor: Tensor
    tp_axis: int | None
    tp_stride: int = 1
    allow_shape_mismatch: bool = False


def _rename(name: str, keys_map: dict[str, str]) -> str:
    for old, new in keys_map.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def megatron_sharded_keys(model, prefix: str = "") -> dict[str, ShardedEntry]:
    """{Megatron key: ShardedEntry} for every parameter of a GPTModel on this rank."""
    out: dict[str, ShardedEntry] = {}
    renames = {}
    for local_i, layer in enumerate(model.decoder.layers):
        keys_map = getattr(layer.submodules_config, "sharded_state_dict_keys_map", {}) or {}
        global_prefix = f"decoder.layers.{layer.layer_number - 1}."
        renames[f"decoder.layers.{local_i}."] = (global_prefix, keys_map)
    for name, param in model.named_parameters():
        key = name
        for local_prefix, (global_prefix, keys_map) in renames.items():
            if name.startswith(local_prefix):
                key = global_prefix + _rename(name[len(local_prefix) :], keys_map)
                break
        split = tp_split_of(param)
        axis, stride = (None, 1) if split is None else split
        mismatch = name in ("embedding.word_embeddings.weight", "output_layer.weight")
        out[prefix + key] = ShardedEntry(param, axis, stride, mismatch)
    return out
