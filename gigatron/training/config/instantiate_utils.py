"""Building objects from `_target_` configs (Megatron 0.20's `instantiate`), for untrusted files.

A config is plain data: a dict with `_target_` (a dotted name, or a class / function) is built by
calling the target with the dict's other keys as keyword arguments (each built first), `_args_`
as positional arguments; `_partial_: true` gives a `functools.partial` instead of the call,
`_call_: false` the target itself. Lists and dicts without `_target_` are built item by item.
OmegaConf configs are taken too, and `${...}` interpolations resolve through OmegaConf (the one
feature that needs it installed; gigatron does not otherwise).

What a config may name (`target_allowlist`, Megatron's names and prefixes) is checked before
anything is imported. gigatron then checks what a name admitted by a default prefix resolved to,
since those prefixes cover callables that read files or run code (`torch.load`,
`torch.hub.load`): such a target is **called** only if it is a dataclass or Enum class (the
configs, with `functools.partial` over one of those or a `torch.nn.init` / `torch.nn.functional`
function); it is **named** (`_call_: false`) only if it is a class, a function, a torch dtype or
an Enum member. Prefixes and exact names a program adds, and `target_allowlist.disable()`, are
that program's own decision and skip the kind check. Every refusal is one line naming the target
and its key.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import inspect
import logging
import types
from collections.abc import Callable, Sequence
from typing import Any

from gigatron.training._target_allowlist import (  # noqa: F401  (Megatron's names here)
    _DEFAULT_ALLOWED_EXACT,
    _DEFAULT_ALLOWED_PREFIXES,
    TargetAllowlist,
    target_allowlist,
)

logger = logging.getLogger(__name__)

MISSING = "???"
"""OmegaConf's value for a mandatory key left unset (skipped when building a partial)."""


class InstantiationException(Exception):
    """A config that cannot be built: bad keys, a refused or unknown target, a failing call."""


class InstantiationMode(enum.Enum):
    """STRICT: config keys the target does not take raise; LENIENT: they are dropped with a
    warning."""

    STRICT = "strict"
    LENIENT = "lenient"


class _Keys(enum.StrEnum):
    """The keys `instantiate` reads itself."""

    TARGET = "_target_"
    PARTIAL = "_partial_"
    CALL = "_call_"
    ARGS = "_args_"
    NAME = "_name_"


_PARTIAL_FUNCTION_MODULES = ("torch.nn.init", "torch.nn.functional")
"""Modules whose functions a config may wrap in a partial (init methods, activations)."""


def _where(full_key: str) -> str:
    return f"; full_key: {full_key}" if full_key else ""


# ---------------------------------------------------------------- input


def _omegaconf():
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return None
    return OmegaConf


def _is_omegaconf(x: Any) -> bool:
    oc = _omegaconf()
    return oc is not None and oc.is_config(x)


def _has_interpolation(x: Any) -> bool:
    if isinstance(x, str):
        return "${" in x
    if isinstance(x, dict):
        return any(_has_interpolation(v) for v in x.values())
    if isinstance(x, list):
        return any(_has_interpolation(v) for v in x)
    return False


def _plain(config: Any) -> Any:
    """`config` as plain dicts / lists, OmegaConf nodes converted and interpolations resolved
    (missing values stay MISSING)."""
    oc = _omegaconf()
    if _is_omegaconf(config):
        return oc.to_container(config, resolve=True, throw_on_missing=False)
    if _has_interpolation(config):
        if oc is None:
            raise ImportError(
                "this config has ${...} interpolations, which need omegaconf: pip install omegaconf"
            )
        node = oc.create(config, flags={"allow_objects": True})
        return oc.to_container(node, resolve=True, throw_on_missing=False)
    return config


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _prepare_input_dict_or_list(d: dict | list) -> Any:
    """A copy of `d` with every `_target_` given as a class or function turned into its name."""
    if isinstance(d, dict):
        return {
            k: _convert_target_to_string(v)
            if k == _Keys.TARGET
            else _prepare_input_dict_or_list(v)
            if isinstance(v, (dict, list))
            else v
            for k, v in d.items()
        }
    if isinstance(d, list):
        return [_prepare_input_dict_or_list(v) if isinstance(v, (dict, list)) else v for v in d]
    raise InstantiationException(f"Expected a dict or list, got {type(d).__name__}")


# ---------------------------------------------------------------- building


