"""MoE module spec for GPT layers (mirrors `megatron.core.models.gpt.moe_module_specs`).

`get_moe_module_spec(use_te, num_experts, moe_grouped_gemm)` -> ModuleSpec(MoELayer) with
SequentialMLP experts (column/row-parallel fc1/fc2, `is_expert=True` inside) or, with
`moe_grouped_gemm`, GroupedMLP; shared experts (used when the config sets
`moe_shared_expert_intermediate_size`) are a plain TP MLP. gigatron has no Transformer Engine:
`use_te` picks the same modules (GroupedMLP stands in for TEGroupedMLP).
"""

from __future__ import annotations

from gigatron.core import tensor_parallel
from gigatron.core.transformer.mlp import MLPSubmodules
from gigatron.core.transformer.moe.experts import GroupedMLP, SequentialMLP
from gigatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
from gigatron.core.transformer.moe.shared_experts import SharedExpertMLP
from gigatron.core.transformer.spec_utils import ModuleSpec


def get_moe_module_spec(
    use_te: bool | None = True,
    num_experts: int | None = None,
    moe_grouped_gemm: bool | None = False,
    moe_use_legacy_grouped_gemm: bool | None = False,
) -> ModuleSpec:
    """ModuleSpec of an MoE layer (see module docstring)."""

    if num_experts is None:
        raise ValueError("get_moe_module_spec: num_experts must be set (got None)")
    mlp = MLPSubmodules(
        linear_fc1=tensor_parallel.ColumnParallelLinear,
        linear_fc2=tensor_parallel.RowParallelLinear,
    )
    if moe_grouped_gemm:
        experts = ModuleSpec(module=GroupedMLP)
    else:
        experts = ModuleSpec(module=SequentialMLP, submodules=mlp)
    shared = ModuleSpec(module=SharedExpertMLP, submodules=mlp)  # gate: the config decides
    return ModuleSpec(
        module=MoELayer, submodules=MoESubmodules(experts=experts, shared_experts=shared)
    )
