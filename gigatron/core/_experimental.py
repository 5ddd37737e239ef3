"""Megatron's experimental-API decorators (`megatron.core.utils.experimental_fn` / `_cls`).

A decorated function or class raises `ExperimentalNotEnabledError` unless
`gigatron.core.config.ENABLE_EXPERIMENTAL` is set (read at each call); the first use of each
logs one line on rank 0. `cls.is_experimental` (on the class or an instance) answers the flag
without raising. Megatron also warns when the API outlived three minor versions of Megatron
Core; gigatron's version numbers are not Megatron's, so `introduced_with_version` is recorded
only (`__experimental_since__`).
"""

from __future__ import annotations

import functools
import logging

from gigatron.core import config
from gigatron.core._rank_utils import log_single_rank

logger = logging.getLogger("gigatron.core.utils")  # Megatron logs under its utils module
_ENABLED_MSG = "ENABLE_EXPERIMENTAL is True, running experimental code."


class ExperimentalNotEnabledError(Exception):
    """Experimental code called while ENABLE_EXPERIMENTAL is not set."""


def _check(name: str, logged: set) -> None:
    if config.is_experimental_enabled() is not True:
        raise ExperimentalNotEnabledError(
            f"{name} is experimental: set config.ENABLE_EXPERIMENTAL (--enable-experimental)"
        )
    if name not in logged:
        logged.add(name)
        log_single_rank(logger, logging.INFO, _ENABLED_MSG)


def experimental_fn(introduced_with_version: str):
    """Decorator: the function runs only with ENABLE_EXPERIMENTAL set."""
    logged: set = set()

    def wrap(func):
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            _check(func.__name__, logged)
            return func(*args, **kwargs)

        wrapped.__experimental_since__ = introduced_with_version
        return wrapped

    return wrap


def experimental_cls(introduced_with_version: str):
    """Decorator: the class (its attributes, instances and theirs) usable only with
    ENABLE_EXPERIMENTAL set; `is_experimental` reports the flag."""
    logged: set = set()

    def wrap(cls):
        name = cls.__name__

        def guarded(get):
            def __getattribute__(self, attr):
                if attr == "is_experimental":
                    return config.is_experimental_enabled()
                _check(name, logged)
                return get(self, attr)

            return __getattribute__

        def __call__(self, *args, **kwargs):
            _check(name, logged)
            return type(cls).__call__(self, *args, **kwargs)

        meta_ns = {"__getattribute__": guarded(type(cls).__getattribute__), "__call__": __call__}
        meta = type(cls.__qualname__, (type(cls),), meta_ns)
        namespace = {
            "__getattribute__": guarded(cls.__getattribute__),
            "__qualname__": cls.__qualname__,
            "__module__": cls.__module__,
            "__doc__": cls.__doc__,
            "__experimental_since__": introduced_with_version,
        }
        return meta(name, (cls,), namespace)

    return wrap
