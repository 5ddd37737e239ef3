"""Batch sizes, run length, schedule, logging, checkpoint and tokenizer settings (Megatron's
training_config: the fields gigatron has a flag for, under Megatron's names)."""

from dataclasses import dataclass, field
from typing import Literal

from gigatron.training.config.checkpoint_config import CheckpointConfig, TokenizerConfig
from gigatron.training.config.logger_config import LoggerConfig

__all__ = [
    "CheckpointConfig",
    "LoggerConfig",
    "SchedulerConfig",
    "TokenizerConfig",
    "TrainingConfig",
    "ValidationConfig",
]


def _flag(*arg_names: str, **kw) -> dict:
    """`field(metadata=...)` for a flag whose spelling or action is not the field's own."""
    return {"argparse_meta": {"arg_names": list(arg_names), **kw}}


@dataclass(kw_only=True)
class TrainingConfig:
    """Batch sizes, run length, exit conditions and garbage collection."""

    micro_batch_size: int | None = None
    """Samples per microbatch per data-parallel rank."""

    global_batch_size: int | None = None
    """Samples per step (default micro batch x data-parallel size)."""

    rampup_batch_size: list[str] | None = field(
        default=None, metadata={"argparse_meta": {"nargs": 3}}
    )
    """Start increment samples: grow the global batch from start by increment over samples."""

    step_batch_size_schedule: str | None = None
    """"THRESHOLD:BS THRESHOLD:BS ...": the global batch from each threshold on (suffixes K, M,
    B, T; thresholds count tokens, converted to samples by --seq-length). Replaces
    --global-batch-size."""

    train_iters: int | None = None
    """Training iterations."""

    train_samples: int | None = None
    """Training samples (instead of --train-iters)."""

    exit_interval: int | None = None
    """Exit after this iteration."""

    exit_duration_in_mins: float | None = None
    """Save and exit after this many minutes (gigatron takes a float; Megatron an int)."""

    exit_signal_handler: bool = False
    """Save and exit on --exit-signal."""

    exit_signal: Literal["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"] = "SIGTERM"
    """The signal --exit-signal-handler saves and exits on (a name; Megatron's field holds a
    signal.Signals)."""

    manual_gc: bool = False
    """gc.disable(); collect at set points."""

    manual_gc_interval: int = 0
    """gc.collect() every N iterations with --manual-gc (0: only at evaluation and save)."""

    manual_gc_eval: bool = field(default=True, metadata=_flag("--no-manual-gc-eval"))
    """With --manual-gc, collect around evaluations (--no-manual-gc-eval: do not)."""

    empty_unused_memory_level: Literal[0, 1, 2] = 0
    """torch.cuda.empty_cache() after each step (>= 1) and each evaluation."""


@dataclass(kw_only=True)
class ValidationConfig:
    """Evaluation on the validation split."""

    eval_iters: int = 100
    """Iterations per evaluation."""

    eval_interval: int = 1000
    """Iterations between evaluations (gigatron's default 1000; Megatron's None)."""

    start_eval_at_iter: int | None = None
    """No evaluation during training before this iteration: the first is at the first multiple
    of eval_interval at or after it (None or 0: from the first eval_interval)."""

    eval_global_batch_size: int | None = None
    """Samples per evaluation iteration (default --global-batch-size); divisible by
    eval_micro_batch_size x data-parallel size."""

    eval_micro_batch_size: int | None = None
    """Samples per evaluation microbatch per data-parallel rank (default --micro-batch-size)."""

    skip_train: bool = False
    """No training: evaluate and exit."""

    full_validation: bool = False
    """Each evaluation reads the whole validation split (dataset), every sample once, one per
    data-parallel rank per step; --eval-iters becomes the split's length in steps."""

    multiple_validation_sets: bool = False
    """Evaluate each dataset of the validation split on its own, one loss each ("validation-<i>");
    needs --full-validation."""

    validation_set_names: list[str] | None = None
    """Names of the validation sets of --multiple-validation-sets ("validation-<name>" instead
    of "validation-<i>"); one per set."""


@dataclass(kw_only=True)
class SchedulerConfig:
    """Learning-rate and weight-decay schedules."""

    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "linear"
    """Learning-rate decay after the warmup."""

    lr_wsd_decay_style: str = "exponential"
    """Shape of the WSD decay phase (exponential | linear | cosine | minus_sqrt)."""

    lr_decay_iters: int | None = None
    """Decay iterations (default --train-iters)."""

    lr_decay_samples: int | None = None
    """Decay samples (default --train-samples)."""

    lr_wsd_decay_iters: int | None = None
    """WSD decay iterations."""

    lr_wsd_decay_samples: int | None = None
    """WSD decay samples (with --train-samples)."""

    lr_warmup_fraction: float | None = None
    """Warmup as a fraction of the decay steps."""

    lr_warmup_iters: int = 0
    """Warmup iterations."""

    lr_warmup_samples: int = 0
    """Warmup samples (with --train-samples)."""

    lr_warmup_init: float = 0.0
    """Learning rate the warmup starts at."""

    override_opt_param_scheduler: bool = field(
        default=False,
        metadata=_flag("--override-opt_param-scheduler", "--override-opt-param-scheduler"),
    )
    """Resuming: run the learning-rate / weight-decay schedule and the optimizer
    hyperparameters (--adam-beta1/2, --adam-eps, --sgd-momentum, --clip-grad) of these flags,
    not the checkpoint's (a mismatch is an error without one of these two)."""

    use_checkpoint_opt_param_scheduler: bool = field(
        default=False,
        metadata=_flag(
            "--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler"
        ),
    )
    """Resuming: keep the checkpoint's learning-rate / weight-decay schedule and optimizer
    hyperparameters."""

    start_weight_decay: float | None = None
    """Initial weight decay (with --weight-decay-incr-style linear | cosine)."""

    end_weight_decay: float | None = None
    """Final weight decay (with --weight-decay-incr-style linear | cosine)."""

    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = "constant"
    """Weight decay from --start- to --end-weight-decay over the training steps."""
