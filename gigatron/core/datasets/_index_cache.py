"""The on-disk cache of dataset indices (`--data-cache-path`), read as untrusted files.

The cached arrays are plain integers (document, sample, shuffle and blend indices), so they are
written and read with `allow_pickle=False`: a pickled object planted as a cached `.npy` never runs.
A cache file that does not load as the integer array expected (pickled, truncated, wrong dtype or
rank, or a description that is not this dataset's) is stale: the caller rebuilds the indices and a
warning names the file. Files are written to a temporary name and renamed into place, so a reader
on another rank sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import logging
import os

import numpy

logger = logging.getLogger(__name__)

__all__ = ["load_index", "save_index", "save_description", "description_matches"]


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


def description_matches(path: str, description: str) -> bool:
    """True when the cached description is this dataset's; warns (naming the file) if not."""
    try:
        with open(path) as f:
            found = f.read()
    except (OSError, UnicodeDecodeError) as e:
        _stale(path, f"unreadable ({type(e).__name__})")
        return False
    if found != description:
        _stale(path, "it describes another dataset")
        return False
    return True


def load_index(path: str, *, ndim: int, width: int | None = None) -> numpy.ndarray | None:
    """The cached integer array at `path` (memory-mapped), or None if it is not a valid one.

    `ndim`: the expected rank; `width`: the expected size of the last dimension (2 for
    `sample_index` `[num_samples + 1, 2]`). Never unpickles.
    """
    if not os.path.isfile(path):
        _stale(path, "missing")
        return None
    try:
        array = numpy.load(path, allow_pickle=False, mmap_mode="r")
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


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:160] if text else "no message"


def _stale(path: str, why: str) -> None:
    logger.warning("dataset index cache %s is stale (%s); rebuilding the indices", path, why)
