"""A training checkpoint's files: directory names, the tracker, and how a save becomes visible.

Layout: `<root>/iter_0000100/` (or `release/`) and the tracker `latest_checkpointed_iteration.txt`
naming the newest; `gigatron.convert` writes the same layout. A save becomes visible by a fresh
directory, a rename into place, the tracker last.

The protocol (`gigatron.training.checkpointing.save_checkpoint` drives it; docs/checkpoints.md
states it for audit). Names under the save root, for iteration N and a token rank 0 draws and
broadcasts:

  `iter_N.tmp-<token>/`  staging: every rank writes its files here, never anywhere else
  `iter_N/`              the published checkpoint, only ever created by a rename
  `iter_N.old-<token>/`  an existing `iter_N/`, moved aside while the new one is renamed in

1. `prepare` (rank 0, before any rank writes): take the save directory's lock
   (`lock_save_dir`: one job per save root), repair and remove what crashed saves left
   (`repair_leftovers`), then create the empty staging directory.
2. Every rank writes into staging; DCP's `.metadata`, then `metadata.json` complete it.
3. Barrier: every rank's files are complete.
4. `publish` (rank 0): fsync every file of staging and staging itself; if `iter_N/` exists,
   rename it to `iter_N.old-<token>/`; rename staging to `iter_N/`; fsync the root; replace the
   tracker (temp file, fsync, rename, fsync the root); then delete the aside copy.
5. Barrier.

No step writes inside a directory the tracker can name, so the tracker always names a complete
checkpoint, except between the two renames of step 4, where `iter_N/` is briefly absent and its
complete copy is `iter_N.old-<token>/`: `resolve` (load) reads that copy and `repair_leftovers`
(next save) renames it back.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import sys
import time

from gigatron.core.dist_checkpointing import CheckpointingException, DamagedCheckpointError
from gigatron.core.dist_checkpointing.core import (
    check_is_distributed_checkpoint,
    describe_write_error,
)
from gigatron.core.untrusted_files import UntrustedFileError, read_text

TRACKER_FNAME = "latest_checkpointed_iteration.txt"
CHECKPOINT_VERSION = 3.0


def checkpoint_dir(root: str, iteration: int, release: bool = False) -> str:
    """`<root>/iter_0000100` (or `<root>/release`)."""
    return os.path.join(root, "release" if release else f"iter_{iteration:07d}")


def write_tracker(root: str, iteration: int) -> None:
    """Atomically replace the tracker: temp file, fsync, rename, fsync the directory."""
    path = os.path.join(root, TRACKER_FNAME)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(str(iteration))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_tracker(root: str) -> tuple[int, bool] | None:
    """(iteration, release) from the tracker, None when there is no tracker file."""
    path = os.path.join(root, TRACKER_FNAME)
    if not os.path.exists(path):
        return None
    try:  # a regular file of at most a few bytes: never a link to /dev/zero, never a FIFO
        text = read_text(path, what="checkpoint tracker", max_bytes="tracker").strip()
    except UntrustedFileError as e:
        raise DamagedCheckpointError(f"{e}: the tracker is damaged") from None
    if text == "release":
        return 0, True
    try:
        iteration = int(text)
    except ValueError:
        raise DamagedCheckpointError(
            f"{path} is damaged: expected an iteration number or 'release', got {text[:40]!r}"
        ) from None
    if iteration < 0:
        raise DamagedCheckpointError(f"{path} is damaged: negative iteration {iteration}")
    return iteration, False


STAGING_TAG = ".tmp-"
ASIDE_TAG = ".old-"
_LEFTOVER = re.compile(r"^(iter_\d{7,})(\.tmp-|\.old-)[0-9a-f]+$")

__all__ = [
    "lock_save_dir",
    "prepare",
    "publish",
    "repair_leftovers",
    "resolve",
    "staging_dir",
    "unlock_save_dir",
]


def staging_dir(root: str, iteration: int, token: str) -> str:
    """`<root>/iter_0000006.tmp-<token>`: where every rank writes a save of `iteration`."""
    return checkpoint_dir(root, iteration) + STAGING_TAG + token


def _aside_dir(root: str, iteration: int, token: str) -> str:
    return checkpoint_dir(root, iteration) + ASIDE_TAG + token


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    """fsync every regular file directly inside `path`, then `path` itself."""
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(path)


def _rename(src: str, dst: str) -> None:
    """Atomic rename of a directory; refuses to replace an existing `dst`."""
    if os.path.lexists(dst):
        raise FileExistsError(f"{dst} exists: refusing to rename {src} over it")
    os.rename(src, dst)


def _remove(path: str) -> None:
    shutil.rmtree(path)


def _leftovers(root: str) -> dict[str, dict[str, list[str]]]:
    """{'iter_N': {'.tmp-': [paths], '.old-': [paths]}} of the root's staging / aside dirs."""
    found: dict[str, dict[str, list[str]]] = {}
    for entry in os.scandir(root):
        m = _LEFTOVER.match(entry.name)
        if m and entry.is_dir(follow_symlinks=False):
            found.setdefault(m.group(1), {STAGING_TAG: [], ASIDE_TAG: []})[m.group(2)].append(
                entry.path
            )
    return found


