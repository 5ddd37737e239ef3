"""Megatron's rerun state machine, in its DISABLED mode only: training code written for it runs.

Mirrors `megatron.core.rerun_state_machine`. Megatron can re-run an iteration whose result fails
validation (NaN loss, a spiky loss) to tell a transient or persistent hardware fault from a
correct result, checkpointing and restarting on another GPU if needed. gigatron does not
implement re-runs: `RerunMode.VALIDATE_RESULTS` / `REPORT_DETERMINISM_STATS` and error injection
raise ValueError. What DISABLED mode does is kept exactly: `should_run_forward_backward` is True
once per iteration, `validate_result` raises RuntimeError for a rejected result when `fatal`
(the NaN / Inf check), `should_checkpoint_and_exit` is (False, False, 0), `state_dict` is None,
and `RerunDataIterator` passes its iterator through.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from enum import Enum, StrEnum
from typing import Any

import torch

from gigatron.compat.errors import StateError

__all__ = [
    "RerunDataIterator",
    "RerunDiagnostic",
    "RerunErrorInjector",
    "RerunMode",
    "RerunState",
    "RerunStateMachine",
    "destroy_rerun_state_machine",
    "get_rerun_state_machine",
    "initialize_rerun_state_machine",
]

COMPARISON_MATCH: float = 0.0
COMPARISON_MISMATCH: float = math.inf
_NOT_HERE = "gigatron implements only RerunMode.DISABLED (re-running iterations is not implemented)"


class RerunDiagnostic(StrEnum):
    CORRECT_RESULT = "correct_result"
    TRANSIENT_ERROR = "transient_error"
    PERSISTENT_ERROR = "persistent_error"


class RerunMode(StrEnum):
    DISABLED = "disabled"
    VALIDATE_RESULTS = "validate_results"
    REPORT_DETERMINISM_STATS = "report_determinism_stats"


class RerunState(Enum):
    NOT_RUNNING_YET = 0
    INITIAL_RUN = 1
    RERUNNING_IN_PLACE = 2
    WILL_RERUN_FROM_CHECKPOINT = 3
    RERUNNING_FROM_CHECKPOINT = 4
    RERUNNING_AGAIN_FROM_CHECKPOINT = 5


class RerunErrorInjector:
    """Megatron's fault injector; only `error_injection_rate=0` (no injection) here."""

    def __init__(
        self,
        error_injection_rate: int = 0,
        error_injection_type: RerunDiagnostic = RerunDiagnostic.TRANSIENT_ERROR,
    ) -> None:
        if error_injection_rate != 0:
            raise ValueError(f"error_injection_rate={error_injection_rate}: {_NOT_HERE}")
        self.error_injection_rate = error_injection_rate
        self.error_injection_type = error_injection_type
        self.should_inject_errors = False
        self.injected_error_type = None

    def maybe_inject(self) -> bool:
        return False


