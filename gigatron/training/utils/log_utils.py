"""Logging levels and filters, the run's progress log, and a barrier with a timestamp.

Mirrors `megatron.training.utils.log_utils`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime
from functools import partial

import torch

from gigatron.core.utils import safe_get_rank, safe_get_world_size
from gigatron.training.utils.common_utils import print_rank_0

logger = logging.getLogger(__name__)


def warning_filter(record: logging.LogRecord) -> bool:
    """Drop WARNING records (exactly that level), keep the others."""
    return record.levelno != logging.WARNING


def module_filter(record: logging.LogRecord, modules_to_filter: list[str]) -> bool:
    """Drop records whose logger name starts with one of `modules_to_filter` (a plain string
    prefix: "megatron" also drops "megatronics")."""
    return not any(record.name.startswith(prefix) for prefix in modules_to_filter)


def add_filter_to_all_loggers(
    filter: logging.Filter | Callable[[logging.LogRecord], bool],
) -> None:
    """Add `filter` to the root logger and to every logger created so far."""
    logging.getLogger().addFilter(filter)
    for name in list(logging.root.manager.loggerDict):
        logging.getLogger(name).addFilter(filter)


def setup_logging(
    logging_level: int | None = None,
    filter_warning: bool = True,
    modules_to_filter: list[str] | None = None,
    set_level_for_all_loggers: bool = False,
) -> None:
    """Set the root level: `logging_level`, else MEGATRON_LOGGING_LEVEL (an int), else INFO.

    The same level goes to loggers under "megatron.bridge" (every existing logger with
    `set_level_for_all_loggers`). `filter_warning` adds `warning_filter` everywhere;
    `modules_to_filter` adds a `module_filter` for those prefixes.
    """
    level = logging.INFO
    env_level = os.environ.get("MEGATRON_LOGGING_LEVEL")
    if env_level is not None:
        try:
            level = int(env_level)
        except ValueError:
            raise ValueError(
                f"MEGATRON_LOGGING_LEVEL={env_level!r} must be an integer logging level"
            ) from None
    if logging_level is not None:
        level = logging_level
    logger.info("Setting logging level to %s", level)
    logging.getLogger().setLevel(level)
    for name in list(logging.root.manager.loggerDict):
        if set_level_for_all_loggers or name.startswith("megatron.bridge"):
            logging.getLogger(name).setLevel(level)
    if filter_warning:
        add_filter_to_all_loggers(warning_filter)
    if modules_to_filter:
        add_filter_to_all_loggers(partial(module_filter, modules_to_filter=modules_to_filter))


def append_to_progress_log(save_dir: str | None, string: str, barrier: bool = True) -> None:
    """Append `<time>\\tJob ID: <SLURM_JOB_ID>\\t# GPUs: <world>\\t<string>` to
    `save_dir/progress.txt` on rank 0 (after a barrier when asked). No save_dir: nothing."""
    if save_dir is None:
        return
    if barrier and torch.distributed.is_initialized():
        torch.distributed.barrier()
    if safe_get_rank() != 0:
        return
    os.makedirs(save_dir, exist_ok=True)
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    job_id = os.environ.get("SLURM_JOB_ID", "")
    with open(os.path.join(save_dir, "progress.txt"), "a+") as f:
        f.write(f"{stamp}\tJob ID: {job_id}\t# GPUs: {safe_get_world_size()}\t{string}\n")


def barrier_and_log(string: str) -> None:
    """Barrier (when distributed), then print `[string] datetime: <now>` on rank 0."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print_rank_0(f"[{string}] datetime: {stamp} ")