def _newest(paths: list[str]) -> list[str]:
    return sorted(paths, key=lambda p: os.stat(p).st_mtime_ns, reverse=True)


def repair_leftovers(root: str) -> None:
    """Rank 0, no save in flight: undo what a crashed save left under `root`.

    Staging dirs and tracker temp files are removed (the tracker never names one). An aside
    copy whose `iter_N/` is missing is renamed back to `iter_N/` (a crash between the two
    renames); asides of an `iter_N/` that is complete are removed. Nothing else is touched: an
    `iter_N/` is never modified.
    """
    changed = False
    for entry in os.scandir(root):  # a tracker temp file of a save killed while writing it
        if entry.name.startswith(TRACKER_FNAME + ".tmp.") and entry.is_file():
            os.remove(entry.path)
    for name, kinds in sorted(_leftovers(root).items()):
        for path in kinds[STAGING_TAG]:
            _remove(path)
        final = os.path.join(root, name)
        asides = _newest(kinds[ASIDE_TAG])
        complete = [p for p in asides if check_is_distributed_checkpoint(p)]
        if not os.path.lexists(final) and complete:
            print(
                f"WARNING: {final} was missing (a save died between its renames); "
                f"restoring it from {complete[0]}",
                flush=True,
            )
            _rename(complete[0], final)
            asides.remove(complete[0])
            changed = True
        if check_is_distributed_checkpoint(final):
            for path in asides:
                _remove(path)
    if changed:
        _fsync_dir(root)


LOCK_FNAME = ".gigatron-save.lock"
_HELD: dict[str, int] = {}  # realpath of a save root -> the open file holding its lock


def lock_save_dir(root: str) -> bool:
    """Hold `<root>/.gigatron-save.lock` for this process, or refuse: one job per save root.

    Two jobs saving into one root replace each other's `iter_N/` and tracker, so the first
    writer takes an exclusive `flock` on the lock file and keeps it until it calls
    `unlock_save_dir` or dies (the kernel drops it with the process, so a killed job leaves no
    stale lock). The file records who holds it (host, pid, start time, command) for the
    refusal. Idempotent within a process. A filesystem without `flock` (some network mounts)
    gets one warning and no lock. Readers (`--load`) take no lock. True when this call took
    the lock (False: this process held it already, or the filesystem has no flock).
    """
    os.makedirs(root, exist_ok=True)
    key = os.path.realpath(root)
    if key in _HELD:
        return False
    path = os.path.join(root, LOCK_FNAME)
    try:  # O_NOFOLLOW: a symlink planted under that name is not followed elsewhere
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise CheckpointingException(
            f"cannot open the save lock {path}: {describe_write_error(e)}"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise CheckpointingException(
            f"--save {root} is in use by another job ({holder}): two jobs saving into one "
            f"directory replace each other's checkpoints; give this job its own --save or stop "
            f"that one (lock: {path})"
        ) from None
    except OSError as e:  # ENOLCK / EOPNOTSUPP: no flock on this filesystem
        os.close(fd)
        print(
            f"WARNING: cannot lock {path} ({describe_write_error(e)}): nothing stops another job "
            f"from saving into {root}",
            flush=True,
        )
        return False
    _HELD[key] = fd
    command = " ".join(sys.argv)[:300]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
    line = f"host {socket.gethostname()}, pid {os.getpid()}, since {stamp}, command: {command}\n"
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, line.encode("utf-8", "replace"), 0)
    except OSError:  # a full disk: the lock holds all the same, only the note is missing
        pass
    return True


