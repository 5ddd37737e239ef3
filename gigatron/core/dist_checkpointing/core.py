"""The checkpoint's `metadata.json`: which on-disk backend wrote it.

Mirrors `megatron.core.dist_checkpointing.core`. A directory is a distributed checkpoint when it
holds `metadata.json` = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
"common_backend": "torch", "common_backend_version": 1}. Unknown fields are ignored on read.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import asdict, dataclass, fields

from gigatron.core.untrusted_files import UntrustedFileError, read_text

CONFIG_FNAME = "metadata.json"

__all__ = [
    "CONFIG_FNAME",
    "CheckpointingConfig",
    "CheckpointingException",
    "DamagedCheckpointError",
    "check_is_distributed_checkpoint",
    "describe_write_error",
    "maybe_load_config",
    "save_config",
]


class CheckpointingException(Exception):
    """A checkpoint cannot be written or read as asked (the message says which key and why)."""


class DamagedCheckpointError(CheckpointingException):
    """The checkpoint's files are damaged, incomplete or refused as unsafe (truncated, missing,
    not regular files, over a size limit, naming paths outside the checkpoint): an older
    complete checkpoint may still load, where a user error (wrong flags) would fail the same."""


def describe_write_error(err: BaseException) -> str:
    """`ENOSPC (No space left on device)` for the first OSError in `err`'s chain (torch's zip
    writer reports a short write as `unexpected pos ...`, its cause is the OSError); the
    exception's first line when the chain holds none."""
    seen, e = set(), err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            name = errno.errorcode.get(e.errno, f"errno {e.errno}")
            where = f" on {e.filename}" if e.filename else ""
            return f"{name} ({e.strerror or os.strerror(e.errno)}){where}"
        e = e.__cause__ or e.__context__
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


@dataclass
class CheckpointingConfig:
    """Backends that wrote the sharded tensors and the common (non-sharded) state."""

    sharded_backend: str
    sharded_backend_version: int = 1
    common_backend: str = "torch"
    common_backend_version: int = 1


def maybe_load_config(checkpoint_dir: str) -> CheckpointingConfig | None:
    """The parsed `metadata.json`, or None when the directory has none."""
    path = os.path.join(str(checkpoint_dir), CONFIG_FNAME)
    if not checkpoint_dir or not os.path.exists(path):
        return None
    try:  # a regular file within the small-JSON limit (never /dev/zero, never a FIFO)
        raw = json.loads(read_text(path, what="checkpoint config", max_bytes="json_small"))
    except UntrustedFileError as e:
        raise DamagedCheckpointError(f"{e}: damaged checkpoint") from None
    except (OSError, json.JSONDecodeError) as e:
        raise DamagedCheckpointError(f"{path} is not valid JSON ({e}): damaged checkpoint") from e
    if not isinstance(raw, dict) or "sharded_backend" not in raw:
        raise DamagedCheckpointError(f"{path} has no 'sharded_backend' field: {raw!r}")
    known = {f.name for f in fields(CheckpointingConfig)}
    return CheckpointingConfig(**{k: v for k, v in raw.items() if k in known})


def check_is_distributed_checkpoint(checkpoint_dir: str) -> bool:
    """True when `checkpoint_dir/metadata.json` exists and is a valid config."""
    try:
        return maybe_load_config(checkpoint_dir) is not None
    except CheckpointingException:
        return False


def save_config(config: CheckpointingConfig, checkpoint_dir: str) -> None:
    """Write `metadata.json` (temp file + rename, so a reader never sees half a file)."""
    path = os.path.join(str(checkpoint_dir), CONFIG_FNAME)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(asdict(config), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
