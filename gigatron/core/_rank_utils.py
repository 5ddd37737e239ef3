"""This process's rank and world size, also before torch.distributed starts (mirrors
`megatron.core._rank_utils`), and logging on one rank.

Before `torch.distributed` is initialised the launcher's variables answer, in Megatron's order:
`RANK` / `WORLD_SIZE` (torchrun), then `SLURM_PROCID` / `SLURM_NTASKS` (srun), else 0 / 1 with
a warning. Reading them is rank discovery, not a switch.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch

__all__ = ["log_single_rank", "safe_get_rank", "safe_get_world_size"]


def _first_int(found: dict[str, str | None], default: int, what: str) -> int:
    """The first launcher variable of `found` (name -> value read) that is set, as an int."""
    for name, value in found.items():
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not an integer ({what})") from None
    warnings.warn(
        f"Could not determine {what} from torch.distributed or {', '.join(found)}; "
        f"assuming {default}.",
        stacklevel=3,
    )
    return default


def safe_get_rank() -> int:
    """torch.distributed's rank, else RANK, else SLURM_PROCID, else 0 (with a warning)."""
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    found = {
        "RANK": os.environ.get("RANK"),
        "SLURM_PROCID": os.environ.get("SLURM_PROCID"),
    }
    return _first_int(found, 0, "the rank")


def safe_get_world_size() -> int:
    """torch.distributed's world size, else WORLD_SIZE, else SLURM_NTASKS, else 1 (warning)."""
    if torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    found = {
        "WORLD_SIZE": os.environ.get("WORLD_SIZE"),
        "SLURM_NTASKS": os.environ.get("SLURM_NTASKS"),
    }
    return _first_int(found, 1, "the world size")


def log_single_rank(
    logger: logging.Logger, level: int, msg: object, *args: Any, rank: int = 0, **kwargs: Any
) -> None:
    """`logger.log(level, msg, *args, **kwargs)` on `rank` only (the rank is not asked when the
    level is disabled)."""
    if logger.isEnabledFor(level) and safe_get_rank() == rank:
        logger.log(level, msg, *args, **kwargs)
