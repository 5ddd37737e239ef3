"""Megatron checkpoint key names and TP sharding of a GPTModel's tensors.

What `sharded_state_dict` will turn into ShardedTensors once `gigatron.core.dist_checkpointing`
exists. Keys follow Megatron's per-layer form `decoder.layers.{global_i}.<name>` (global index:
pipeline/virtual offset included) with the local-spec norms renamed through each layer's
`sharded_state_dict_keys_map` to Transformer Engine's names
(`self_attention.linear_qkv.layer_norm_weight`, `mlp.linear_fc1.layer_norm_weight`).
`stacked=True` gives Megatron's stacked form (`decoder.layers.<name>`, a list of this stage's
entries, each with its global layer slot). Not done yet: `_extra_state` ShardedObjects, replica
ids, the ShardedTensor objects themselves.

MoE experts are keyed globally, so a checkpoint reshards across EP sizes: SequentialMLP's
`mlp.experts.local_experts.{global_e}.<name>` (global_e = ep_rank * num_local_experts + local),
as Megatron; GroupedMLP's `mlp.experts.weight1` / `weight2` as one tensor with a leading global
expert axis, [E, h, glu*f] / [E, f, h] (gigatron's own form; it does not load as SequentialMLP).
Expert entries carry `expert` = (ep_rank, ep_size): their TP split is over the expert-TP group
and their replicas over the expert-DP group (`sharded_state_dict_from_entries`).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from torch import Tensor

from gigatron.core.models.common.tp_state_dict import tp_split_of


class ShardedEntry(NamedTuple):
    """One tensor of this rank: its TP split (None = replicated over TP) and stride, and for
    decoder-layer tensors (global layer index, num_layers): the prepended axis of the stacked
    form. `expert` = (ep_rank, ep_size) marks an MoE expert tensor (expert-TP / expert-DP
    groups); `expert_shape` is GroupedMLP's per-expert view [n_local, ...] of `tensor`, whose
    leading axis is block ep_rank of ep_size of the global expert axis (`tp_axis` indexes it)."""

    tensor: Tensor
    tp_axis: int | None
    tp_stride: int = 1
    allow_shape_mismatch: bool = False
    layer: tuple[int, int] | None = None
    expert: tuple[int, int] | None = None
    expert_shape: tuple[int, ...] | None = None


_LOCAL_EXPERT = re.compile(r"^(?P<head>.*\.local_experts\.)(?P<e>\d+)(?P<tail>\..+)$")


def _expert_modules(model) -> dict:
    """{module name prefix: (module, ep_rank, ep_size)} for every SequentialMLP / GroupedMLP."""
    from gigatron.core.tensor_parallel._groups import group_rank, group_size
    from gigatron.core.transformer.moe.experts import GroupedMLP, SequentialMLP

    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, (SequentialMLP, GroupedMLP)):
            out[name + "."] = (mod, group_rank(mod.ep_group), group_size(mod.ep_group))
    return out


def _expert_entry(name: str, param, experts: dict, split) -> tuple[str, ShardedEntry] | None:
    """(global-expert name, entry) for a parameter of an expert module, else None."""
    from gigatron.core.transformer.moe.experts import GroupedMLP

    for mod_prefix, (mod, ep_rank, ep_size) in experts.items():
        if not name.startswith(mod_prefix):
            continue
        n = mod.num_local_experts
        axis, stride = (None, 1) if split is None else split
        if not isinstance(mod, GroupedMLP):  # local_experts.{local} -> {global}
            m = _LOCAL_EXPERT.match(name)
            name = f"{m['head']}{ep_rank * n + int(m['e'])}{m['tail']}"
            return name, ShardedEntry(param, axis, stride, expert=(ep_rank, ep_size))
        h = mod.config.hidden_size
        if name.endswith("weight1"):  # [h, n*glu*f/etp] -> [n, h, glu*f/etp], [gate_r, up_r]
            glu = 2 if mod.config.gated_linear_unit else 1
            shape, axis, stride = (n, h, param.shape[1] // n), 2, glu
        else:  # weight2 [n*f/etp, h] -> [n, f/etp, h]
            shape, axis, stride = (n, param.shape[0] // n, h), 1, 1
        entry = ShardedEntry(param, axis, stride, expert=(ep_rank, ep_size), expert_shape=shape)
        return name, entry
    return None


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
    experts = _expert_modules(model)
    for local_i, layer in enumerate(model.decoder.layers):
        keys_map = getattr(layer.submodules_config, "sharded_state_dict_keys_map", {}) or {}
        renames[f"decoder.layers.{local_i}."] = (layer.layer_number - 1, keys_map)
    for name, param in model.named_parameters():
        split = tp_split_of(param)
        axis, stride = (None, 1) if split is None else split
        mismatch = name in ("embedding.word_embeddings.weight", "output_layer.weight")
        entry = ShardedEntry(param, axis, stride, mismatch)
        expert = _expert_entry(name, param, experts, split) if experts else None
        if expert is not None:
            name, entry = expert
        key, layer_slot = name, None
        for local_prefix, (global_i, keys_map) in renames.items():
            if name.startswith(local_prefix):
                index = "" if stacked else f"{global_i}."
                key = f"decoder.layers.{index}" + _rename(name[len(local_prefix) :], keys_map)
                layer_slot = (global_i, num_layers)
                break
        entry = entry._replace(layer=layer_slot)
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
