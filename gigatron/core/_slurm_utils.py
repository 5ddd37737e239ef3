"""Megatron's SLURM helpers: whether this process is a task of a SLURM job, and its rank, world
size and local rank as srun sets them (None outside SLURM or when srun left a variable unset).

A job is a SLURM job when `SLURM_NTASKS` is set; rank, world size and local rank are then
`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`. These read the launcher's environment, which is
their meaning (gigatron's core otherwise takes switches from config fields).
"""

from __future__ import annotations

import os

__all__ = [
    "is_slurm_job", "resolve_slurm_local_rank", "resolve_slurm_rank", "resolve_slurm_world_size",
]  # fmt: skip


def is_slurm_job() -> bool:
    return "SLURM_NTASKS" in os.environ  # srun's task count


def _slurm_int(name: str, value: str | None) -> int | None:
    """srun's `name` variable (`value`, None when unset) as an int; None outside SLURM."""
    if not is_slurm_job() or value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: SLURM sets it to an integer") from None


def resolve_slurm_rank() -> int | None:
    return _slurm_int("SLURM_PROCID", os.environ.get("SLURM_PROCID"))  # srun's global task id


def resolve_slurm_world_size() -> int | None:
    return _slurm_int("SLURM_NTASKS", os.environ.get("SLURM_NTASKS"))  # srun's task count


def resolve_slurm_local_rank() -> int | None:
    return _slurm_int("SLURM_LOCALID", os.environ.get("SLURM_LOCALID"))  # task id on this node
