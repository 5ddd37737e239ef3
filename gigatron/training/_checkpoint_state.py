"""Pieces of a training checkpoint: model/optimizer sharded dicts, RNG states, safe args.

Helpers for `gigatron.training.checkpointing` (mirrors parts of `megatron.training.checkpointing`:
`get_rng_state`, `generate_state_dict`, the tracker file). Layout of the saved state dict:
`args`, `checkpoint_version` (3.0), `iteration`, `num_floating_point_operations_so_far`,
`model` (or `model0..N` for virtual pipeline chunks), `optimizer`, `opt_param_scheduler`,
`rng_state`.
"""

from __future__ import annotations

import argparse
import os
import random

import numpy as np
import torch
import torch.distributed as dist

from gigatron.core.dist_checkpointing import CheckpointingException, ShardedObject
from gigatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
from gigatron.core.dist_checkpointing.utils import sharded_state_dict_from_entries

TRACKER_FNAME = "latest_checkpointed_iteration.txt"
CHECKPOINT_VERSION = 3.0


def checkpoint_dir(root: str, iteration: int, release: bool = False) -> str:
    """`<root>/iter_0000100` (or `<root>/release`)."""
    return os.path.join(root, "release" if release else f"iter_{iteration:07d}")


def write_tracker(root: str, iteration: int) -> None:
    """Atomically replace the tracker: temp file, fsync, rename, fsync the directory."""
    path = os.path.join(root, TRACKER_FNAME)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(str(iteration))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_tracker(root: str) -> tuple[int, bool] | None:
    """(iteration, release) from the tracker, None when there is no tracker file."""
    path = os.path.join(root, TRACKER_FNAME)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    if text == "release":
        return 0, True
    try:
        iteration = int(text)
    except ValueError:
        raise CheckpointingException(
            f"{path} is damaged: expected an iteration number or 'release', got {text[:40]!r}"
        ) from None
    if iteration < 0:
        raise CheckpointingException(f"{path} is damaged: negative iteration {iteration}")
    return iteration, False


def _ranks() -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """((pp_rank, tp_rank, dp_rank), (pp, tp, dp)) with dp over DP x CP."""
    from gigatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        rank = dist.get_rank() if dist.is_initialized() else 0
        world = dist.get_world_size() if dist.is_initialized() else 1
        return (0, 0, rank), (1, 1, world)
    return (
        ps.get_pipeline_model_parallel_rank(),
        ps.get_tensor_model_parallel_rank(),
        ps.get_data_parallel_rank(with_context_parallel=True),
    ), (
        ps.get_pipeline_model_parallel_world_size(),
        ps.get_tensor_model_parallel_world_size(),
        ps.get_data_parallel_world_size(with_context_parallel=True),
    )


def per_rank_object(key: str, data) -> ShardedObject:
    """An object kept once per (pp, tp, dp) rank: not reshardable, restored exactly."""
    offset, shape = _ranks()
    return ShardedObject(key, data, shape, offset, replica_id=0)


def get_rng_state() -> dict:
    """This rank's python, NumPy, torch CPU/CUDA and tracker RNG states."""
    from gigatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "rng_tracker_states": get_cuda_rng_tracker().get_states(),
    }


def set_rng_state(state: dict) -> None:
    from gigatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if torch.cuda.is_available() and state.get("cuda_rng_state") is not None:
        torch.cuda.set_rng_state(state["cuda_rng_state"])
    if state.get("rng_tracker_states"):
        get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


_PLAIN = (type(None), bool, int, float, str, torch.dtype)


def _plain(value):
    if isinstance(value, _PLAIN):
        return value, True
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return type(value)(v for v, _ in items), all(ok for _, ok in items)
    if isinstance(value, dict):
        items = {k: _plain(v) for k, v in value.items()}
        ok = all(ok for _, ok in items.values()) and all(isinstance(k, str) for k in value)
        return {k: v for k, (v, _) in items.items()}, ok
    return None, False


def safe_args(args) -> argparse.Namespace:
    """A Namespace with the plain-typed fields of `args` (what weights-only loading accepts)."""
    out = argparse.Namespace()
    for name, value in sorted(vars(args).items()):
        plain, ok = _plain(value)
        if ok:
            setattr(out, name, plain)
    return out


