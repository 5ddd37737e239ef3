"""Loading without unrestricted unpickling.

Every pickle a checkpoint holds is read through an allow-list: `torch.load(weights_only=True)`
plus a few plain classes that training checkpoints legitimately contain (argparse.Namespace for
`args`, NumPy arrays inside RNG states, pathlib paths), and DCP's `.metadata` through a
restricted `pickle.Unpickler` that only builds DCP's own metadata classes. A payload naming any
other global (e.g. `os.system`) is rejected before anything runs.

Mirrors the intent of `megatron.core.safe_globals` (which registers the same kind of list
process-wide); gigatron keeps the list local to its own loads instead.
"""

from __future__ import annotations

import argparse
import io
import pathlib
import pickle
import types

import numpy as np
import torch

from gigatron.core.dist_checkpointing.core import CheckpointingException

__all__ = ["SAFE_GLOBALS", "add_safe_globals", "restricted_pickle_load", "safe_torch_load"]


def _numpy_globals() -> list:
    out = [np.ndarray, np.dtype]
    try:  # NumPy >= 1.25 keeps the reconstructor in numpy._core / numpy.core
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # pragma: no cover
        from numpy.core.multiarray import _reconstruct
    out.append(_reconstruct)
    out += [type(np.dtype(t)) for t in ("uint32", "int64", "float64", "float32", "bool")]
    return out


SAFE_GLOBALS: list = [
    argparse.Namespace,
    types.SimpleNamespace,
    pathlib.PosixPath,
    pathlib.PurePosixPath,
    io.BytesIO,
    *_numpy_globals(),
]


def add_safe_globals(classes: list) -> None:
    """Allow more classes (e.g. your own enums) in checkpoint payloads."""
    SAFE_GLOBALS.extend(c for c in classes if c not in SAFE_GLOBALS)


def safe_torch_load(f, *, what: str) -> object:
    """`torch.load(f, weights_only=True)` with SAFE_GLOBALS allowed; clear error otherwise."""
    # Only add what is not registered yet: leaving the context removes what it added, and must
    # not unregister globals other libraries (e.g. megatron-core) registered process-wide.
    registered = torch.serialization.get_safe_globals()
    extra = [g for g in SAFE_GLOBALS if g not in registered]
    try:
        with torch.serialization.safe_globals(extra):
            return torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointingException(
            f"refusing to load {what}: its pickle needs a global outside the allow-list "
            f"(add trusted classes with dist_checkpointing.add_safe_globals): {e}"
        ) from e
    except (EOFError, RuntimeError) as e:
        raise CheckpointingException(f"{what} is damaged or truncated: {e}") from e


# DCP's `.metadata` is a plain pickle of these dataclasses.
_METADATA_ALLOWED_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint._extension",
)
_METADATA_ALLOWED = {
    ("torch", "Size"),
    ("torch", "device"),
    ("collections", "OrderedDict"),
    ("builtins", "slice"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("pathlib", "PosixPath"),
    ("torch.serialization", "_get_layout"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module.startswith(_METADATA_ALLOWED_MODULES) or (module, name) in _METADATA_ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        ):
            return getattr(torch, name)
        if module.startswith("megatron.core.dist_checkpointing") and name.startswith("MCore"):
            return _Placeholder  # megatron-core's empty marker classes (MCoreMetadata, ...)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is forbidden in DCP metadata")


class _Placeholder:
    """Stands in for megatron-core's data-less marker classes found in its `.metadata`."""


def restricted_pickle_load(f, *, what: str) -> object:
    """Unpickle DCP metadata allowing only DCP metadata classes, torch sizes and dtypes."""
    try:
        return _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as e:
        raise CheckpointingException(f"refusing to load {what}: {e}") from e
    except (EOFError, AttributeError, ValueError) as e:
        raise CheckpointingException(f"{what} is damaged or truncated: {e}") from e
