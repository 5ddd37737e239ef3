"""Megatron's `TESpecProvider`: the Transformer Engine backend of layer specs, without TE.

Mirrors `megatron.core.extensions.transformer_engine_spec_provider`. It builds (so module-level
`backend = TESpecProvider()` works) and names the TE classes of
`gigatron.core.extensions.transformer_engine`; a spec that uses them fails with ImportError when
its modules are built, as Megatron's does without Transformer Engine. MoE experts fall back to
`SequentialMLP` over the local linears, Megatron's choice when TE is older than 1.7 (absent here).
"""

from __future__ import annotations

import warnings
from functools import partial

from gigatron.core.extensions.transformer_engine import (
    TEColumnParallelLinear,
    TEDotProductAttention,
    TELayerNormColumnParallelLinear,
    TELinear,
    TENorm,
    TERowParallelLinear,
)
from gigatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from gigatron.core.transformer.mlp import MLPSubmodules


class TESpecProvider:
    """Which modules a TE-backed layer spec uses (Megatron's BackendSpecProvider protocol)."""

    def linear(self) -> type:
        return TELinear

    def column_parallel_linear(self) -> type:
        return TEColumnParallelLinear

    def row_parallel_linear(self) -> type:
        return TERowParallelLinear

    def fuse_layernorm_and_linear(self) -> bool:
        """TE fuses the pre-projection norm into the column-parallel linear."""
        return True

    def column_parallel_layer_norm_linear(self) -> type:
        return TELayerNormColumnParallelLinear

    def layer_norm(
        self, rms_norm: bool = False, for_qk: bool = False, has_residual: bool = False
    ) -> type:
        return TENorm

    def core_attention(self) -> type:
        return TEDotProductAttention

    def grouped_mlp_modules(self, moe_use_grouped_gemm: bool):
        """Experts: no TE grouped GEMM here, so Megatron's old-TE path (local SequentialMLP)."""
        from gigatron.core.transformer.moe.experts import SequentialMLP

        warnings.warn(
            "Transformer Engine is not installed: MoE experts use the local linear "
            "implementation (SequentialMLP)",
            stacklevel=2,
        )
        submodules = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
        return partial(SequentialMLP, submodules=submodules)

    def activation_func(self):
        """TE's fused activation op: None without TE (the MLP's own activation is used)."""
        return None
