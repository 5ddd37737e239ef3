"""The classes checkpoints may hold, and restricted loaders (mirrors `megatron.core.safe_globals`).

- `SAFE_GLOBALS`: the classes Megatron's training checkpoints pickle (argparse.Namespace, NumPy
  arrays, the config and rerun enums, `OptimizerConfig`, ...), as far as gigatron has them.
- `register_safe_globals()`: allow them in every `torch.load(weights_only=True)` of the process.
  Megatron calls it when `megatron.core` is imported; gigatron never registers anything by
  itself (its own loads keep their allow-list local: `dist_checkpointing._safe_load`). Enum
  classes are registered through a function that returns the member, so a pickle cannot set
  state on a process-wide enum member.
- `SafeUnpickler`, `_safe_pickle_load`, `safe_numpy_load`: `pickle` / `numpy.load` restricted
  to plain containers, scalars, tensors and NumPy arrays; anything else raises
  `pickle.UnpicklingError` ("Refusing to unpickle ..."). A pickled tensor's storage is read with
  `safe_load_from_bytes` (weights-only), also when the pickle names torch's own unrestricted
  `torch.storage._load_from_bytes`.
"""

from __future__ import annotations

import collections
import enum
import io
import pickle
import threading
from argparse import Namespace
from io import BytesIO
from pathlib import PosixPath
from signal import Signals
from types import SimpleNamespace
from unittest import mock

import numpy
import torch

from gigatron.core.enums import ModelType
from gigatron.core.optimizer.optimizer_config import OptimizerConfig
from gigatron.core.rerun_state_machine import RerunDiagnostic, RerunMode, RerunState
from gigatron.core.transformer.enums import AttnBackend
from gigatron.core.untrusted_pickle import StateCheckingUnpickler

__all__ = [
    "SAFE_GLOBALS",
    "SafeUnpickler",
    "register_safe_globals",
    "safe_load_from_bytes",
    "safe_numpy_load",
]


def _numpy_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # pragma: no cover - NumPy < 2
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


# Megatron's list less its CUDA-graph enums (gigatron has no CUDA graphs).
SAFE_GLOBALS: list = [
    SimpleNamespace,
    PosixPath,
    _numpy_reconstruct(),
    numpy.ndarray,
    numpy.dtype,
    type(numpy.dtype("uint32")),
    Namespace,
    AttnBackend,
    ModelType,
    OptimizerConfig,
    RerunDiagnostic,
    RerunMode,
    RerunState,
    BytesIO,
    Signals,
    torch._C.Generator,
]


def _registrable(cls):
    """An enum class goes on torch's list as a function returning its member (same name)."""
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        return cls

    def member(*args):
        return cls(*args)

    return (member, f"{cls.__module__}.{cls.__qualname__}")


def register_safe_globals() -> None:
    """Allow `SAFE_GLOBALS` in every weights-only `torch.load` of this process."""
    torch.serialization.add_safe_globals([_registrable(c) for c in SAFE_GLOBALS])


def safe_load_from_bytes(b: bytes):
    """A pickled storage's bytes, loaded weights-only (torch's helper loads them unrestricted)."""
    return torch.load(io.BytesIO(b), weights_only=True)


class SafeUnpickler(StateCheckingUnpickler):
    """`pickle.Unpickler` for plain containers, scalars, tensors and NumPy arrays only.

    Megatron admits Transformer Engine's FP8 recipe classes too (FP8 extra state); gigatron has
    no Transformer Engine, so they are refused like any other class."""

    _SAFE_CLASSES: dict = {
        ("builtins", "dict"): dict,
        ("builtins", "list"): list,
        ("builtins", "tuple"): tuple,
        ("builtins", "int"): int,
        ("builtins", "float"): float,
        ("builtins", "bool"): bool,
        ("builtins", "bytes"): bytes,
        ("builtins", "str"): str,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch", "Size"): torch.Size,
        ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
        ("torch._tensor", "_rebuild_from_type_v2"): torch._tensor._rebuild_from_type_v2,
        ("torch.storage", "UntypedStorage"): torch.storage.UntypedStorage,
        ("torch.storage", "_load_from_bytes"): safe_load_from_bytes,
        ("megatron.core.safe_globals", "safe_load_from_bytes"): safe_load_from_bytes,
        ("gigatron.core.safe_globals", "safe_load_from_bytes"): safe_load_from_bytes,
        ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct(),
        ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct(),
        ("numpy", "ndarray"): numpy.ndarray,
        ("numpy", "dtype"): numpy.dtype,
    }

    def find_class(self, module: str, name: str):
        found = self._SAFE_CLASSES.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"Refusing to unpickle disallowed class '{module}.{name}' (SafeUnpickler admits "
                "containers, scalars, tensors and NumPy arrays only)"
            )
        return found


def _safe_pickle_load(file, **kwargs):
    """`pickle.load` through `SafeUnpickler`."""
    return SafeUnpickler(file, **kwargs).load()


_pickle_patch_lock = threading.Lock()


def safe_numpy_load(path, **kwargs):
    """`numpy.load` whose pickled contents (`allow_pickle=True`) go through `SafeUnpickler`.

    `pickle.load` is replaced while NumPy reads (one caller at a time), then restored. An `.npz`
    archive read with `allow_pickle=True` comes back as a dict of its arrays, all read under the
    patch (NumPy's lazy archive would unpickle them later, unrestricted)."""
    with _pickle_patch_lock, mock.patch("pickle.load", _safe_pickle_load):
        loaded = numpy.load(path, **kwargs)
        if isinstance(loaded, numpy.lib.npyio.NpzFile) and kwargs.get("allow_pickle"):
            with loaded:
                return {name: loaded[name] for name in loaded.files}
        return loaded
