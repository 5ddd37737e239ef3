"""Megatron's multi-storage-client switch: `MultiStorageClientFeature` and `maybe_msc`.

The `multistorageclient` package (object stores behind file-like calls) is optional. Where it
is absent, as on gigatron's CPU installs, the feature never counts as enabled (enable() is
remembered but `is_enabled()` stays False) and `maybe_msc` answers with the local file system:
`open` is the builtin, `os`, `Path`, `torch` are the modules, `path_isdir` is `os.path.isdir`.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["MultiStorageClientFeature", "maybe_msc"]


def _msc_package():
    """The multistorageclient module, or None when it is not installed."""
    if importlib.util.find_spec("multistorageclient") is None:
        return None
    import multistorageclient

    return multistorageclient


msc = _msc_package()


class _FeatureFlag:
    """An on/off switch that counts as on only while the package is importable."""

    def __init__(self, default: bool = False) -> None:
        self._enabled = default

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def is_enabled(self) -> bool:
        return self._enabled and msc is not None

    def import_package(self) -> Any:
        """The multistorageclient module; RuntimeError when absent or switched off."""
        if msc is None:
            raise RuntimeError(
                "multistorageclient is not installed (pip install multi-storage-client)"
            )
        if not self.is_enabled():
            raise RuntimeError("multistorageclient is installed but the MSC feature is off "
                               "(--enable-msc or MultiStorageClientFeature.enable())")  # fmt: skip
        return msc

    def __getstate__(self) -> dict:
        return {"_enabled": self._enabled}

    def __setstate__(self, state: dict) -> None:
        self._enabled = state["_enabled"]


MultiStorageClientFeature = _FeatureFlag(default=False)

_LOCAL = ("open", "os", "Path", "torch")


class MaybeMultiStorageClient:
    """File-system calls through multistorageclient when enabled, else the local ones."""

    def path_isdir(self, path, strict: bool = True) -> bool:
        """Whether `path` is an existing directory (`strict`: committed metadata only, MSC)."""
        if MultiStorageClientFeature.is_enabled():
            return MultiStorageClientFeature.import_package().os.path.isdir(path, strict=strict)
        import os

        return os.path.isdir(path)

    def __getattr__(self, name: str):
        if MultiStorageClientFeature.is_enabled():
            pkg = MultiStorageClientFeature.import_package()
            if hasattr(pkg, name):
                return getattr(pkg, name)
        if name == "open":
            import builtins

            return builtins.open
        if name in ("os", "torch"):
            return importlib.import_module(name)
        if name == "Path":
            from pathlib import Path

            return Path
        raise AttributeError(f"{type(self).__name__} has no attribute {name}")

    def __dir__(self):
        names = set(_LOCAL)
        if MultiStorageClientFeature.is_enabled():
            names.update(dir(MultiStorageClientFeature.import_package()))
        return sorted(names)


maybe_msc = MaybeMultiStorageClient()
