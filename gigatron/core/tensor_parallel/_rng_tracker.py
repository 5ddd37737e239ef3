"""The process-wide tracker of named RNG streams (re-exported by `random`).

Mirrors `CudaRNGStatesTracker`, `initialize_rng_tracker` and `get_cuda_rng_tracker` of
`megatron.core.tensor_parallel.random`. Kept apart so `random` (which seeds the streams) and
`_checkpointing` (which replays them) both read the tracker without importing each other.

gigatron difference: without CUDA the tracker drives the CPU default generator, so the same
script (seeding, forks, checkpoint recompute) runs unchanged on a CPU-only machine.
"""

from __future__ import annotations

import contextlib

import torch

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
                f"cuda rng state {name} is not added: call tensor_parallel."
                "model_parallel_cuda_manual_seed(seed) once after initialize_model_parallel and "
                "before building the model (it seeds each rank's model-parallel RNG; needed on CPU "
                "too, despite its name)"
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
