"""Megatron's `dist_checkpointing.strategies.common`: the non-sharded part of a checkpoint as
one `common.pt` file, written by rank 0.

Megatron 0.20 deprecates `save_common` / `load_common` (its torch_dist keeps that part inside the
DCP files); its conversion tools still call them, and `gigatron.core.dist_checkpointing.save`
writes `common.pt` through `atomic_torch_save` here. `load_common` reads the file as every
checkpoint file is read: a regular file within the size limit, unpickled with the allow-list
(`SAFE_GLOBALS`), never running code from it.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from gigatron.core.dist_checkpointing._safe_load import safe_torch_load
from gigatron.core.dist_checkpointing.core import CheckpointingException, DamagedCheckpointError
from gigatron.core.untrusted_files import UntrustedFileError, open_regular_file

__all__ = ["COMMON_STATE_FNAME", "atomic_torch_save", "load_common", "save_common"]

COMMON_STATE_FNAME = "common.pt"

logger = logging.getLogger(__name__)


def atomic_torch_save(obj, path: str) -> None:
    """torch.save to `path` through a temporary file, synced, then renamed: a reader sees the
    old file or the whole new one, never a part."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_common(common_state_dict: dict, checkpoint_dir: str) -> None:
    """Write `common_state_dict` to `checkpoint_dir/common.pt` (rank 0 only, as Megatron)."""
    logger.warning(
        "save_common is deprecated in Megatron 0.20 (torch_dist keeps the common state); "
        "writing %s", COMMON_STATE_FNAME
    )  # fmt: skip
    if not dist.is_initialized() or dist.get_rank() == 0:
        atomic_torch_save(common_state_dict, os.path.join(str(checkpoint_dir), COMMON_STATE_FNAME))


def load_common(checkpoint_dir: str) -> dict:
    """`checkpoint_dir/common.pt`, read restricted; CheckpointingException if it is missing,
    DamagedCheckpointError if it is not a regular file within the limit or does not load."""
    path = os.path.join(str(checkpoint_dir), COMMON_STATE_FNAME)
    if not os.path.exists(path):
        raise CheckpointingException(f"Common file {path} does not exist")
    try:
        f = open_regular_file(path, what="common state", max_bytes="common_pt")
    except UntrustedFileError as e:
        raise DamagedCheckpointError(str(e)) from None
    with f:
        return safe_torch_load(f, what=path)
