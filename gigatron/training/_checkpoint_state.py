"""Pieces of a training checkpoint: model/optimizer sharded dicts, RNG states, safe args.

Helpers for `gigatron.training.checkpointing` (mirrors parts of `megatron.training.checkpointing`:
`get_rng_state`, `generate_state_dict`; the tracker file is in `checkpoint_files`). Layout of the
saved state dict:
`args`, `checkpoint_version` (3.0), `iteration`, `num_floating_point_operations_so_far`,
`model` (or `model0..N` for virtual pipeline chunks: each chunk's own `sharded_state_dict()`,
megatron-core's stacked layout), `optimizer`, `opt_param_scheduler`, `rng_state`.

Transformer Engine `_extra_state`s: gigatron builds no TE modules, so its own are always empty;
`fp8_extra_state_is_persistent` still judges TE-format payloads (a `torch.save`d dict in a uint8
tensor) as Megatron does, for state dicts that carry them.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.dist_checkpointing import ShardedObject
from gigatron.core.dist_checkpointing.checkpoint_files import (  # noqa: F401  (the checkpoint layout, used as cs.*)
    CHECKPOINT_VERSION,
    TRACKER_FNAME,
    checkpoint_dir,
    read_tracker,
    write_tracker,
)
from gigatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace
from gigatron.core.dist_checkpointing.mapping import LocalNonpersistentObject


def _ranks() -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """((pp_rank, tp_rank, dp_rank), (pp, tp, dp)) with dp over DP x CP."""

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


def model_keys(model: list) -> list[str]:
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


# Keys TE writes into `_extra_state` only under delayed FP8 scaling (amax history + scales):
# their bytes in the payload mean state that the run's config cannot rebuild.
_DELAYED_SCALING_MARKERS = (b"amax_history_fwd", b"scale_fwd", b"scale_bwd")


def fp8_extra_state_is_persistent(data) -> bool:
    """Must this `_extra_state` payload be checkpointed?

    None or an empty tensor (no FP8) and a payload without delayed-scaling keys (block or
    current scaling: recipe and config-derived scalars) are not; one with them is. Read from
    the raw bytes, nothing unpickled. Any other type is kept, so no real state is dropped."""
    if data is None:
        return False
    if not isinstance(data, torch.Tensor):
        return True
    if data.numel() == 0:
        return False
    try:
        raw = data.detach().cpu().contiguous().numpy().tobytes()
    except (TypeError, RuntimeError):  # a dtype numpy cannot hold: keep it
        return True
    return any(marker in raw for marker in _DELAYED_SCALING_MARKERS)


def localize_redundant_extra_states(state_dict) -> None:
    """In place: each `ShardedObject` whose key ends in `_extra_state` and whose payload is not
    persistent becomes a `LocalNonpersistentObject` (not written on save; on load the local
    value is put back). Everything else is left as it is."""

    def localize(value):
        if (
            isinstance(value, ShardedObject)
            and value.key.endswith("_extra_state")
            and not fp8_extra_state_is_persistent(value.data)
        ):
            return LocalNonpersistentObject(value.data)
        return value

    dict_list_map_inplace(localize, state_dict)
