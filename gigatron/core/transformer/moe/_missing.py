"""Helpful errors for MoE names that tutorials use but Megatron Core does not have.

`from gigatron.core.transformer.moe import MoEMLP` (or `.experts` / `.moe_layer`) raises an
ImportError that names the class to use instead, and `moe.MoEMLP` an AttributeError with the same
hint; `hasattr(moe, "MoEMLP")` is False, as the module `__getattr__` protocol requires. Any other
missing name is a plain AttributeError.
"""

from __future__ import annotations

import dis
import sys

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


_IMPORT_FROM = dis.opmap["IMPORT_FROM"]


def _is_from_import(frame) -> bool:
    """True when `frame` is executing `from m import name` (its current opcode is IMPORT_FROM)."""
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == _IMPORT_FROM


def missing_name_error(module: str, name: str) -> Exception:
    """The exception a module `__getattr__` in `module` should raise for a missing `name`.

    Module `__getattr__` must raise AttributeError (hasattr, `getattr(m, x, default)` rely on
    it), and for a name tutorials use but Megatron lacks, that AttributeError names what to use.
    `from m import X` would replace any AttributeError with a bare "cannot import name", losing
    the hint, so when the caller is executing that statement the hint comes as ImportError.
    """
    if name not in NOT_IN_MEGATRON:
        return AttributeError(f"module {module!r} has no attribute {name!r}", name=name)
    message = f"{module} has no {name!r} (neither has megatron.core); use {NOT_IN_MEGATRON[name]}"
    # Frame 0: here; 1: the module's __getattr__; 2: the code that looked the name up.
    if _is_from_import(sys._getframe(2)):
        return ImportError(message, name=module)
    return AttributeError(message, name=name)
