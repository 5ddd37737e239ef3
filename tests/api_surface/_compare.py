"""The comparator of the API-surface audit (tests/api_surface/test_names_and_signatures.py).

A Megatron symbol is first described, from the installed megatron-core (`describe_live`, through
`inspect`) or from a vendored source table (`describe_entry`, written by
scripts/megatron_signatures.py), as one of

    ("enum", {member: value})
    ("dataclass", {field: default}, {field: default declared by a dataclass base})
    ("callable", [inspect.Parameter, ...])
    ("other",)

and `compare_described` checks gigatron's live object against that description: parameter names,
the order of positional parameters, kinds and defaults; every dataclass field and its default;
enum members and values. Each difference is one issue key, e.g.
`parallel_state:initialize_model_parallel(use_sharp): missing`.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import math
import warnings

import torch

_EMPTY = inspect.Parameter.empty
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VAR = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def resolve(root: str, symbol: str):
    """`root` is "megatron.core" or "gigatron.core"; `symbol` is "module.path:Qual.name"."""
    module_name, _, qualname = symbol.partition(":")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            obj = importlib.import_module(f"{root}.{module_name}" if module_name else root)
        except ImportError:
            return None
        for part in qualname.split("."):
            obj = (
                inspect.getattr_static(obj, part, None)
                if inspect.isclass(obj)
                else (getattr(obj, part, None))
            )
            if isinstance(obj, staticmethod | classmethod):
                obj = obj.__func__
            if obj is None:
                return None
    return obj


# ---------------------------------------------------------------- values
class Normalized:
    """A default already in `_norm` form (decoded from the source table); repr: its source."""

    def __init__(self, value, source: str):
        self.value, self.source = value, source

    def __repr__(self) -> str:
        return self.source


def _norm(value):
    """A comparable stand-in for a default value that may be a Megatron or gigatron object."""
    if isinstance(value, Normalized):
        return value.value
    if isinstance(value, enum.Enum):
        return ("enum", type(value).__name__, value.name)
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    if isinstance(value, torch.dtype):
        return value
    if inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value):
        return ("callable", getattr(value, "__name__", repr(value)))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_norm(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _norm(v)) for k, v in value.items())))
    if dataclasses.is_dataclass(value) and not inspect.isclass(value):
        return (type(value).__name__, _norm(dataclasses.asdict(value)))
    return value


def same(a, b) -> bool:
    try:
        return bool(_norm(a) == _norm(b))
    except Exception:
        return repr(a) == repr(b)


def decode(encoded: dict | None):
    """A table default ({tag: payload}, see scripts/megatron_signatures.py) as a `Normalized`."""
    if encoded is None:
        return _EMPTY
    ((tag, payload),) = encoded.items()
    if tag == "literal":
        return Normalized(_norm(ast.literal_eval(payload)), payload)
    if tag == "float":
        return Normalized(_norm(float(payload)), f"float({payload!r})")
    if tag == "enum":
        return Normalized(("enum", *payload), ".".join(payload))
    if tag == "callable":
        return Normalized(("callable", payload), payload)
    if tag == "external":
        return Normalized(_external(payload), payload)
    return Normalized((tag, repr(payload)), f"<{tag} {payload}>")  # never equal to a value


def _external(dotted: str):
    """`torch.float32`, `torch.nn.functional.gelu`, `numpy.int32`: import and normalise."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                obj = getattr(obj, part)
        except AttributeError:
            break
        return _norm(obj)
    return ("external", dotted)


# ---------------------------------------------------------------- descriptions
def _params(obj):
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    return [p for p in sig.parameters.values() if p.name not in ("self", "cls")]


def _field_defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            try:
                out[f.name] = f.default_factory()
            except Exception:
                out[f.name] = ("factory", f.default_factory)
        else:
            out[f.name] = _EMPTY
    return out


def describe_live(obj):
    """The description of an imported Megatron object (None: it does not exist)."""
    if obj is None:
        return None
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return ("enum", {e.name: e.value for e in obj})
    if dataclasses.is_dataclass(obj):
        inherited = {}  # fields of Megatron's dataclass bases are compared under the base's name
        for base in obj.__mro__[1:]:
            if dataclasses.is_dataclass(base):
                inherited.update(_field_defaults(base))
        return ("dataclass", _field_defaults(obj), inherited)
    if callable(obj):
        return ("callable", _params(obj))
    return ("other",)


def describe_entry(entry: dict):
    """The description of one symbol of a source table (None: not in that release)."""
    kind = entry["kind"]
    if kind == "missing":
        return None
    if kind == "enum":
        return ("enum", {k: decode(v) for k, v in entry["members"].items()})
    if kind == "dataclass":
        fields = {k: decode(v) for k, v in entry["fields"].items()}
        return ("dataclass", fields, {k: decode(v) for k, v in entry["inherited"].items()})
    if kind == "callable":
        params = [
            inspect.Parameter(
                p["name"], getattr(inspect.Parameter, p["kind"]), default=decode(p.get("default"))
            )
            for p in entry["params"]
        ]
        return ("callable", params)
    return ("other",)


