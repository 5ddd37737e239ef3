"""Megatron checkpoint key names and TP sharding of a GPTModel's tensors.

What `sharded_state_dict` will turn into ShardedTensors once `gigatron.core.dist_checkpointing`
exists. Keys follow Megatron's per-layer form `decoder.layers.{global_i}.<name>` (global index:
pipeline/virtual offset included) with the local-spec norms renamed through each layer's
`sharded_state_dict_keys_map` to Transformer Engine's names
(`self_attention.linear_qkv.layer_norm_weight`, `mlp.linear_fc1.layer_norm_weight`).
`stacked=True` gives Megatron's stacked form (`decoder.layers.<name>`, a list of this stage's
entries, each with its global layer slot). Not done yet: `_extra_state` ShardedObjects, replica
ids, the ShardedTensor objects themselves.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from gigatron.core.models.common.tp_state_dict import tp_split_of


class ShardedEntry(NamedTuple):
    """One tensor of this rank: its TP split (None = replicated over TP) and stride, and for
    decoder-layer tensors (global layer index, num_layers): the prepended axis of the stacked
    form."""

    tensor: Tensor
    tp_axis: int | None
    tp_stride: int = 1
    allow_shape_mismatch: bool = False
    layer: tuple[int, int] | None = None


def _rename(name: str, keys_map: dict[str, str]) -> str:
    for old, new in keys_map.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def megatron_sharded_keys(model, prefix: str = "", stacked: bool = False) -> dict:
    """{Megatron key: ShardedEntry} for every parameter of a GPTModel on this rank.

    stacked=False: `decoder.layers.{global_i}.<name>`; stacked=True: Megatron's homogeneous-layer
    form `decoder.layers.<name>`, one key per name with `entry.layer` giving the slot.
    """
    out: dict[str, ShardedEntry] = {}
    renames = {}
    num_layers = model.config.num_layers
    for local_i, layer in enumerate(model.decoder.layers):
        keys_map = getattr(layer.submodules_config, "sharded_state_dict_keys_map", {}) or {}
        renames[f"decoder.layers.{local_i}."] = (layer.layer_number - 1, keys_map)
    for name, param in model.named_parameters():
        key, layer_slot = name, None
        for local_prefix, (global_i, keys_map) in renames.items():
            if name.startswith(local_prefix):
                index = "" if stacked else f"{global_i}."
                key = f"decoder.layers.{index}" + _rename(name[len(local_prefix) :], keys_map)
                layer_slot = (global_i, num_layers)
                break
        split = tp_split_of(param)
        axis, stride = (None, 1) if split is None else split
        mismatch = name in ("embedding.word_embeddings.weight", "output_layer.weight")
        entry = ShardedEntry(param, axis, stride, mismatch, layer_slot)
        if stacked and layer_slot is not None:
            out.setdefault(prefix + key, []).append(entry)
        else:
            out[prefix + key] = entry
    return out


def module_state_dict_from_checkpoint_keys(model, state_dict: dict) -> dict:
    """What `dist_checkpointing.load(model.sharded_state_dict(), d)` returns (per-layer Megatron
    checkpoint keys, global layer index) -> the module's own state-dict names, so Megatron
    scripts' `model.load_state_dict(checkpoint)` works. Module `_extra_state`s the checkpoint
    does not name are kept as they are (the local spec's carry nothing). Module keys pass through.
    """
    own = model.state_dict(keep_vars=True)
    if all(k in own for k in state_dict):
        return state_dict
    by_id = {id(p): n for n, p in model.named_parameters()}
    names = {k: by_id[id(e.tensor)] for k, e in megatron_sharded_keys(model).items()}
    out = {names.get(k, k): v for k, v in state_dict.items()}
    for k, v in own.items():
        if k.endswith("_extra_state") and k not in out:
            out[k] = v
    return out
