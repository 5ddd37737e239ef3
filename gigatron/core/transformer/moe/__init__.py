"""Mixture of Experts (mirrors `megatron.core.transformer.moe`).

Submodules as in Megatron: `moe_layer` (MoELayer, MoESubmodules), `router` (TopKRouter),
`token_dispatcher` (allgather / alltoall), `experts` (SequentialMLP, GroupedMLP),
`shared_experts` (SharedExpertMLP) and `moe_utils` (losses, aux-loss tracking). See docs/moe.md.
"""

import importlib

from gigatron.compat import missing_names

_EXPORTS = {
    "MoELayer": "moe_layer",
    "MoESubmodules": "moe_layer",
    "BaseMoELayer": "moe_layer",
    "TopKRouter": "router",
    "SequentialMLP": "experts",
    "GroupedMLP": "experts",
    "SharedExpertMLP": "shared_experts",
    "MoEAllGatherTokenDispatcher": "token_dispatcher",
    "MoEAlltoAllTokenDispatcher": "token_dispatcher",
}


# tutorials' names (MoEMLP, Router, ...) say what to use (gigatron.compat.missing_names)
_missing_name = missing_names.module_getattr(__name__)


def __getattr__(name: str):
    if name in _EXPORTS:  # imported on first use, as Megatron's package does not load them all
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    return _missing_name(name)


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))
