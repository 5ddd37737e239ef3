"""What the training log, TensorBoard and Weights & Biases record (Megatron's LoggerConfig,
which lives in its training_config; here in a file of its own)."""

from dataclasses import dataclass, field
from typing import Literal


@dataclass(kw_only=True)
class LoggerConfig:
    """Log lines, TensorBoard and Weights & Biases."""

    log_interval: int = 100
    """Iterations between log lines."""

    log_params_norm: bool = False
    """Parameters' L2 norm in the log line."""

    log_throughput: bool = False
    """Log throughput (always on in gigatron)."""

    timing_log_level: Literal[0, 1, 2] = 0
    """Accepted, no effect: gigatron has no per-operation timers (use --profile)."""

    timing_log_option: Literal["max", "minmax", "all"] = "minmax"
    """Accepted, no effect: gigatron has no per-operation timers (use --profile)."""

    tensorboard_dir: str | None = None
    """TensorBoard log directory."""

    tensorboard_log_interval: int = 1
    """Accepted, no effect: scalars are written at every --log-interval."""

    tensorboard_queue_size: int = 1000
    """Accepted, no effect: the writer flushes at every log line."""

    log_timers_to_tensorboard: bool = False
    """Accepted, no effect: gigatron has no per-operation timers to write."""

    log_loss_scale_to_tensorboard: bool = field(
        default=True,
        metadata={"argparse_meta": {"arg_names": ["--no-log-loss-scale-to-tensorboard"]}},
    )
    """Write the loss scale to TensorBoard (--no-log-loss-scale-to-tensorboard: do not)."""

    log_validation_ppl_to_tensorboard: bool = False
    """Write the validation perplexity to TensorBoard."""

    log_memory_to_tensorboard: bool = False
    """Write the memory statistics to TensorBoard."""

    log_num_zeros_in_grad: bool = False
    """Log the number of zero gradient entries."""

    log_world_size_to_tensorboard: bool = False
    """Write the world size to TensorBoard."""

    wandb_project: str | None = None
    """Weights & Biases project."""

    wandb_exp_name: str | None = None
    """Weights & Biases run name."""

    wandb_save_dir: str | None = None
    """Weights & Biases directory."""

    wandb_entity: str = ""
    """Accepted, no effect: W&B picks the entity from its own login (Megatron's default None)."""

    logging_level: int | None = None
    """Root logger level (10 DEBUG ... 50 CRITICAL); else MEGATRON_LOGGING_LEVEL, else INFO."""
