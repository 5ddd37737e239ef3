"""Reading files that came from elsewhere: regular files only, bounded sizes, confined paths.

Checkpoints, index caches, Hugging Face directories and configs are untrusted input. Three
rules hold for every such read, whatever parses the bytes afterwards:

- **Regular files only.** A symlink to `/dev/zero`, a FIFO or a directory named like the file
  is refused before a byte is read (the file is opened with `O_NONBLOCK`, so opening a FIFO
  never waits for a writer, and the open descriptor is checked with `fstat`).
- **A size limit fit for what the file is** (`LIMITS`): a tracker is a few bytes, a
  `config.json` a few KiB; a larger file is refused with its size and the limit.
- **Paths named inside a file stay inside its directory** (`confined_path`): no absolute path,
  no `..` out of it, no symlink that resolves outside it.

Each refusal is an `UntrustedFileError` (a `ValueError`) whose one line names the file, the
rule and the value. Callers re-raise it as their own error type where they have one.
"""

from __future__ import annotations

import codecs
import io
import os
import stat

__all__ = [
    "LIMITS",
    "UntrustedFileError",
    "check_regular_file",
    "confined_path",
    "decode_utf8",
    "open_regular_file",
    "read_bytes",
    "read_text",
]

_KiB, _MiB, _GiB = 1 << 10, 1 << 20, 1 << 30

LIMITS: dict[str, int] = {
    "tracker": 1 * _KiB,  # latest_checkpointed_iteration.txt: an integer or "release"
    "json_small": 16 * _MiB,  # metadata.json, config.json, tokenizer_config.json, run args
    "index_json": 256 * _MiB,  # model.safetensors.index.json (one line per tensor)
    "yaml": 1 * _MiB,  # --yaml-cfg (a file of flags)
    "dcp_metadata": 4 * _GiB,  # .metadata of a torch_dist checkpoint (one entry per chunk)
    "common_pt": 4 * _GiB,  # common.pt: args, RNG states, scheduler, non-sharded state
    "tokenizer": 2 * _GiB,  # tokenizer.json, vocab / merges files, sentencepiece models
    "calibration": 256 * _MiB,  # estimate calibration, schedule timelines
    "index_description": 64 * _MiB,  # dataset index cache description.txt (JSON per corpus)
}


class UntrustedFileError(ValueError):
    """A file from elsewhere broke a rule (not a regular file, too large, a path escapes)."""


def _describe_mode(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _limit(max_bytes: int | str | None) -> int | None:
    return LIMITS[max_bytes] if isinstance(max_bytes, str) else max_bytes


def _check_stat(st: os.stat_result, path: str, what: str, max_bytes: int | None) -> int:
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedFileError(
            f"{what} {path} is {_describe_mode(st.st_mode)}; only a regular file is read"
        )
    if max_bytes is not None and st.st_size > max_bytes:
        raise UntrustedFileError(
            f"{what} {path} is {st.st_size} bytes, over the {max_bytes}-byte limit for this "
            "kind of file"
        )
    return st.st_size


def check_regular_file(path: str | os.PathLike, *, what: str, max_bytes=None) -> int:
    """Return the size of `path` after checking it is a regular file within `max_bytes`.

    `max_bytes` is a byte count or a key of `LIMITS`. Symlinks are followed, so a link to a
    device is refused as the device. Raises FileNotFoundError as `os.stat` does.
    """
    path = os.fspath(path)
    return _check_stat(os.stat(path), path, what, _limit(max_bytes))


def open_regular_file(path: str | os.PathLike, *, what: str, max_bytes=None) -> io.BufferedReader:
    """Open `path` for binary reading once it is a regular file within `max_bytes`.

    Opens with O_NONBLOCK (a FIFO without a writer does not block the open), checks the open
    descriptor with fstat (no race between the check and the read), then clears O_NONBLOCK.
    """
    path = os.fspath(path)
    limit = _limit(max_bytes)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        _check_stat(os.fstat(fd), path, what, limit)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike, *, what: str, max_bytes) -> bytes:
    """All bytes of a regular file within `max_bytes` (never more are read, even if it grows)."""
    limit = _limit(max_bytes)
    with open_regular_file(path, what=what, max_bytes=limit) as f:
        data = f.read(limit + 1) if limit is not None else f.read()
    if limit is not None and len(data) > limit:
        raise UntrustedFileError(
            f"{what} {os.fspath(path)} grew past the {limit}-byte limit while being read"
        )
    return data


def decode_utf8(data: bytes, *, what: str, path: str | os.PathLike) -> str:
    """Decode UTF-8 (a BOM allowed) or raise one line naming the file and the byte offset."""
    try:
        return codecs.decode(data, "utf-8-sig")
    except UnicodeDecodeError as e:
        raise UntrustedFileError(
            f"{what} {os.fspath(path)} is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset "
            f"{e.start}: {e.reason})"
        ) from None


def read_text(path: str | os.PathLike, *, what: str, max_bytes) -> str:
    """A regular UTF-8 text file within `max_bytes`, as str; bad UTF-8 names file and offset."""
    return decode_utf8(read_bytes(path, what=what, max_bytes=max_bytes), what=what, path=path)


def confined_path(root: str | os.PathLike, name: str, *, what: str, source: str) -> str:
    """`root/name` where `name` came from inside the untrusted file `source`.

    Refuses an absolute `name`, a `name` with `..` that leaves `root`, and a `name` whose
    symlinks resolve outside `root`. Returns the joined (not resolved) path.
    """
    root = os.fspath(root)
    if not isinstance(name, str) or not name:
        raise UntrustedFileError(f"{source} names {what} {name!r}; expected a relative file name")
    if "\x00" in name:
        raise UntrustedFileError(
            f"{source} names {what} {name!r}: a NUL byte in a file name; no such file is read"
        )
    if os.path.isabs(name) or name.startswith(("/", "\\")):
        raise UntrustedFileError(
            f"{source} names {what} {name!r}: an absolute path; only a path inside {root} is read"
        )
    joined = os.path.join(root, name)
    real_root = os.path.realpath(root)
    real = os.path.realpath(joined)
    if os.path.commonpath([real_root, real]) != real_root:
        raise UntrustedFileError(
            f"{source} names {what} {name!r}, which resolves to {real}, outside {real_root}; "
            "only a path inside that directory is read"
        )
    return joined
