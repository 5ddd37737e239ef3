"""The process-wide objects Megatron scripts reach for: args, timers, tokenizer, writers.

Mirrors `megatron.training.global_vars` (`get_args()`, `get_timers()`, `get_tokenizer()`, ...).
"""

from __future__ import annotations

from gigatron.core.timers import Timers

_ARGS = None
_TIMERS: Timers | None = None
_TOKENIZER = None
_TENSORBOARD_WRITER = None
_WANDB_WRITER = None


def _need(value, name: str):
    if value is None:
        raise RuntimeError(f"{name} is not initialized; call initialize_megatron() / pretrain()")
    return value


def get_args():
    """The parsed training arguments."""
    return _need(_ARGS, "args")


def set_args(args) -> None:
    global _ARGS
    _ARGS = args


def get_timers() -> Timers:
    return _need(_TIMERS, "timers")


def set_timers(timers: Timers | None) -> None:
    global _TIMERS
    _TIMERS = timers


def get_tokenizer():
    return _need(_TOKENIZER, "tokenizer")


def set_tokenizer(tokenizer) -> None:
    global _TOKENIZER
    _TOKENIZER = tokenizer


def get_tensorboard_writer():
    """The TensorBoard SummaryWriter, or None when --tensorboard-dir is not set."""
    return _TENSORBOARD_WRITER


def set_tensorboard_writer(writer) -> None:
    global _TENSORBOARD_WRITER
    _TENSORBOARD_WRITER = writer


def get_wandb_writer():
    """The wandb module (after wandb.init), or None."""
    return _WANDB_WRITER


def set_wandb_writer(writer) -> None:
    global _WANDB_WRITER
    _WANDB_WRITER = writer


def destroy_global_vars() -> None:
    global _ARGS, _TIMERS, _TOKENIZER, _TENSORBOARD_WRITER, _WANDB_WRITER
    _ARGS = _TIMERS = _TOKENIZER = _TENSORBOARD_WRITER = _WANDB_WRITER = None
