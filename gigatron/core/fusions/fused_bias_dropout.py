"""Bias + dropout + residual add (mirrors `megatron.core.fusions.fused_bias_dropout`).

`get_bias_dropout_add(training, fused)` returns `f(x_with_bias, residual, prob)` computing
`residual + dropout(x + bias)`. The `fused` flag is a speed hint in Megatron (a jit-scripted
kernel); here every variant runs the same torch ops, `_bias_dropout_add_func`. As in Megatron:
`x` (and `bias`) are cast to the residual's dtype first, so an FP32 residual stream stays FP32;
in eval mode with nothing requiring gradients the sum is formed in `x`'s own storage.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _bias_dropout_add_func(x_with_bias, residual: torch.Tensor, prob: float, training: bool):
    x, bias = x_with_bias  # x: [s, b, h], bias: [h] or None
    inplace = not training and not any(
        t is not None and t.requires_grad for t in (x, residual, bias)
    )
    if x.dtype != residual.dtype:  # a new tensor: in place no longer touches the caller's x
        x = x.to(residual.dtype)
        bias = None if bias is None else bias.to(residual.dtype)
    if bias is not None:
        x = x.add_(bias) if inplace else x + bias
    out = F.dropout(x, p=prob, training=training, inplace=inplace)
    return out.add_(residual) if inplace else residual + out


def bias_dropout_add_unfused(training: bool):
    def _bias_dropout_add(x_with_bias, residual, prob):
        return _bias_dropout_add_func(x_with_bias, residual, prob, training)

    return _bias_dropout_add


def bias_dropout_add_fused_train(x_with_bias, residual: torch.Tensor, prob: float):
    return _bias_dropout_add_func(x_with_bias, residual, prob, True)


def bias_dropout_add_fused_inference(x_with_bias, residual: torch.Tensor, prob: float):
    return _bias_dropout_add_func(x_with_bias, residual, prob, False)


def get_bias_dropout_add(training: bool, fused: bool):
    """The bias-dropout-add function for this mode (`fused` only changes speed in Megatron)."""
    if fused:
        return bias_dropout_add_fused_train if training else bias_dropout_add_fused_inference
    return bias_dropout_add_unfused(training)
