"""The on-disk cache of dataset indices (`--data-cache-path`), read as untrusted files.

The cached arrays are plain integers (document, sample, shuffle and blend indices), so they are
written and read with `allow_pickle=False`, and only from regular files: a pickled object
planted as a cached `.npy` never runs, a FIFO or device named like one is never opened.
A cache file that does not load as the integer array expected (pickled, truncated, wrong dtype or
rank), whose values cannot be this dataset's (`check`: lengths, ranges, order, a shuffle index
that is not a permutation), or whose description is not this dataset's is stale: the caller
rebuilds the indices and a warning names the file. Files are written to a temporary name and
renamed into place, so a reader on another rank sees the old file or the new one, never half.

Keyed on the corpus files: the file names keep Megatron's md5 of the dataset's description, and
`description.txt` holds that description followed by the size and mtime_ns of each `.idx` /
`.bin` (`cache_description`). A corpus regenerated under the same prefix no longer matches, so
its indices are rebuilt (and the files overwritten) instead of reused.
"""

from __future__ import annotations

import json
import logging
import os

import numpy

from gigatron.core.untrusted_files import UntrustedFileError, check_regular_file, read_text

logger = logging.getLogger(__name__)

__all__ = [
    "cache_description",
    "check",
    "description_matches",
    "is_permutation",
    "load_index",
    "out_of_range",
    "save_cache",
    "save_description",
    "save_index",
]

_FINGERPRINT_HEADER = "\n\ngigatron corpus files ([size, mtime_ns] of .idx and .bin): "


def cache_description(description: str, fingerprints: list[dict | None]) -> str:
    """What `description.txt` holds: the dataset's description (whose md5 names the files, as in
    Megatron) and the fingerprints of its corpus files (none for mock data)."""
    if all(f is None for f in fingerprints):
        return description
    return description + _FINGERPRINT_HEADER + json.dumps(fingerprints, sort_keys=True) + "\n"


def save_index(path: str, array: numpy.ndarray) -> None:
    """Write `array` to `path` (.npy, no pickle) atomically."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        numpy.save(f, numpy.ascontiguousarray(array), allow_pickle=False)
    os.replace(tmp, path)


def save_description(path: str, description: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(description)
    os.replace(tmp, path)


def save_cache(description_path: str, description: str, arrays: dict[str, numpy.ndarray]) -> None:
    """Write a cache's arrays, then its description: the old description goes first, so a crash
    in between leaves no description (rebuilt next time), never a new one beside old arrays."""
    if os.path.lexists(description_path):
        os.remove(description_path)
    for path, array in arrays.items():
        save_index(path, array)
    save_description(description_path, description)


def description_matches(path: str, description: str) -> bool:
    """True when the cached description is this dataset's; warns (naming the file) if not."""
    try:
        found = read_text(path, what="index cache description", max_bytes="index_description")
    except (OSError, UntrustedFileError) as e:
        _stale(path, f"unreadable ({type(e).__name__}: {_first_line(e)})")
        return False
    if found != description:
        why = "it describes another dataset"
        if found.split(_FINGERPRINT_HEADER)[0] == description.split(_FINGERPRINT_HEADER)[0]:
            why = "the corpus files changed since it was built (size or mtime of .idx / .bin)"
        _stale(path, why)
        return False
    return True


def load_index(path: str, *, ndim: int, width: int | None = None) -> numpy.ndarray | None:
    """The cached integer array at `path` (memory-mapped), or None if it is not a valid one.

    `ndim`: the expected rank; `width`: the expected size of the last dimension (2 for
    `sample_index` `[num_samples + 1, 2]`). Never unpickles; reads regular files only.
    """
    try:
        check_regular_file(path, what="index cache file")
        array = numpy.load(path, allow_pickle=False, mmap_mode="r")
    except FileNotFoundError:
        _stale(path, "missing")
        return None
    except (ValueError, OSError, EOFError) as e:  # pickled object array, truncated, not .npy
        _stale(path, f"not a plain .npy array ({type(e).__name__}: {_first_line(e)})")
        return None
    if not isinstance(array, numpy.ndarray) or array.dtype.kind not in "iu":
        _stale(path, f"dtype {getattr(array, 'dtype', type(array).__name__)} is not an integer")
        return None
    if array.ndim != ndim or (width is not None and array.shape[-1] != width):
        _stale(path, f"shape {array.shape} is not the expected rank {ndim} index")
        return None
    return array


def check(path: str, problem: str | None) -> bool:
    """True when `problem` is None; else warn that `path` is stale because of it."""
    if problem is not None:
        _stale(path, problem)
    return problem is None


def out_of_range(array: numpy.ndarray, low: int, high: int, what: str) -> str | None:
    """Why `array` is not within [low, high), or None. One pass (min and max)."""
    if array.size == 0:
        return None
    lo, hi = int(array.min()), int(array.max())
    if lo < low or hi >= high:
        return f"{what} holds {lo if lo < low else hi}, outside [{low}, {high})"
    return None


def is_permutation(array: numpy.ndarray, n: int) -> bool:
    """True when `array` holds each of 0 .. n-1 exactly once (one pass, n bytes of memory)."""
    if array.shape != (n,):
        return False
    if n == 0:
        return True
    if out_of_range(array, 0, n, "") is not None:
        return False
    seen = numpy.zeros(n, dtype=bool)
    seen[array] = True
    return bool(seen.all())  # n values, every one of n slots hit: each exactly once


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:160] if text else "no message"


def _stale(path: str, why: str) -> None:
    logger.warning("dataset index cache %s is stale (%s); rebuilding the indices", path, why)
