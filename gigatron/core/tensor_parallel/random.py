"""Named RNG streams for tensor parallelism, and activation checkpointing that replays them.

Mirrors `megatron.core.tensor_parallel.random`. `CudaRNGStatesTracker` keeps named generator
states ("model-parallel-rng", "expert-parallel-rng", "data-parallel-rng"); `fork(name)` swaps one
in for the duration of a block (weight init of TP shards, dropout inside TP regions) and saves
where it got to. `model_parallel_cuda_manual_seed` seeds them with Megatron's offsets.

gigatron difference: without CUDA the tracker drives the CPU default generator, so the same
script (seeding, forks, checkpoint recompute) runs unchanged on a CPU-only machine.
"""

from __future__ import annotations

import contextlib

import torch

from gigatron.core.tensor_parallel._checkpointing import CheckpointWithoutOutput, checkpoint

__all__ = [
    "CudaRNGStatesTracker",
    "CheckpointWithoutOutput",
    "checkpoint",
    "convert_cuda_rng_state",
    "get_cuda_rng_tracker",
    "get_data_parallel_rng_tracker_name",
    "get_expert_parallel_rng_tracker_name",
    "initialize_rng_tracker",
    "is_graph_safe_cuda_rng_tracker",
    "model_parallel_cuda_manual_seed",
]

_MODEL_PARALLEL_RNG_TRACKER_NAME = "model-parallel-rng"
_EXPERT_PARALLEL_RNG_TRACKER_NAME = "expert-parallel-rng"
_DATA_PARALLEL_RNG_TRACKER_NAME = "data-parallel-rng"


def _get_cuda_rng_state() -> torch.Tensor:
    """State of the accelerator's default generator (the CPU generator when there is no CUDA)."""
    if torch.cuda.is_available():
        return torch.cuda.get_rng_state()
    return torch.get_rng_state()


def _set_cuda_rng_state(new_state: torch.Tensor) -> None:
    """Restore a state returned by `_get_cuda_rng_state`."""
    if torch.cuda.is_available():
        torch.cuda.set_rng_state(new_state)
    else:
        torch.set_rng_state(new_state)


def _cuda_manual_seed(seed: int) -> None:
    """Seed the accelerator's default generator (the CPU generator when there is no CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)
    else:
        torch.random.default_generator.manual_seed(seed)


class CudaRNGStatesTracker:
    """Named generator states; `fork(name)` runs a block on one of them.

    Megatron raises a bare Exception for a missing or duplicate state; gigatron raises ValueError
    (a subclass, so existing `except Exception` handlers still work).
    """

    def __init__(self, use_cudagraphable_rng: bool = False, is_inference_rng_tracker: bool = False):
        if use_cudagraphable_rng:
            raise ValueError(
                "use_cudagraphable_rng=True is not supported by gigatron (CUDA-graph-safe "
                "generators are not implemented)"
            )
        self.use_cudagraphable_rng = False
        self.is_inference_rng_tracker = is_inference_rng_tracker
        self.reset()

    def is_initialized(self) -> bool:
        return self._is_initialized

    def reset(self) -> None:
        """Forget every state and seed."""
        self._is_initialized = False
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        """A copy of the name -> state map (states are not cloned; forks replace, never mutate)."""
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        """Replace every state (used by checkpoint recompute and when loading checkpoints)."""
        self._is_initialized = True
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        """Create state `name` from `seed`. Names and seeds must be unique."""
        self._is_initialized = True
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists (rng tracker seeds must be unique)")
        if name in self.states_:
            raise ValueError(f"cuda rng state {name} already exists")
        self.seeds_.add(seed)
        orig = _get_cuda_rng_state()
        _cuda_manual_seed(seed)
        self.states_[name] = _get_cuda_rng_state()
        _set_cuda_rng_state(orig)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG_TRACKER_NAME):
        """Run the block on state `name`, then store its advanced state and restore the caller's."""
        if name not in self.states_:
            raise ValueError(
                f"cuda rng state {name} is not added (call model_parallel_cuda_manual_seed first)"
            )
        orig = _get_cuda_rng_state()
        _set_cuda_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = _get_cuda_rng_state()
            _set_cuda_rng_state(orig)


_CUDA_RNG_STATE_TRACKER: CudaRNGStatesTracker | None = None


def _reject(flag: str, value, why: str) -> None:
    if value:
        raise ValueError(f"{flag}={value!r} is not supported by gigatron ({why})")


def initialize_rng_tracker(
    use_te_rng_tracker: bool = False,
    inference_rng_tracker: bool = False,
    use_cudagraphable_rng: bool = False,
    force_reset: bool = False,
) -> None:
    """Create the global tracker once (again with `force_reset`)."""
    global _CUDA_RNG_STATE_TRACKER
    _reject("use_te_rng_tracker", use_te_rng_tracker, "needs Transformer Engine")
    _reject("use_cudagraphable_rng", use_cudagraphable_rng, "CUDA-graph-safe RNG")
    if _CUDA_RNG_STATE_TRACKER is None or force_reset:
        _CUDA_RNG_STATE_TRACKER = CudaRNGStatesTracker(
            is_inference_rng_tracker=inference_rng_tracker
        )


def get_cuda_rng_tracker(
    use_te_rng_tracker: bool = False,
    inference_rng_tracker: bool = False,
    use_cudagraphable_rng: bool = False,
) -> CudaRNGStatesTracker:
    """The process-wide tracker."""
    initialize_rng_tracker(use_te_rng_tracker, inference_rng_tracker, use_cudagraphable_rng)
    return _CUDA_RNG_STATE_TRACKER


def get_expert_parallel_rng_tracker_name() -> str:
    """Name of the expert-parallel stream ("expert-parallel-rng")."""
    return _EXPERT_PARALLEL_RNG_TRACKER_NAME


def get_data_parallel_rng_tracker_name() -> str:
    """Name of the data-parallel stream ("data-parallel-rng")."""
    return _DATA_PARALLEL_RNG_TRACKER_NAME


def _rank_or_default(rank: int | None, getter: str) -> int:
    if rank is not None:
        return rank
    from gigatron.core import parallel_state

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
    tracker = _CUDA_RNG_STATE_TRACKER
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
