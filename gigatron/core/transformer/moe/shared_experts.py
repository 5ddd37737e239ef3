"""Shared experts: a dense MLP every token goes through, added to the routed experts' output.

Mirrors `megatron.core.transformer.moe.shared_experts.SharedExpertMLP` (DeepSeek / Qwen-MoE
style) without the gate and the dispatch overlap: an ordinary (TP-sharded, not expert) MLP of
size `moe_shared_expert_intermediate_size` whose fc2 bias is added in place.

Shapes: s: seq (s/tp under SP), b: micro-batch, h: hidden.
"""

from __future__ import annotations

import copy

from torch import Tensor

from gigatron.core.transformer.mlp import MLP, MLPSubmodules


class SharedExpertMLP(MLP):
    """MLP with ffn_hidden_size = moe_shared_expert_intermediate_size; returns the output only."""

    def __init__(
        self,
        config,
        submodules: MLPSubmodules,
        gate: bool = False,
        pg_collection=None,
        name=None,  # Megatron 0.19+: a label
    ):
        if gate:
            raise ValueError("SharedExpertMLP: gate=True (gated shared experts) is not supported")
        if config.moe_shared_expert_overlap:
            raise ValueError(
                "moe_shared_expert_overlap=True is not supported by gigatron (no overlap of the "
                "shared experts with the token dispatch)"
            )
        cfg = copy.copy(config)
        cfg.ffn_hidden_size = config.moe_shared_expert_intermediate_size
        tp_group = None if pg_collection is None else pg_collection.tp
        super().__init__(cfg, submodules, tp_group=tp_group)
        self.name = name

    def forward(self, hidden_states: Tensor) -> Tensor:
        """[s, b, h] -> [s, b, h] (bias added)."""
        output, bias = super().forward(hidden_states)
        return output if bias is None else output + bias