def instantiate(
    config: Any, *args: Any, mode: InstantiationMode = InstantiationMode.LENIENT, **kwargs: Any
) -> Any:
    """The object `config` describes (see the module doc); `args` replace its `_args_`, `kwargs`
    are merged over its keys. None for None."""
    if config is None:
        return None
    if dataclasses.is_dataclass(config) and not _is_omegaconf(config):
        config = dataclasses.asdict(config) if not isinstance(config, type) else None
        if config is None:
            raise InstantiationException("Cannot instantiate a dataclass type; pass an instance")
    if isinstance(config, (dict, list)):
        config = _prepare_input_dict_or_list(config)
    kwargs = _prepare_input_dict_or_list(kwargs)
    if not (isinstance(config, (dict, list)) or _is_omegaconf(config)):
        raise InstantiationException(
            f"Cannot instantiate config of type {type(config).__name__}: the top level must be "
            "a dict or list (or an OmegaConf DictConfig / ListConfig)"
        )
    config = _plain(copy.deepcopy(config))
    if isinstance(config, dict):
        if kwargs:
            config = _merge(config, _plain(kwargs))
        partial = config.pop(_Keys.PARTIAL.value, False)
        return _build(config, args, partial, mode, "")
    if kwargs.pop(_Keys.PARTIAL.value, False):
        raise InstantiationException(
            "The _partial_ keyword is not compatible with top-level list instantiation"
        )
    return _build(config, args, False, mode, "")


def instantiate_node(
    node: Any,
    *args: Any,
    partial: bool = False,
    mode: InstantiationMode = InstantiationMode.LENIENT,
) -> Any:
    """One node of an OmegaConf config built (a value that is not a config node comes back as
    it is, as in Megatron)."""
    if node is None:
        return None
    if not _is_omegaconf(node):
        return node
    if _omegaconf().is_dict(node) and node._is_none():
        return None
    full_key = node._get_full_key(None) or ""
    plain = _omegaconf().to_container(node, resolve=True, throw_on_missing=False)
    return _build(plain, args, partial, mode, str(full_key))


