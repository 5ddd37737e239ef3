"""Module specs: describe a module tree as data, build it later.

Mirrors `megatron.core.transformer.spec_utils`. A `ModuleSpec` names a class (or a function, or a
lazily imported `(module_path, name)` tuple), constructor params and the submodules spec handed to
it; `build_module` instantiates it with `*args, **spec.params, **kwargs` (+ `submodules=`).
"""

from __future__ import annotations

import functools
import importlib
import types
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModuleSpec:
    """What to build: `module` (class, function or (path, name)), its `params` and `submodules`."""

    module: tuple | type | types.FunctionType
    params: dict = field(default_factory=dict)
    submodules: object = None
    metainfo: dict = field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return build_module(self, *args, **kwargs)


def import_module(module_path: tuple[str, str]):
    """Import `name` from `base_path` given as a `(base_path, name)` tuple.

    ImportError (Megatron's type) naming the module when it does not import, or naming the
    spec and module when the module has no such attribute."""
    base_path, name = module_path
    try:
        module = importlib.import_module(base_path)
    except ImportError as err:
        raise ImportError(f"Could not import module {base_path!r}: {err}") from err
    try:
        return getattr(module, name)
    except AttributeError as err:
        raise ImportError(f"Could not find spec {name!r} in module {base_path!r}") from err


def get_module(spec_or_module, **additional_kwargs):
    """The class/function a spec refers to (imported if given as a path tuple)."""
    if isinstance(spec_or_module, (type, types.FunctionType)):
        return spec_or_module
    if isinstance(spec_or_module.module, (type, types.FunctionType)):
        return spec_or_module.module
    return import_module(spec_or_module.module)


def get_submodules(spec):
    """The `submodules` of a `functools.partial(..., submodules=...)`, a ModuleSpec or any object
    with that attribute; ValueError for anything else (megatron-core 0.19's rule)."""
    if isinstance(spec, functools.partial):
        return spec.keywords["submodules"]
    if hasattr(spec, "submodules"):
        return spec.submodules
    raise ValueError(f"Could not find `submodules` in the provided spec: {spec!r}")


def build_module(spec_or_module, *args, **kwargs):
    """Instantiate a spec; functions (e.g. bias-dropout-add factories) are returned uncalled."""
    if isinstance(spec_or_module, types.FunctionType):
        return spec_or_module
    if isinstance(spec_or_module, ModuleSpec) and isinstance(
        spec_or_module.module, types.FunctionType
    ):
        return spec_or_module.module
    if isinstance(spec_or_module, (type, functools.partial)):
        module = spec_or_module
    elif isinstance(getattr(spec_or_module, "module", None), type):
        module = spec_or_module.module
    else:
        module = import_module(spec_or_module.module)
    if isinstance(module, types.FunctionType):
        return module
    submodules = getattr(spec_or_module, "submodules", None)
    if submodules is not None:
        kwargs["submodules"] = submodules
    params = getattr(spec_or_module, "params", {}) or {}
    try:
        return module(*args, **params, **kwargs)
    except Exception as e:
        name = getattr(module, "__name__", repr(module))
        raise type(e)(f"{e} when instantiating {name}").with_traceback(e.__traceback__) from None
