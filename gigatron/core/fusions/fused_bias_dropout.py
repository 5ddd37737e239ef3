"""Bias + dropout + residual add (mirrors `megatron.core.fusions.fused_bias_dropout`).

`get_bias_dropout_add(training, fused)` returns `f(x_with_bias, residual, prob)` computing
`residual + dropout(x + bias)`. The `fused` flag is a speed hint in Megatron (a jit-scripted
kernel); here both settings run the same torch ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _bias_dropout_add(x_with_bias, residual: torch.Tensor, prob: float, training: bool):
    x, bias = x_with_bias  # x: [s, b, h], bias: [h] or None
    if bias is not None:
        x = x + bias
    return residual + F.dropout(x, p=prob, training=training)


def bias_dropout_add_unfused(training: bool):
    def _fn(x_with_bias, residual, prob):
        return _bias_dropout_add(x_with_bias, residual, prob, training)

    return _fn


def get_bias_dropout_add(training: bool, fused: bool):
    """The bias-dropout-add function for this mode (`fused` only changes speed in Megatron)."""
    return bias_dropout_add_unfused(training)