class RerunStateMachine:
    """The DISABLED-mode machine (see the module docstring); ValueError for other modes."""

    def __init__(
        self,
        state_save_func: Callable[[], Any] | None = None,
        state_restore_func: Callable[[Any], None] | None = None,
        mode: RerunMode = RerunMode.DISABLED,
        error_injector: RerunErrorInjector | None = None,
        result_rejected_tracker_filename: str | None = None,
    ) -> None:
        self.set_mode(mode)
        self.state = RerunState.NOT_RUNNING_YET
        self.current_iteration = -1
        self.error_injector = error_injector or RerunErrorInjector()
        self.state_save_func, self.state_restore_func = state_save_func, state_restore_func
        self.result_rejected_tracker_filename = result_rejected_tracker_filename
        self.large_value_counts: dict[str, int] = {}
        self.max_values: dict[str, float] = {}

    def set_mode(self, mode: RerunMode) -> None:
        if RerunMode(mode) != RerunMode.DISABLED:
            raise ValueError(f"rerun mode {RerunMode(mode).value!r}: {_NOT_HERE}")
        self.mode = RerunMode.DISABLED

    def get_mode(self) -> RerunMode:
        return self.mode

    def should_run_forward_backward(self, data_iterator) -> bool:
        """True on the first call of an iteration, False on the second (no re-run)."""
        if self.state == RerunState.NOT_RUNNING_YET:
            self.state = RerunState.INITIAL_RUN
            self.current_iteration += 1
            return True
        self.state = RerunState.NOT_RUNNING_YET
        return False

    def should_checkpoint_and_exit(self) -> tuple[bool, bool, int]:
        return False, False, 0

    def validate_result(
        self,
        result: Any,
        rejection_func: Callable[[Any], bool],
        message: str,
        comparison_func: Callable[[Any, Any], float] | None = None,
        tolerance: float = 0.0,
        fatal: bool = True,
    ) -> None:
        """RuntimeError naming `message` and the iteration when `rejection_func(result)` and
        `fatal` (Megatron's DISABLED-mode check, e.g. rejection_func=torch.isnan)."""
        if bool(rejection_func(result)) and fatal:
            raise RuntimeError(
                f"iteration {self.current_iteration + 1}: unexpected result {result} "
                f"(message='{message}')"
            )

    def is_unexpectedly_large(
        self,
        result: torch.Tensor,
        threshold: float,
        context: str,
        num_samples: int = 100,
        resample: bool = False,
    ) -> bool:
        """Megatron's spiky-value test: the first `num_samples` values of `context` set its
        max |value|; later ones are flagged when >= threshold x that max (NaN / Inf never)."""
        value = math.fabs(result.item())
        if math.isnan(value) or math.isinf(value):
            return False
        if resample or context not in self.large_value_counts:
            self.large_value_counts[context] = 0
        if self.large_value_counts[context] < num_samples:
            self.large_value_counts[context] += 1
            self.max_values[context] = max(self.max_values.get(context, 0.0), value)
            return False
        return value >= self.max_values[context] * threshold

    def state_dict(self, data_iterator, ckpt_format: str, force: bool = False):
        """None: DISABLED mode has nothing to resume (Megatron's too)."""
        return None

    def validate_state_dict(self, state_dict: dict | None) -> bool:
        if not state_dict:
            return False
        return state_dict.get("state") not in (None, RerunState.NOT_RUNNING_YET)

    def load_state_dict(self, state_dict: dict) -> None:
        raise ValueError(f"cannot resume a rerun in progress from a checkpoint: {_NOT_HERE}")


class RerunDataIterator:
    """Megatron's replaying wrapper; with re-runs disabled it only passes items through."""

    def __init__(self, iterable: Iterable[Any]) -> None:
        self.iterable = iterable
        self.saved_microbatches: list[Any] = []
        self.replaying = False
        self.replay_pos = 0

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        return next(self.iterable)

    def rewind(self) -> None:
        raise ValueError(f"RerunDataIterator.rewind: {_NOT_HERE}")

    def advance(self) -> None:
        self.saved_microbatches = []

    def state_dict(self) -> dict:
        return {"saved_microbatches": [], "replaying": False, "replay_pos": 0}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict.get("saved_microbatches") or state_dict.get("replaying"):
            raise ValueError(f"RerunDataIterator state with saved microbatches: {_NOT_HERE}")


_GLOBAL_RERUN_STATE_MACHINE: RerunStateMachine | None = None


def initialize_rerun_state_machine(*args, **kwargs) -> None:
    """Create the process-wide machine (StateError, an AssertionError as in Megatron, if one
    exists)."""
    global _GLOBAL_RERUN_STATE_MACHINE
    machine = RerunStateMachine(*args, **kwargs)
    if _GLOBAL_RERUN_STATE_MACHINE is not None:
        raise StateError("Rerun state machine is already initialized")
    _GLOBAL_RERUN_STATE_MACHINE = machine


def destroy_rerun_state_machine() -> None:
    global _GLOBAL_RERUN_STATE_MACHINE
    _GLOBAL_RERUN_STATE_MACHINE = None


def get_rerun_state_machine() -> RerunStateMachine:
    """The process-wide machine, created in DISABLED mode on first use (as Megatron)."""
    if _GLOBAL_RERUN_STATE_MACHINE is None:
        initialize_rerun_state_machine()
    return _GLOBAL_RERUN_STATE_MACHINE
