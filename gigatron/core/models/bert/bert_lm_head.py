"""BERT's masked-LM head transform: dense -> gelu -> layer norm (the vocab projection lives in
BertModel.output_layer).

Mirrors `megatron.core.models.bert.bert_lm_head.BertLMHead`. The dense layer is a plain
(replicated) linear: under sequence parallelism its grads are summed over TP ranks like the
norms' (marked `sequence_parallel`).

Shapes: s: seq, b: micro-batch, h: hidden.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core.models.bert.pooler import get_linear_layer
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.torch_norm import WrappedTorchNorm


class BertLMHead(MegatronModule):
    """hidden_states [s, b, h] -> layer_norm(gelu(dense(hidden_states))) [s, b, h]."""

    def __init__(self, hidden_size: int, config):
        super().__init__(config)
        self.dense = get_linear_layer(
            hidden_size, hidden_size, config.init_method, config.perform_initialization
        )
        self.dense.weight.sequence_parallel = config.sequence_parallel
        self.dense.bias.sequence_parallel = config.sequence_parallel
        self.layer_norm = WrappedTorchNorm(
            config=config, hidden_size=hidden_size, eps=config.layernorm_epsilon
        )
        self.gelu = torch.nn.functional.gelu  # erf gelu, as Megatron

    def forward(self, hidden_states: Tensor) -> Tensor:
        hidden_states = self.dense(hidden_states)
        hidden_states = self.gelu(hidden_states)
        return self.layer_norm(hidden_states)
