"""Megatron checkpoint keys of BertModel / T5Model tensors (what `sharded_state_dict` returns).

Like GPT's (`gigatron.core.models.gpt._checkpoint_keys`): per-layer keys
`<stack>.layers.{global_i}.<name>` with the local-spec norms renamed to Transformer Engine's
fused names through each layer's `sharded_state_dict_keys_map`, every tensor with its TP split.
gigatron.training's checkpointing turns BERT's into ShardedTensors in Megatron's stacked form
(`encoder.layers.<name>` with a leading num_layers axis); T5Model turns its own (both stacks)
into that form itself (`gigatron.core.models.T5._checkpoint_keys`).
`stacked=True` returns that form here too, as GPT's `megatron_sharded_keys(stacked=True)`: one
key per name, a list of this stage's entries, each with its global layer slot in `entry.layer`.
"""

from __future__ import annotations

from gigatron.core.models.common.tp_state_dict import tp_split_of
from gigatron.core.models.gpt._checkpoint_keys import ShardedEntry, _rename

_TIED = ("embedding.word_embeddings.weight", "output_layer.weight", "lm_head.output_layer.weight")


def sharded_keys(
    model, stacks: tuple[str, ...], prefix: str = "", local_index: bool = False, stacked=False
):
    """{Megatron key: ShardedEntry} for every parameter of `model` on this rank.

    stacks: the TransformerBlock attributes ("encoder", "decoder") whose layers get global
    indices: layer_number - 1 (pipeline offset included), or the local index when
    `local_index` (T5's stacks are whole on their stage). stacked=True: `<stack>.layers.<name>`
    keys, each a list of ShardedEntry (one per local layer, `entry.layer` = (global_i, L)).
    """
    renames = {}
    for stack in stacks:
        block = getattr(model, stack, None)
        if block is None:
            continue
        num_layers = len(block.layers) if local_index else block.config.num_layers
        for local_i, layer in enumerate(block.layers):
            keys_map = getattr(layer.submodules_config, "sharded_state_dict_keys_map", {}) or {}
            global_i = local_i if local_index else layer.layer_number - 1
            renames[f"{stack}.layers.{local_i}."] = (stack, global_i, num_layers, keys_map)
    out = {}
    for name, param in model.named_parameters():
        key, slot = name, None
        for local_prefix, (stack, global_i, num_layers, keys_map) in renames.items():
            if name.startswith(local_prefix):
                rest = _rename(name[len(local_prefix) :], keys_map)
                index = "" if stacked else f"{global_i}."
                key, slot = f"{stack}.layers.{index}{rest}", (global_i, num_layers)
                break
        split = tp_split_of(param)
        axis, stride = (None, 1) if split is None else split
        entry = ShardedEntry(param, axis, stride, name in _TIED, slot)
        if stacked and slot is not None:
            out.setdefault(prefix + key, []).append(entry)
        else:
            out[prefix + key] = entry
    return out
