"""The one mutable slot of `parallel_state`: what `initialize_model_parallel` decided.

`parallel_state` writes it (initialise, destroy); `_parallel_state_getters` reads it. Both import
this module, so neither imports the other. Nothing else should touch it: read the groups through
`parallel_state`'s getters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gigatron.compat.errors import StateError
from gigatron.core._rank_grid import RankGenerator


@dataclass(frozen=True)
class Axis:
    """One group this rank belongs to: the process group and its global ranks."""

    group: object
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)

    def rank_of(self, global_rank: int) -> int:
        return self.ranks.index(global_rank)


@dataclass(frozen=True)
class ParallelState:
    """Everything `initialize_model_parallel` decided, for this rank."""

    tp: Axis
    pp: Axis
    cp: Axis
    dp: Axis
    dp_cp: Axis
    mp: Axis
    tp_cp: Axis
    tp_dp: Axis
    tp_dp_cp: Axis
    embd: Axis | None
    pos_embd: Axis | None
    embedding_ranks: tuple[int, ...]
    position_embedding_ranks: tuple[int, ...]
    ep: Axis
    expt_tp: Axis
    tp_ep: Axis
    tp_ep_pp: Axis
    expt_dp: Axis
    dp_gloo: object
    dp_cp_gloo: object
    expt_dp_gloo: object
    gtp_remat: Axis
    expt_gtp_remat: Axis
    dense: RankGenerator = field(repr=False)
    expert: RankGenerator = field(repr=False)


STATE: ParallelState | None = None
# Megatron's "fake initialisation" overrides, used by tests and tools that need sizes and ranks
# without process groups.
OVERRIDES: dict[str, int | None] = {}
# The virtual-pipeline size and rank, which Megatron lets callers set.
VIRTUAL_PP_RANK: int | None = None
VIRTUAL_PP_SIZE: int | None = None


def state(check_initialized: bool = True) -> ParallelState | None:
    """The recorded state; before `initialize_model_parallel` (unless asked not to) StateError,
    an AssertionError (Megatron asserts) and a RuntimeError."""
    if STATE is None and check_initialized:
        raise StateError(
            "model parallel groups are not initialized; call "
            "parallel_state.initialize_model_parallel(...) first"
        )
    return STATE