# ---------------------------------------------------------------- comparisons
def compare_params(symbol: str, m_params, g_params) -> list[str]:
    if m_params is None or g_params is None:
        return []
    issues = []
    g_by_name = {p.name: p for p in g_params}
    g_var_kw = any(p.kind == p.VAR_KEYWORD for p in g_params)
    for p in m_params:
        if p.kind in _VAR:
            if not any(q.kind == p.kind for q in g_params):
                issues.append(f"{symbol}({'*' if p.kind == p.VAR_POSITIONAL else '**'}): missing")
            continue
        q = g_by_name.get(p.name)
        if q is None:
            if not g_var_kw or p.kind == p.POSITIONAL_ONLY:
                issues.append(f"{symbol}({p.name}): missing")
            else:
                issues.append(f"{symbol}({p.name}): only via **kwargs")
            continue
        if p.default is not _EMPTY and q.default is _EMPTY:
            issues.append(f"{symbol}({p.name}): required in gigatron")
        elif p.default is not _EMPTY and not same(p.default, q.default):
            issues.append(f"{symbol}({p.name}): default")
        if p.kind in _POSITIONAL and q.kind == q.KEYWORD_ONLY:
            issues.append(f"{symbol}({p.name}): keyword-only in gigatron")
    # Positional order: Megatron's positional parameters must open gigatron's list in order.
    m_pos = [p.name for p in m_params if p.kind in _POSITIONAL]
    g_pos = [p.name for p in g_params if p.kind in _POSITIONAL]
    for i, name in enumerate(m_pos):
        if name in g_by_name and (i >= len(g_pos) or g_pos[i] != name):
            if g_by_name[name].kind in _POSITIONAL:
                issues.append(f"{symbol}({name}): position")
            break
    m_names = {p.name for p in m_params}
    for q in g_params:
        if q.name not in m_names and q.kind not in _VAR and q.default is _EMPTY:
            issues.append(f"{symbol}({q.name}): extra required parameter")
    return issues


def compare_signature(symbol: str, theirs, ours) -> list[str]:
    return compare_params(symbol, _params(theirs), _params(ours))


def compare_fields(symbol: str, m: dict, inherited: dict, ours) -> list[str]:
    if not dataclasses.is_dataclass(ours):
        return [f"{symbol}: not a dataclass in gigatron"]
    g = _field_defaults(ours)
    issues = []
    for name, default in m.items():
        if name.startswith("_") or (name in inherited and same(inherited[name], default)):
            continue
        if name not in g:
            issues.append(f"{symbol}.{name}: field missing")
        elif default is _EMPTY:
            continue  # required in Megatron; a gigatron default only accepts more calls
        elif g[name] is _EMPTY:
            issues.append(f"{symbol}.{name}: field required in gigatron")
        elif not same(default, g[name]):
            issues.append(f"{symbol}.{name}: field default")
    return issues


def compare_members(symbol: str, m: dict, ours) -> list[str]:
    g = (
        {e.name: e.value for e in ours}
        if inspect.isclass(ours) and issubclass(ours, enum.Enum)
        else {}
    )
    issues = [f"{symbol}.{n}: member missing" for n in m if n not in g]
    issues += [f"{symbol}.{n}: member value" for n in m if n in g and not same(m[n], g[n])]
    return issues


def compare_described(symbol: str, theirs, ours) -> tuple[list[str], dict[str, str]]:
    """Issue keys for one symbol, and a detail string per key (for the failure message)."""
    if theirs is None:
        return [], {}  # not in this megatron-core release (the map is newer): nothing to compare
    if ours is None:
        return [f"{symbol}: missing"], {}
    if theirs[0] == "enum":
        return compare_members(symbol, theirs[1], ours), {}
    if theirs[0] == "dataclass":
        issues = compare_fields(symbol, theirs[1], theirs[2], ours)
        g = _field_defaults(ours) if dataclasses.is_dataclass(ours) else {}
        details = {
            f"{symbol}.{n}: field default": f"megatron {d!r}, ours {g[n]!r}"
            for n, d in theirs[1].items()
            if n in g
        }
        return issues, details
    if theirs[0] == "callable":
        g_params = _params(ours)
        issues = compare_params(symbol, theirs[1], g_params)
        details = {}
        if theirs[1] and g_params:
            g = {p.name: p for p in g_params}
            for p in theirs[1]:
                if p.name in g:
                    details[f"{symbol}({p.name}): default"] = (
                        f"megatron {p.default!r}, ours {g[p.name].default!r}"
                    )
            details[symbol] = f"megatron ({', '.join(map(str, theirs[1]))})"
        return issues, details
    return [], {}
