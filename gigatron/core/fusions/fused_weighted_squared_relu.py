"""Token-weighted squared ReLU: squared_relu(x) * w, as Megatron's MoE experts apply router
probabilities inside the activation (`megatron.core.fusions.fused_weighted_squared_relu`).

Plain PyTorch: autograd gives Megatron's gradients (dx = g * w * 2 relu(x), dw = sum over hidden
of g * relu(x)^2), computed in the promoted dtype (fp32 for fp32 weights) and returned in the
input's and weights' own dtypes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["weighted_squared_relu", "weighted_squared_relu_impl"]


def weighted_squared_relu(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """x [..., h], weights broadcastable (e.g. [tokens, 1]) -> relu(x)^2 * weights in x's dtype."""
    return (torch.pow(F.relu(x), 2) * weights).to(x.dtype)


def weighted_squared_relu_impl(input: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """input [tokens, h] or [s, b, h], weights [tokens, 1] (tokens = s*b) -> input's shape."""
    if input.dim() not in (2, 3):
        raise ValueError(
            f"weighted_squared_relu_impl: input must be 2-D or 3-D, got shape {tuple(input.shape)}"
        )
    flat = input.reshape(-1, input.shape[-1])  # [tokens, h]
    out = weighted_squared_relu(flat, weights)
    return out.view(input.shape)
