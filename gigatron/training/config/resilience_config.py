"""Loss checks of the training step (Megatron's resilience_config, the part gigatron has)."""

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class RerunStateMachineConfig:
    """Checks on each step's loss. gigatron's rerun state machine runs only in 'disabled' mode
    (no re-run of a step): `validate_args` refuses another --rerun-mode or an error injection
    rate other than 0."""

    error_injection_rate: int = 0
    """Inject an unexpected result once in this many result validations (Megatron's rerun
    state machine); gigatron: 0 only (no injection)."""

    error_injection_type: Literal["correct_result", "transient_error", "persistent_error"] = (
        "transient_error"
    )
    """Kind of error --error-injection-rate injects."""

    rerun_mode: Literal["disabled", "validate_results", "report_stats"] = "disabled"
    """Re-run steps to validate results or report their variability; gigatron: 'disabled' only,
    its default (Megatron's default 'validate_results')."""

    check_for_nan_in_loss: bool = True
    """Stop (or with --skip-nan-steps skip the step) on a NaN / Inf loss; its flags are
    --no-check-for-nan-in-loss-and-grad and --check-for-nan-in-loss-and-grad (dest
    check_for_nan_in_loss_and_grad), declared by hand as in Megatron."""
