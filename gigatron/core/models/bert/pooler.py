"""Pooler: the hidden state of one token (BERT's [CLS]) through dense + tanh.

Mirrors `megatron.core.models.bert.pooler.Pooler`. Under sequence parallelism the sequence is
gathered first, so every TP rank pools the same token.

Shapes: s: seq, b: micro-batch, h: hidden.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core.transformer.module import MegatronModule


def get_linear_layer(rows: int, columns: int, init_method, perform_initialization: bool = True):
    """Plain (not TP-split) nn.Linear with `init_method` on the weight and a zero bias, as
    Megatron's `transformer.utils.get_linear_layer`."""
    layer = torch.nn.Linear(rows, columns)
    if perform_initialization:
        init_method(layer.weight)
    with torch.no_grad():
        layer.bias.zero_()
    return layer


class Pooler(MegatronModule):
    """hidden_states [s, b, h] -> tanh(dense(hidden_states[sequence_index])) [b, h]."""

    def __init__(self, hidden_size: int, init_method, config, sequence_parallel: bool = False):
        super().__init__(config)
        self.dense = get_linear_layer(
            hidden_size, hidden_size, init_method, config.perform_initialization
        )
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden_states: Tensor, sequence_index: int = 0) -> Tensor:
        if self.sequence_parallel:
            from gigatron.core import tensor_parallel

            hidden_states = tensor_parallel.gather_from_sequence_parallel_region(
                hidden_states, tensor_parallel_output_grad=False
            )  # [s, b, h]
        pooled = hidden_states[sequence_index, :, :]  # [b, h]
        return torch.tanh(self.dense(pooled))