def _read_holder(fd: int) -> str:
    """The holder's note from the lock file (written by whoever holds it: shown, never run)."""
    try:
        raw = os.pread(fd, 1024, 0)
    except OSError:
        raw = b""
    text = raw.decode("utf-8", "replace").split("\n")[0]
    text = "".join(c if c.isprintable() else "?" for c in text)[:400]
    return text or "holder unknown: its lock file is empty"


def unlock_save_dir(root: str) -> None:
    """Release this process's lock on `root` (nothing when it holds none). The file stays."""
    fd = _HELD.pop(os.path.realpath(root), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor drops the flock


def prepare(root: str, iteration: int, token: str) -> str:
    """Rank 0: create `root` if needed, take its lock, repair leftovers, make the staging dir."""
    lock_save_dir(root)
    repair_leftovers(root)
    path = staging_dir(root, iteration, token)
    os.mkdir(path)
    return path


def publish(root: str, iteration: int, token: str) -> None:
    """Rank 0, after every rank finished writing staging: rename it to `iter_N/`, tracker last."""
    staging = staging_dir(root, iteration, token)
    final = checkpoint_dir(root, iteration)
    _fsync_tree(staging)
    aside = None
    if os.path.lexists(final):
        aside = _aside_dir(root, iteration, token)
        _rename(final, aside)
    _rename(staging, final)
    _fsync_dir(root)
    write_tracker(root, iteration)
    if aside is not None:
        try:
            _remove(aside)
        except OSError as e:  # published already: the next save's repair retries
            print(f"WARNING: could not delete {aside} ({e}); the next save will", flush=True)


def resolve(root: str, iteration: int, release: bool = False, *, warn: bool = True) -> str:
    """The directory to load for a tracker entry (read-only: nothing is renamed or removed).

    `iter_N/` when it is a complete checkpoint; otherwise its newest complete aside copy (a save
    died between its two renames), with a warning naming both; otherwise `iter_N/` (the caller
    reports it missing or incomplete).
    """
    final = checkpoint_dir(root, iteration, release)
    if release or check_is_distributed_checkpoint(final) or not os.path.isdir(root):
        return final
    asides = _leftovers(root).get(os.path.basename(final), {}).get(ASIDE_TAG, [])
    for path in _newest(asides):
        if check_is_distributed_checkpoint(path):
            if warn:
                print(
                    f"WARNING: {final} is missing or incomplete (a save died between its "
                    f"renames); loading its complete copy {path}",
                    flush=True,
                )
            return path
    return final


def tracked_dir(root: str, *, warn: bool = True) -> str | None:
    """The directory the tracker under `root` names, through `resolve` (None: no tracker).

    Every reader of a save root (load_checkpoint, generate, convert, the early read of the
    saved args) goes through this, so all of them see the same checkpoint."""
    found = read_tracker(root)
    return None if found is None else resolve(root, *found, warn=warn)


_ITER_DIR = re.compile(r"^iter_(\d{7,})$")


def newest_complete_before(root: str, iteration: int | None) -> int | None:
    """The newest iteration under `root` older than `iteration` (any, if None) whose directory
    is a complete checkpoint (its `metadata.json` is valid); None when there is none."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return None
    found = []
    for entry in entries:
        m = _ITER_DIR.match(entry.name)
        if m and (iteration is None or int(m.group(1)) < iteration):
            found.append(int(m.group(1)))
    for n in sorted(found, reverse=True):
        if check_is_distributed_checkpoint(checkpoint_dir(root, n)):
            return n
    return None
