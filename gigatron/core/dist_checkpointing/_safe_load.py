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
import dataclasses
import enum
import importlib
import io
import pathlib
import pickle
import types

import numpy as np
import torch

from gigatron.core.dist_checkpointing.core import CheckpointingException, DamagedCheckpointError
from gigatron.core.untrusted_pickle import StateCheckingUnpickler

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
    """`torch.load(f, weights_only=True)` with SAFE_GLOBALS allowed; clear error otherwise.

    Raises CheckpointingException naming `what`: "refusing" for a pickle that names a global
    outside the allow-list, "damaged" for anything else that does not load (truncated, empty,
    not a torch file).
    """
    # Only add what is not registered yet: leaving the context removes what it added, and must
    # not unregister globals other libraries (e.g. megatron-core) registered process-wide.
    registered = torch.serialization.get_safe_globals()
    extra = [_torch_safe_global(g) for g in SAFE_GLOBALS if g not in registered]
    try:
        with torch.serialization.safe_globals(extra):
            return torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointingException(
            f"refusing to load {what}: {_weights_only_reason(e)} (the allow-list admits tensors, "
            "plain containers and scalars, argparse.Namespace, NumPy arrays; add trusted classes "
            "with dist_checkpointing.add_safe_globals)"
        ) from None
    except Exception as e:  # truncated zip, empty file, bad seek, torn record, ...
        raise DamagedCheckpointError(
            f"{what} is damaged (truncated or not a torch file): {type(e).__name__}: "
            f"{_first_line(e)}"
        ) from None


def _torch_safe_global(g):
    """An enum class is allowed through a function that calls it, under the class's name.

    torch's weights-only unpickler lets BUILD set state on any object whose type is allowed;
    an enum's members are process-wide singletons (`Color(1)` returns the one member), so with
    the class itself allowed a pickle could rename or revalue a member for the whole process.
    Calling the function still returns the member; its type is no longer on the list, so BUILD
    on it is refused."""
    if not (isinstance(g, type) and issubclass(g, enum.Enum)):
        return g

    def member(*args):
        return g(*args)

    return (member, f"{g.__module__}.{g.__qualname__}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else "(no message)"


def _weights_only_reason(e: pickle.UnpicklingError) -> str:
    """The line of torch's weights-only error that says what was refused, without torch's
    advice to retry with the unrestricted loader (which would run the payload)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("Unsupported global", "Unsupported operand", "Unsupported class")):
            return ln
    for ln in lines:
        if "WeightsUnpickler error:" in ln:
            return ln.split("WeightsUnpickler error:", 1)[1].strip() or "unsupported content"
    return "its pickle holds content outside the allow-list"


# DCP's `.metadata` is a plain pickle of these dataclasses and enums. Exact (module, name) pairs:
# a prefix or module-wide rule would let a protocol-4 pickle name a dotted attribute inside an
# allowed module (`torch.distributed.checkpoint.filesystem` + `os.system` reaches os.system).
_DCP = "torch.distributed.checkpoint"
_METADATA_ALLOWED = frozenset(
    {
        *((f"{_DCP}.metadata", n) for n in (
            "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
            "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING",
        )),
        *((f"{_DCP}.filesystem", n) for n in (
            "_StorageInfo", "_StoragePrefix", "SerializationFormat",
        )),
        *((f"{_DCP}.planner", n) for n in (
            "SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData",
            "LoadPlan", "ReadItem", "LoadItemType",
        )),
        ("torch", "Size"),
        ("torch", "device"),
        ("torch.serialization", "_get_layout"),  # maps a layout's name to the torch.layout
        ("collections", "OrderedDict"),
        ("builtins", "slice"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib._local", "PosixPath"),  # Python >= 3.13 spelling
        ("pathlib._local", "PurePosixPath"),
    }
)  # fmt: skip


class _MetadataUnpickler(StateCheckingUnpickler):
    """Builds only the allow-listed globals; never imports a module the list does not name.
    BUILD sets state only on DCP data objects this load created (never on a class, a function
    or an enum member, which would change them for the whole process)."""

    def may_set_state(self, obj, state) -> bool:
        if type(obj) not in _METADATA_CLASSES and type(obj) is not _Placeholder:
            return False
        # the (dict, slots) form would `setattr` through the class's descriptors
        return isinstance(state, dict) or hasattr(type(obj), "__setstate__")

    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and name.isidentifier():
            # vars(): a plain lookup (no lazy import); only values, never callables
            value = vars(torch).get(name)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        if (
            module.startswith("megatron.core.dist_checkpointing")
            and name.isidentifier()
            and name.startswith("MCore")
        ):
            return _Placeholder  # megatron-core's data-less marker classes (MCoreMetadata, ...)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is forbidden in DCP metadata")


def _metadata_classes() -> frozenset:
    """The DCP dataclasses of the allow-list (the only objects BUILD may set state on)."""
    out = set()
    for module, name in _METADATA_ALLOWED:
        if module.startswith(_DCP):
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type) and dataclasses.is_dataclass(obj):
                out.add(obj)
    return frozenset(out)


_METADATA_CLASSES = _metadata_classes()


class _Placeholder:
    """Stands in for megatron-core's data-less marker classes found in its `.metadata`."""


def restricted_pickle_load(f, *, what: str) -> object:
    """Unpickle DCP metadata allowing only DCP metadata classes, torch sizes and dtypes."""
    try:
        return _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as e:
        if "forbidden" in str(e):
            raise DamagedCheckpointError(f"refusing to load {what}: {e}") from None
        raise DamagedCheckpointError(f"{what} is damaged: {e}") from None
    except Exception as e:  # truncated / torn / hand-built: never a traceback from pickle
        raise DamagedCheckpointError(
            f"{what} is damaged (truncated or not DCP metadata): {type(e).__name__}: "
            f"{_first_line(e)}"
        ) from None
