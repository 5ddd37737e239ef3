"""T5Model's sharded state dict in megatron-core's layout (what `T5Model.sharded_state_dict`
returns; no separate module in megatron.core: it is what megatron-core 0.16's T5Model with the
local spec writes).

- Both stacks stacked: `encoder.layers.<name>` [L_enc, ...] and `decoder.layers.<name>`
  [L_dec, ...] (local-spec norms under Transformer Engine's fused names through the layer spec's
  `sharded_state_dict_keys_map`), plus one `<stack>.layers.<linear>._extra_state` object per
  layer (global shape (L,)), as `make_sharded_object_for_checkpoint` writes them.
- megatron-core registers two modules twice (`T5Model.position_embeddings` is
  `embedding.position_embeddings`, `T5Model.output_layer` is `lm_head.output_layer`), so its
  checkpoints hold those tensors (and the output layer's `_extra_state`) under both names;
  gigatron writes both too and loads either copy into the one tensor.
- Under the encoder/decoder pipeline split both stages embed tokens: the decoder stage's
  embedding copies are non-main replicas (replica id (1, ., .)) of the encoder stage's.

Dict keys are per-layer (`encoder.layers.{i}.<name>`, i = index within its stack); the
ShardedTensor keys are the stacked ones. Shapes: L_enc / L_dec: encoder / decoder num_layers.
"""

from __future__ import annotations

import torch

from gigatron.core import parallel_state
from gigatron.core.dist_checkpointing.utils import (
    make_sharded_object_for_checkpoint,
    sharded_state_dict_from_entries,
)
from gigatron.core.models.bert._checkpoint_keys import sharded_keys

_STACKS = ("encoder", "decoder")
# megatron-core's second names for the same modules: {canonical prefix: alias prefix}.
_ALIASES = {"embedding.position_embeddings.": "position_embeddings.", "lm_head.": ""}


def _has_extra_state(module) -> bool:
    return type(module).get_extra_state is not torch.nn.Module.get_extra_state


def _extra_states(model, prefix: str) -> dict:
    """`_extra_state` objects: each stack layer's linears (stacked, shape (L,)) and the LM
    head's output layer under both its names (shape (1,))."""
    out = {}
    for stack in _STACKS:
        block = getattr(model, stack, None)
        if block is None:
            continue
        num_layers = len(block.layers)
        for i, layer in enumerate(block.layers):
            for name, sub in layer.named_modules():
                if name and _has_extra_state(sub):
                    key = f"{prefix}{stack}.layers.{name}._extra_state"
                    out[f"{prefix}{stack}.layers.{i}.{name}._extra_state"] = (
                        make_sharded_object_for_checkpoint(
                            sub.get_extra_state(), key, ((0, i, num_layers),)
                        )
                    )
    head = getattr(model, "lm_head", None)
    if head is not None and _has_extra_state(head.output_layer):
        for name in ("lm_head.output_layer", "output_layer"):
            key = f"{prefix}{name}._extra_state"
            out[key] = make_sharded_object_for_checkpoint(head.output_layer.get_extra_state(), key)
    return out


def _alias(key: str) -> str | None:
    for canonical, alias in _ALIASES.items():
        if key.startswith(canonical):
            return alias + key[len(canonical) :]
    return None


def _on_first_pp_stage() -> bool:
    return not parallel_state.model_parallel_is_initialized() or (
        parallel_state.is_pipeline_first_stage(ignore_virtual=True)
    )


def t5_sharded_state_dict(model, prefix: str = "", legacy: bool = False) -> dict:
    """{per-layer key: ShardedTensor | ShardedTensorFactory | ShardedObject} of a T5Model on
    this rank, in megatron-core's layout (module docstring).

    legacy=True gives the layout of gigatron's T5 checkpoints before this one (encoder layers
    under per-layer keys `encoder.layers.{i}.<name>`, no encoder `_extra_state`, no alias
    names; decoder stacked): pass it to `dist_checkpointing.load` to read such a checkpoint.
    """
    entries = sharded_keys(model, _STACKS, local_index=True)
    stacks = {s: len(getattr(model, s).layers) for s in _STACKS if getattr(model, s, None)}
    if legacy:
        stacks.pop("encoder", None)
    # Aliases first: the optimizer's state (keyed by the last name seen for a tensor) then
    # keeps the canonical name.
    aliases = {} if legacy else {_alias(k): v for k, v in entries.items() if _alias(k)}
    entries = {**aliases, **entries}
    pp_copy = not _on_first_pp_stage()
    shared = {
        k: v for k, v in entries.items() if pp_copy and k.startswith(("embedding.", "position_"))
    }
    rest = {k: v for k, v in entries.items() if k not in shared}
    out = sharded_state_dict_from_entries(rest, prefix=prefix, stack_layers=stacks)
    out.update(sharded_state_dict_from_entries(shared, prefix=prefix, replicated_on_pp_stage=True))
    extra = _extra_states(model, prefix)
    if legacy:
        extra = {k: v for k, v in extra.items() if k.startswith(f"{prefix}decoder.layers.")}
    out.update(extra)
    return out
