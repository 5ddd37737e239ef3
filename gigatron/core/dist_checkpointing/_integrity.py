"""Optional SHA-256 manifest of a checkpoint directory's files, verified on load.

`integrity_sha256.json` = {"algorithm": "sha256", "files": {name: hexdigest}} covers every file
written before it (data files, `.metadata`, `common.pt`); `metadata.json` is written after it.
"""

from __future__ import annotations

import hashlib
import json
import os

from gigatron.core.dist_checkpointing.core import (
    CONFIG_FNAME,
    DamagedCheckpointError,
)
from gigatron.core.untrusted_files import (
    UntrustedFileError,
    confined_path,
    open_regular_file,
    read_text,
)

MANIFEST_FNAME = "integrity_sha256.json"

__all__ = ["MANIFEST_FNAME", "verify_manifest", "write_manifest"]


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open_regular_file(path, what="checkpoint file") as f:  # never a FIFO or a device
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _files(checkpoint_dir: str) -> list[str]:
    skip = {MANIFEST_FNAME, CONFIG_FNAME}
    return sorted(
        e.name
        for e in os.scandir(checkpoint_dir)
        if e.is_file() and e.name not in skip and not e.name.endswith(".tmp")
    )


def write_manifest(checkpoint_dir: str) -> None:
    files = {name: _sha256(os.path.join(checkpoint_dir, name)) for name in _files(checkpoint_dir)}
    path = os.path.join(checkpoint_dir, MANIFEST_FNAME)
    with open(path + ".tmp", "w") as f:
        json.dump({"algorithm": "sha256", "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def verify_manifest(checkpoint_dir: str) -> None:
    """Raise CheckpointingException naming the first file whose hash differs or is absent."""
    path = os.path.join(checkpoint_dir, MANIFEST_FNAME)
    try:
        manifest = json.loads(read_text(path, what="integrity manifest", max_bytes="json_small"))
        files = dict(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DamagedCheckpointError(
            f"{path}: integrity manifest missing or unreadable ({e})"
        ) from None
    for name, digest in sorted(files.items()):
        try:  # a name inside the manifest stays inside the checkpoint, a regular file
            full = confined_path(checkpoint_dir, name, what="file", source=path)
            if not os.path.exists(full):
                raise DamagedCheckpointError(
                    f"{checkpoint_dir}: file {name} listed in {MANIFEST_FNAME} is missing"
                )
            actual = _sha256(full)
        except UntrustedFileError as e:
            raise DamagedCheckpointError(str(e)) from None
        if actual != digest:
            raise DamagedCheckpointError(
                f"{checkpoint_dir}: {name} fails its SHA-256 check: the checkpoint is damaged"
            )