def _child_key(parent: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def _build(node: Any, args: tuple, partial: Any, mode: InstantiationMode, full_key: str) -> Any:
    if isinstance(node, dict):
        partial = node.get(_Keys.PARTIAL.value, partial)
    if not isinstance(partial, bool):
        raise TypeError(
            f"Instantiation: _partial_ flag must be a bool, got {type(partial)}{_where(full_key)}"
        )
    if isinstance(node, list):
        return [_build(v, (), False, mode, _child_key(full_key, i)) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if not _is_target(node):
        return {k: _build(v, (), False, mode, _child_key(full_key, k)) for k, v in node.items()}
    call = node.get(_Keys.CALL.value, True)
    target = _resolve_target(node[_Keys.TARGET.value], full_key, check_callable=call,
                             partial=partial)  # fmt: skip
    if not call:
        extra = set(node) - {_Keys.TARGET.value, _Keys.CALL.value}
        if extra:
            raise InstantiationException(
                f"_call_ was set to False for target {_convert_target_to_string(target)}, but "
                f"extra keys were found: {sorted(extra)}{_where(full_key)}"
            )
        return target
    reserved = {k.value for k in _Keys if k != _Keys.ARGS}
    kwargs = {}
    for key, value in node.items():
        missing = isinstance(value, str) and value == MISSING
        if key in reserved or (partial and missing):
            continue
        if missing:
            raise InstantiationException(
                f"Missing mandatory value for key '{key}'{_where(_child_key(full_key, key))}"
            )
        kwargs[key] = _build(value, (), False, mode, _child_key(full_key, key))
    kwargs = _filter_kwargs_for_target(target, kwargs, full_key, mode)
    if target is functools.partial and not target_allowlist.is_vouched_for("functools.partial"):
        wrapped = (list(args) or list(kwargs.get(_Keys.ARGS.value) or ()) or [None])[0]
        name = _convert_target_to_string(wrapped)
        if not (isinstance(name, str) and target_allowlist.is_vouched_for(name)):
            _check_kind(name, wrapped, "partial", _child_key(full_key, "_args_[0]"))
    return _call_target(target, partial, args, kwargs, full_key)


def _is_target(x: Any) -> bool:
    if isinstance(x, dict) or _is_omegaconf(x) and _omegaconf().is_dict(x):
        return _Keys.TARGET.value in x
    return False


def _call_target(
    _target_: Callable, _partial_: bool, args: tuple, kwargs: dict, full_key: str
) -> Any:
    """`_target_(*args, **kwargs)` (or its partial), a failure as InstantiationException."""
    args, kwargs = _extract_pos_args(args, kwargs)
    name = _convert_target_to_string(_target_)
    if _partial_:
        try:
            return functools.partial(_target_, *args, **kwargs)
        except Exception as e:
            raise InstantiationException(
                f"Error in creating partial({name}, ...) object: {e!r}{_where(full_key)}"
            ) from e
    try:
        return _target_(*args, **kwargs)
    except Exception as e:
        raise InstantiationException(
            f"Error in call to target '{name}': {e!r}{_where(full_key)}"
        ) from e


def _convert_target_to_string(t: Any) -> Any:
    return f"{t.__module__}.{t.__qualname__}" if callable(t) else t


def _filter_kwargs_for_target(
    target: Callable | type, kwargs: dict, full_key: str, mode: InstantiationMode
) -> dict:
    """`kwargs` less the keys `target`'s signature does not take (all kept for **kwargs or an
    uninspectable signature): dropped with a warning (LENIENT) or refused (STRICT)."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    takes = {
        n for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }  # fmt: skip
    unexpected = sorted(set(kwargs) - takes - {_Keys.ARGS.value})
    if not unexpected:
        return kwargs
    name = _convert_target_to_string(target)
    if mode == InstantiationMode.STRICT:
        raise InstantiationException(
            f"Unexpected config keys for target '{name}': {unexpected}{_where(full_key)}"
        )
    logger.warning(f"Dropping unexpected config keys for target '{name}': {unexpected}"
                   f"{_where(full_key)}")  # fmt: skip
    return {k: v for k, v in kwargs.items() if k not in unexpected}


def _extract_pos_args(input_args: Any, kwargs: dict) -> tuple[Any, dict]:
    """(positional args, the other kwargs): the call's args if any, else the config's `_args_`."""
    config_args = kwargs.pop(_Keys.ARGS.value, ())
    if not isinstance(config_args, Sequence) or isinstance(config_args, str):
        raise InstantiationException(
            f"Unsupported _args_ type: '{type(config_args).__name__}'. value: '{config_args}'"
        )
    return (input_args if len(input_args) > 0 else config_args), kwargs


def _convert_node(node: Any) -> Any:
    """An OmegaConf node as plain containers (anything else as it is)."""
    if _is_omegaconf(node):
        return _omegaconf().to_container(node, resolve=True)
    return node


# ---------------------------------------------------------------- targets


def _locate(path: str) -> Any:
    """The object a dotted path names, importing the longest module prefix that exists."""
    if path == "":
        raise ImportError("Empty path")
    from importlib import import_module

    parts = path.split(".")
    if any(not p for p in parts):
        raise ValueError(
            f"Error loading '{path}': invalid dotstring. Relative imports are not supported."
        )
    for i in range(len(parts), 0, -1):
        module_path = ".".join(parts[:i])
        try:
            obj = import_module(module_path)
        except ModuleNotFoundError:
            continue
        except Exception as e:
            raise ImportError(f"Error loading '{path}': {e!r}") from e
        for part in parts[i:]:
            try:
                obj = getattr(obj, part)
            except AttributeError as e:
                raise ImportError(
                    f"Error loading '{path}': {e!r}. Are you sure that '{part}' is an "
                    f"attribute of '{module_path}'?"
                ) from e
        return obj
    raise ImportError(
        f"Error loading '{path}': Unable to import any module in the path. Are you sure that "
        f"module '{parts[0]}' is installed?"
    )


def _kind_ok(obj: Any, use: str) -> bool:
    config_class = isinstance(obj, type) and (
        dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)
    )
    if use == "call":
        return config_class or obj is functools.partial
    if use == "partial":
        return config_class or (
            isinstance(obj, (types.FunctionType, types.BuiltinFunctionType))
            and (getattr(obj, "__module__", None) or "").startswith(_PARTIAL_FUNCTION_MODULES)
        )
    import torch

    return isinstance(
        obj, (type, types.FunctionType, types.BuiltinFunctionType, torch.dtype, enum.Enum)
    )


def _check_kind(name: Any, obj: Any, use: str, full_key: str) -> None:
    """Refuses a default-prefix target that is not a config value of the kind `use` needs."""
    if _kind_ok(obj, use):
        return
    rule = {
        "call": "a dataclass or Enum class",
        "partial": "a dataclass or Enum class, or a torch.nn.init / torch.nn.functional function",
        "name": "a class, a function, a torch dtype or an Enum member",
    }[use]
    what = {"call": "called", "partial": "wrapped in a partial", "name": "named"}[use]
    raise InstantiationException(
        f"Target '{name}' ({type(obj).__name__}) may not be {what} from a config: gigatron "
        f"builds only {rule} there{_where(full_key)} (a program that trusts it can call "
        f"target_allowlist.add_exact('{name}'))"
    )


def _resolve_target(
    target: str | type | Callable,
    full_key: str,
    check_callable: bool = True,
    *,
    partial: bool = False,
) -> Any:
    """The object `target` names: allowlist first, then import, then (for names admitted by a
    default prefix) gigatron's kind check; `check_callable` refuses a non-callable."""
    if isinstance(target, str):
        if not target_allowlist.is_allowed(target):
            raise InstantiationException(
                f"Target '{target}' is not in the allowlist for _target_ instantiation"
                f"{_where(full_key)} (allowed module prefixes: "
                f"{', '.join(target_allowlist.allowed_prefixes)}; exact targets: "
                f"{', '.join(sorted(target_allowlist.allowed_exact))}; a program that trusts "
                f"it can call target_allowlist.add_prefix('{target.rsplit('.', 1)[0]}.') or "
                f"target_allowlist.add_exact('{target}'))"
            )
        name = target
        try:
            target = _locate(target)
        except Exception as e:
            raise InstantiationException(
                f"Error locating target '{name}': {e}{_where(full_key)}"
            ) from e
        if not target_allowlist.is_vouched_for(name):
            use = "name" if not check_callable else "partial" if partial else "call"
            _check_kind(name, target, use, full_key)
    if check_callable and not callable(target):
        raise InstantiationException(
            f"Expected a callable target, got '{target}' of type '{type(target).__name__}'"
            f"{_where(full_key)}"
        )
    return target
