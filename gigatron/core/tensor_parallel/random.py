"""Named RNG streams for tensor parallelism, and activation checkpointing that replays them.

Mirrors `megatron.core.tensor_parallel.random`. `CudaRNGStatesTracker` keeps named generator
states ("model-parallel-rng", "expert-parallel-rng", "data-parallel-rng"); `fork(name)` swaps one
in for the duration of a block (weight init of TP shards, dropout inside TP regions) and saves
where it got to. `model_parallel_cuda_manual_seed` seeds them with Megatron's offsets. The
tracker is written in `_rng_tracker` and the checkpoint functions in `_checkpointing`, both
re-exported here.

gigatron difference: without CUDA the tracker drives the CPU default generator, so the same
script (seeding, forks, checkpoint recompute) runs unchanged on a CPU-only machine.
"""

from __future__ import annotations

import torch

from gigatron.core import parallel_state
from gigatron.core.tensor_parallel._checkpointing import (
    CheckpointWithoutOutput,
    CheckpointWithoutOutputManager,
    checkpoint,
)
from gigatron.core.tensor_parallel._rng_tracker import (
    _DATA_PARALLEL_RNG_TRACKER_NAME,
    _EXPERT_PARALLEL_RNG_TRACKER_NAME,
    _MODEL_PARALLEL_RNG_TRACKER_NAME,
    CudaRNGStatesTracker,
    _cuda_manual_seed,
    get_cuda_rng_tracker,
    initialize_rng_tracker,
)

__all__ = [
    "CudaRNGStatesTracker",
    "CheckpointWithoutOutput",
    "CheckpointWithoutOutputManager",
    "checkpoint",
    "convert_cuda_rng_state",
    "get_cuda_rng_tracker",
    "get_data_parallel_rng_tracker_name",
    "get_expert_parallel_rng_tracker_name",
    "initialize_rng_tracker",
    "is_graph_safe_cuda_rng_tracker",
    "model_parallel_cuda_manual_seed",
]


HAVE_TE = False  # Megatron's flag: gigatron never uses Transformer Engine


def get_expert_parallel_rng_tracker_name() -> str:
    """Name of the expert-parallel stream ("expert-parallel-rng")."""
    return _EXPERT_PARALLEL_RNG_TRACKER_NAME


def get_data_parallel_rng_tracker_name() -> str:
    """Name of the data-parallel stream ("data-parallel-rng")."""
    return _DATA_PARALLEL_RNG_TRACKER_NAME


def _rank_or_default(rank: int | None, getter: str) -> int:
    if rank is not None:
        return rank
    # Single-process scripts that never build groups get rank 0 on every axis.
    if not parallel_state.model_parallel_is_initialized():
        return 0
    return getattr(parallel_state, getter)()


def model_parallel_cuda_manual_seed(
    seed: int,
    te_rng_tracker: bool = False,
    inference_rng_tracker: bool = False,
    use_cudagraphable_rng: bool = False,
    tp_rank: int | None = None,
    ep_rank: int | None = None,
    etp_rank: int | None = None,
    gtp_remat_rank: int | None = None,
    egtp_remat_rank: int | None = None,
    force_reset_rng: bool = False,
    gtp_remat_world_size: int | None = None,
    egtp_remat_world_size: int | None = None,
) -> None:
    """Seed the default accelerator generator and the tracker's named streams.

    data-parallel-rng   = seed (also the default generators, CUDA and CPU: same on all TP ranks)
    model-parallel-rng  = seed + 2718 + tp_rank (different per TP rank)
    expert-parallel-rng = seed + 1024 + 100 * ep_rank + etp_rank
    Ranks default to parallel_state's (0 when model parallel is not initialised). Without CUDA
    the CPU default generator plays the accelerator's part.
    """
    for name, size in (
        ("gtp_remat_world_size", gtp_remat_world_size),
        ("egtp_remat_world_size", egtp_remat_world_size),
    ):
        if size is not None and size > 1:
            raise ValueError(f"{name} ({size}) > 1 is not supported by gigatron (GTP remat)")
    tp_rank = _rank_or_default(tp_rank, "get_tensor_model_parallel_rank")
    ep_rank = _rank_or_default(ep_rank, "get_expert_model_parallel_rank")
    etp_rank = _rank_or_default(etp_rank, "get_expert_tensor_parallel_rank")

    initialize_rng_tracker(
        te_rng_tracker, inference_rng_tracker, use_cudagraphable_rng, force_reset_rng
    )
    tracker = get_cuda_rng_tracker(te_rng_tracker, inference_rng_tracker, use_cudagraphable_rng)
    tracker.reset()
    _cuda_manual_seed(seed)
    if torch.cuda.is_available():
        # gigatron addition: parameters a script creates on the CPU and then moves to the GPU
        # (position embeddings, norms of a model built before `.cuda()`) come out the same on
        # every TP rank. Megatron seeds only CUDA here and relies on its training entry having
        # called torch.manual_seed(seed) first, which standalone scripts often skip.
        torch.random.default_generator.manual_seed(seed)
    tracker.add(_DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(_MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(_EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * ep_rank + etp_rank)


def convert_cuda_rng_state(state, to_graphable: bool = False):
    """Normalise an RNG state to a ByteTensor (gigatron has no graph-safe generator states)."""
    if to_graphable:
        raise ValueError("convert_cuda_rng_state(to_graphable=True) is not supported by gigatron")
    if isinstance(state, torch.Generator):
        return state.get_state()
    return state


def is_graph_safe_cuda_rng_tracker(cuda_rng_tracker) -> bool:
    """Whether the tracker's states are CUDA-graph safe (never, in gigatron)."""
    return bool(getattr(cuda_rng_tracker, "use_cudagraphable_rng", False))
