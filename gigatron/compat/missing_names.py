"""Names that do not exist in Megatron Core but tutorials use: errors that say what to use.

Two kinds of name, each with a table of what to use instead:

- config fields (`NOT_MEGATRON_FIELDS`): `TransformerConfig(moe_expert_parallel_size=4)` raises
  one TypeError naming every unknown field, with the field to use, or else the closest valid one
  (`hint_unknown_fields`, a class decorator);
- classes (`NOT_IN_MEGATRON`): `from gigatron.core.transformer.moe import MoEMLP` raises an
  ImportError naming the class to use instead, `moe.MoEMLP` an AttributeError with the same hint,
  and `hasattr(moe, "MoEMLP")` is False, as the module `__getattr__` protocol requires. Any other
  missing name is Python's plain error.

How the class hint reaches both statements without looking at the caller: `module.X` calls the
module's `__getattr__` (`module_getattr` builds it), which raises the hinted AttributeError. `from
module import X` would replace any AttributeError with a bare "cannot import name", so it takes
the import system's own route: for a module with a `__path__`, a missing name is looked up as the
submodule `module.X` (importlib's `_handle_fromlist`), and `_MissingNameFinder`, last on
`sys.meta_path`, answers that lookup for the registered modules' hinted names with the ImportError.
A plain module gets an empty `__path__` for this (no submodule can be found under it).

Leaf module: imports nothing from gigatron (see `gigatron.compat`).
"""

from __future__ import annotations

import difflib
import functools
import importlib.abc
import inspect
import sys
from collections.abc import Callable
from dataclasses import fields

# Config fields tutorials use that Megatron never had -> what to use instead. A test checks that
# each name is absent from both gigatron's and megatron-core's TransformerConfig and that each
# suggestion (its first word) is a field of both.
NOT_MEGATRON_FIELDS = {
    "moe_expert_parallel_size": "expert_model_parallel_size (a parallel_state / "
    "ModelParallelConfig size, also passed to initialize_model_parallel)",
    "expert_parallel_size": "expert_model_parallel_size",
    "moe_router_use_second_place": "moe_router_topk=2 (top-k routing already keeps the 2nd choice)",
    "moe_min_capacity": "moe_expert_capacity_factor (capacity = factor * tokens * topk / "
    "num_moe_experts; with moe_pad_expert_input_to_capacity=True to pad up to it)",
    "moe_capacity_factor": "moe_expert_capacity_factor",
    "moe_num_experts": "num_moe_experts",
    "num_experts": "num_moe_experts",
    "moe_top_k": "moe_router_topk",
    "moe_topk": "moe_router_topk",
    "moe_aux_loss_weight": "moe_aux_loss_coeff",
    "tensor_parallel_size": "tensor_model_parallel_size",
    "pipeline_parallel_size": "pipeline_model_parallel_size",
}

# Class names tutorials import that Megatron never had -> what to use instead.
NOT_IN_MEGATRON = {
    "MoEMLP": "SequentialMLP or GroupedMLP (gigatron.core.transformer.moe.experts) inside MoELayer",
    "MoE": "MoELayer (gigatron.core.transformer.moe.moe_layer)",
    "MixtureOfExperts": "MoELayer (gigatron.core.transformer.moe.moe_layer)",
    "SparseMoE": "MoELayer (gigatron.core.transformer.moe.moe_layer)",
    "ExpertMLP": "SequentialMLP or GroupedMLP (gigatron.core.transformer.moe.experts)",
    "Experts": "SequentialMLP or GroupedMLP (gigatron.core.transformer.moe.experts)",
    "Router": "TopKRouter (gigatron.core.transformer.moe.router)",
    "TEGroupedMLP": "GroupedMLP (gigatron.core.transformer.moe.experts; no Transformer Engine)",
    "MoEFlexTokenDispatcher": "MoEAlltoAllTokenDispatcher or MoEAllGatherTokenDispatcher "
    "(no DeepEP/HybridEP in gigatron)",
}


# ---- config fields ----


def unknown_field_line(cls_name: str, name: str, valid: set[str]) -> str:
    """One line of the unknown-field TypeError: what to use, or the closest valid field."""
    if name in NOT_MEGATRON_FIELDS:
        return (
            f"{cls_name} has no field {name!r} (it is not a Megatron field either); "
            f"use {NOT_MEGATRON_FIELDS[name]}"
        )
    close = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{cls_name} has no field {name!r}{hint}"


def hint_unknown_fields(cls):
    """Class decorator for a dataclass: unknown keywords raise one TypeError naming all of them,
    each with the field to use (`NOT_MEGATRON_FIELDS`) or the closest valid one."""
    dataclass_init = cls.__init__

    @functools.wraps(dataclass_init)
    def __init__(self, *args, **kwargs):
        valid = {f.name for f in fields(type(self)) if f.init}
        unknown = [name for name in kwargs if name not in valid]
        if unknown:  # all of them at once, not one per run
            lines = [unknown_field_line(type(self).__name__, name, valid) for name in unknown]
            if len(lines) > 1:
                lines = [f"{type(self).__name__} got {len(lines)} unknown fields:", *lines]
            raise TypeError("\n  ".join(lines))
        dataclass_init(self, *args, **kwargs)

    __init__.__signature__ = inspect.signature(dataclass_init)
    cls.__init__ = __init__
    return cls


# ---- class names ----


def _hint(module: str, name: str) -> str:
    return f"{module} has no {name!r} (neither has megatron.core); use {NOT_IN_MEGATRON[name]}"


def missing_name_error(module: str, name: str) -> AttributeError:
    """The AttributeError a module `__getattr__` in `module` raises for a missing `name`: with
    the hint for a name tutorials use, else Python's plain message (hasattr, `getattr(m, x,
    default)` rely on AttributeError either way)."""
    if name in NOT_IN_MEGATRON:
        return AttributeError(_hint(module, name), name=name)
    return AttributeError(f"module {module!r} has no attribute {name!r}", name=name)


class _MissingNameFinder(importlib.abc.MetaPathFinder):
    """Answers `from <registered module> import <hinted name>` with the hinted ImportError."""

    def __init__(self) -> None:
        self.modules: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        module, _, name = fullname.rpartition(".")
        if module in self.modules and name in NOT_IN_MEGATRON:
            raise ImportError(_hint(module, name), name=module)
        return None  # not ours: the import fails (or succeeds) as it would without us


_FINDER = _MissingNameFinder()


def module_getattr(module_name: str) -> Callable[[str], object]:
    """The `__getattr__` of a module whose missing tutorial names should say what to use:
    `__getattr__ = module_getattr(__name__)` at the end of the module.

    Also registers the module with the finder that turns `from module import X` into the hinted
    ImportError, and gives a plain module the empty `__path__` that route needs (see above).
    """
    module = sys.modules[module_name]
    if not hasattr(module, "__path__"):
        module.__path__ = []  # no submodules; only so that from-imports consult the finder
    _FINDER.modules.add(module_name)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)  # last: it never shadows a real module

    def __getattr__(name: str):
        raise missing_name_error(module_name, name)

    return __getattr__