def model_sharded_state_dict(module) -> dict:
    """The module's `sharded_state_dict()` as ShardedTensors (converting gigatron entries)."""
    from gigatron.core import parallel_state as ps

    sd = module.sharded_state_dict()
    entries = {
        k: v for k, v in sd.items() if not isinstance(v, (ShardedTensor, ShardedTensorFactory))
    }
    out = {k: v for k, v in sd.items() if k not in entries}
    # The tied word embedding also lives on the last pipeline stage: a non-main copy there.
    first_stage = not ps.model_parallel_is_initialized() or ps.is_pipeline_first_stage(
        ignore_virtual=True
    )
    inner = module
    while hasattr(inner, "module"):
        inner = inner.module
    if not first_stage and getattr(inner, "share_embeddings_and_output_weights", False):
        # The last stage's copy of a tied output weight is saved as Megatron does: under the
        # word-embedding key, as a non-main replica of the first stage's tensor.
        if "output_layer.weight" in entries and "embedding.word_embeddings.weight" not in entries:
            entries["embedding.word_embeddings.weight"] = entries.pop("output_layer.weight")
    tied = {k: v for k, v in entries.items() if k.startswith("embedding.") and not first_stage}
    rest = {k: v for k, v in entries.items() if k not in tied}
    stack = _homogeneous_num_layers(inner)
    encoder_stack = _bert_encoder_num_layers(inner)
    if encoder_stack:
        out.update(sharded_state_dict_from_entries(rest, stack_layers={"encoder": encoder_stack}))
        out.update(_layer_extra_states(inner, encoder_stack, stack="encoder"))
        out.update(_module_extra_state(inner, "output_layer"))
    else:
        out.update(sharded_state_dict_from_entries(rest, stack_layers=stack))
    if stack:
        out.update(_layer_extra_states(inner, stack))
    out.update(sharded_state_dict_from_entries(tied, replicated_on_pp_stage=True))
    return out


def _bert_encoder_num_layers(module) -> int | None:
    """A BertModel's total encoder num_layers (its layers are all alike), else None."""
    from gigatron.core.models.bert.bert_model import BertModel

    return module.config.num_layers if isinstance(module, BertModel) else None


def _module_extra_state(module, name: str) -> dict:
    """megatron-core's `<name>._extra_state` object of a non-layer submodule (global shape (1,),
    TP ranks hold replicas), when `module` has one that keeps extra state (BERT's output_layer:
    megatron-core cannot load a checkpoint without it)."""
    sub = getattr(module, name, None)
    if sub is None or type(sub).get_extra_state is torch.nn.Module.get_extra_state:
        return {}
    (_, tp_rank, dp_rank), _ = _ranks()
    key = f"{name}._extra_state"
    obj = ShardedObject(key, sub.get_extra_state(), (1,), (0,), replica_id=(0, tp_rank, dp_rank))
    return {key: obj}


def _layer_extra_states(module, num_layers: int, stack: str = "decoder") -> dict:
    """Megatron's `<stack>.layers.<linear>._extra_state` objects (one per global layer index).

    megatron-core's local-spec layers save them (payload None); megatron-core cannot load a
    checkpoint without them, so gigatron writes them too. TP ranks hold replicas.
    """
    (_, tp_rank, dp_rank), _ = _ranks()
    out = {}
    for layer in getattr(module, stack).layers:
        i = layer.layer_number - 1
        for name, sub in layer.named_modules():
            if name and type(sub).get_extra_state is not torch.nn.Module.get_extra_state:
                key = f"{stack}.layers.{name}._extra_state"
                out[f"{stack}.layers.{i}.{name}._extra_state"] = ShardedObject(
                    key,
                    sub.get_extra_state(),
                    (num_layers,),
                    (i,),
                    replica_id=(0, tp_rank, dp_rank),
                )
    return out


def _homogeneous_num_layers(module) -> int | None:
    """The decoder's total num_layers when its layers are all alike (dense), else None."""
    config = getattr(module, "config", None)
    if getattr(module, "decoder", None) is None or config is None:
        return None
    if getattr(config, "num_moe_experts", None):
        return None  # MoE stacks keep per-layer keys (Megatron does too when heterogeneous)
    return getattr(config, "num_layers", None)


def model_keys(model: list) -> list[str]:
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]
