"""Loss checks of the training step (Megatron's resilience_config, the part gigatron has)."""

from dataclasses import dataclass


@dataclass(kw_only=True)
class RerunStateMachineConfig:
    """Checks on each step's loss (gigatron's rerun state machine runs only in 'disabled' mode,
    so Megatron's error-injection and rerun fields are not here)."""

    check_for_nan_in_loss: bool = True
    """Stop (or with --skip-nan-steps skip the step) on a NaN / Inf loss; its flags are
    --no-check-for-nan-in-loss-and-grad and --check-for-nan-in-loss-and-grad (dest
    check_for_nan_in_loss_and_grad), declared by hand as in Megatron."""
