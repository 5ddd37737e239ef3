"""Helpful errors for MoE names that tutorials use but Megatron Core does not have.

`from gigatron.core.transformer.moe import MoEMLP` (or `.experts` / `.moe_layer`) raises an
ImportError that names the class to use instead. Only these known names raise ImportError from a
module `__getattr__`; any other missing name is a plain AttributeError.
"""

from __future__ import annotations

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


def missing_name_error(module: str, name: str) -> None:
    """Raise ImportError with the replacement if `name` is a known mistake; else return."""
    if name in NOT_IN_MEGATRON:
        raise ImportError(
            f"{module} has no {name!r} (neither has megatron.core); use {NOT_IN_MEGATRON[name]}",
            name=module,
        )
