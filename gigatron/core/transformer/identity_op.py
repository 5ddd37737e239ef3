"""Placeholders for absent submodules (mirrors `megatron.core.transformer.identity_op`)."""

import torch


class IdentityOp(torch.nn.Module):
    """Accepts any constructor and forward arguments; returns the first forward argument."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x, *args, **kwargs):
        return x


class IdentityFuncOp(IdentityOp):
    """Like IdentityOp, but calling the module returns a function that returns its input.

    Used for the bias-dropout-add slots: `bda(training, fused)(x_with_bias, residual, p)`.
    """

    def forward(self, *args, **kwargs):
        return lambda x, *a, **k: x
