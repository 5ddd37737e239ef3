"""Reading configs written by older versions (Megatron 0.20's `config.utils`)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)


def sanitize_dataclass_config(config: Any, _visited: set | None = None) -> Any:
    """`config` (a `_target_` dict) without the keys its target dataclass computes itself
    (`init=False` fields, which older versions wrote out), nested dicts and lists too."""
    if not isinstance(config, dict):
        return config
    _visited = set() if _visited is None else _visited
    if id(config) in _visited:
        return config
    _visited.add(id(config))
    target = config.get("_target_")
    cls = _resolve_target_class(target) if isinstance(target, str) else None
    computed = _get_init_false_fields(cls) if cls is not None else frozenset()
    out = {}
    for key, value in config.items():
        if key in computed:
            logger.debug(f"dropping {cls.__name__}.{key} (init=False) from a saved config")
            continue
        if isinstance(value, dict):
            value = sanitize_dataclass_config(value, _visited)
        elif isinstance(value, list):
            value = [sanitize_dataclass_config(v, _visited) for v in value]
        out[key] = value
    return out


def _resolve_target_class(target: str) -> type | None:
    """The object `target` ("module.Name") names, or None when the allowlist refuses it or it
    does not import (with a warning)."""
    from gigatron.training.config.instantiate_utils import target_allowlist

    if not target_allowlist.is_allowed(target):
        logger.warning(f"Target '{target}' is not in the allowlist; not resolved")
        return None
    try:
        module_path, name = target.rsplit(".", 1)
        return getattr(importlib.import_module(module_path), name, None)
    except (ValueError, ImportError, AttributeError) as e:
        logger.warning(f"Could not resolve target '{target}': {e}")
        return None


@lru_cache(maxsize=128)
def _get_init_false_fields(target_class: type) -> frozenset[str]:
    """Names of `target_class`'s `init=False` fields (empty for a non-dataclass)."""
    if not dataclasses.is_dataclass(target_class):
        return frozenset()
    return frozenset(f.name for f in dataclasses.fields(target_class) if not f.init)
