"""LayerNorm and RMSNorm on plain PyTorch, built by the local specs; Megatron's weightless L2Norm.

Mirrors `megatron.core.transformer.torch_norm.WrappedTorchNorm` (called as
`norm(config=, hidden_size=, eps=)`), with two things Megatron's torch wrapper lacks: sequence
parallelism (weights are marked `sequence_parallel` so their grads get all-reduced over TP, as
Megatron's APEX/TE norms do) and `layernorm_zero_centered_gamma` (weight stored as gamma - 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _Norm(torch.nn.Module):
    def __init__(self, config, hidden_size: int, eps: float, *, bias: bool):
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.zero_centered_gamma = config.layernorm_zero_centered_gamma
        init = torch.zeros if self.zero_centered_gamma else torch.ones
        self.weight = torch.nn.Parameter(init(hidden_size, dtype=config.params_dtype))
        self.bias = (
            torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
            if bias
            else None
        )
        # Under SP every TP rank sees a different slice of the sequence, so each holds a partial
        # gradient of these replicated weights; the flag tells finalize_model_grads to all-reduce.
        for p in self.parameters():
            p.sequence_parallel = config.sequence_parallel

    def _gamma(self) -> torch.Tensor:
        return self.weight + 1 if self.zero_centered_gamma else self.weight


class LayerNorm(_Norm):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim. x: [..., h]."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5):
        super().__init__(config, hidden_size, eps, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.hidden_size,), self._gamma(), self.bias, self.eps)


class RMSNorm(_Norm):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dim, computed in fp32. x: [..., h]."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5):
        super().__init__(config, hidden_size, eps, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self._gamma() * normed.to(x.dtype)


class L2Norm(torch.nn.Module):
    """x * rsqrt(mean(x^2, last dim) + eps), computed in fp32, no weight (Megatron's qk L2 norm;
    `hidden_size` is accepted for the norm-module signature and not used). [..., h] -> [..., h]."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, **unused):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_fp32 = x.float()
        return (x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


class WrappedTorchNorm:
    """Factory: `WrappedTorchNorm(config, hidden_size, eps)` -> LayerNorm or RMSNorm per
    `config.normalization`."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **unused):
        if config.normalization == "LayerNorm":
            return LayerNorm(config, hidden_size, eps)
        if config.normalization == "RMSNorm":
            return RMSNorm(config, hidden_size, eps)
        raise ValueError(
            f"normalization ({config.normalization!r}) must be 'LayerNorm' or 'RMSNorm'"
        )
