"""Mixture of Experts (mirrors `megatron.core.transformer.moe`).

Submodules as in Megatron: `moe_layer` (MoELayer, MoESubmodules), `router` (TopKRouter),
`token_dispatcher` (allgather / alltoall), `experts` (SequentialMLP, GroupedMLP),
`shared_experts` (SharedExpertMLP) and `moe_utils` (losses, aux-loss tracking). See docs/moe.md.
"""

from gigatron.core.transformer.moe._missing import missing_name_error

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


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise missing_name_error(__name__, name)


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))
