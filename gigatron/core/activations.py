"""Elementwise activations Megatron names by path (`megatron.core.activations`).

Configs point at them (`activation_func=squared_relu`, or the string
"megatron.core.activations.squared_relu" in a YAML recipe). x: any shape, same shape out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["fast_gelu", "quick_gelu", "squared_relu"]


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2 (Primer; Nemotron's MLPs)."""
    return torch.pow(F.relu(x), 2)


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(1.702 x): the sigmoid approximation of GELU (CLIP)."""
    return x * torch.sigmoid(1.702 * x)


def fast_gelu(x: torch.Tensor) -> torch.Tensor:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): the tanh approximation of GELU."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
