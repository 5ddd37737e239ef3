"""SwiGLU with bias or per-token weights (mirrors `megatron.core.fusions.fused_bias_swiglu`).

`bias_swiglu_impl(input, bias)` is `silu(y1) * y2` over the two halves of `input + bias` along
the last dimension; `weighted_bias_swiglu_impl(input, None, weights)` multiplies by per-token
`weights` and returns `input`'s dtype. `clamp_value` clamps the gate half from above and the
linear half to `[-clamp_value, clamp_value]`, computing in FP32. As in Megatron, the forward
saves only the input and the backward recomputes from it (`fp8_input_store=True` keeps that saved
input in `float8_e4m3fn`, so the gradients come from the FP8-rounded input, as in Megatron).
Megatron's `cpu_offload_input` (activation offloading) does not exist here: True raises.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gigatron.compat.errors import ArgumentError


def swiglu(y: torch.Tensor) -> torch.Tensor:
    y_1, y_2 = torch.chunk(y, 2, -1)
    return F.silu(y_1) * y_2


def bias_swiglu(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return swiglu(y + bias)


def weighted_swiglu(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (swiglu(y) * weights).to(y.dtype)


def clamped_swiglu(y: torch.Tensor, clamp_value: float) -> torch.Tensor:
    y_1, y_2 = torch.chunk(y.float(), 2, -1)
    out = F.silu(y_1.clamp(max=clamp_value)) * y_2.clamp(-clamp_value, clamp_value)
    return out.to(y.dtype)


def _swiglu_math(y, bias, weights, clamp_value):
    if bias is not None:
        y = y + bias
    out = swiglu(y) if clamp_value is None else clamped_swiglu(y, clamp_value)
    return out if weights is None else (out * weights).to(y.dtype)


class _RecomputedSwiGLU(torch.autograd.Function):
    """Saves the input (optionally in FP8) and recomputes the plain math in backward."""

    @staticmethod
    def forward(ctx, y, bias, weights, fp8_input_store, clamp_value):
        stored = y.to(torch.float8_e4m3fn) if fp8_input_store else y
        ctx.save_for_backward(stored, bias, weights)
        ctx.dtype, ctx.clamp_value = y.dtype, clamp_value
        return _swiglu_math(y, bias, weights, clamp_value)

    @staticmethod
    def backward(ctx, grad_output):
        stored, bias, weights = ctx.saved_tensors
        leaves = [stored.to(ctx.dtype), bias, weights]
        leaves = [None if t is None else t.detach().requires_grad_(True) for t in leaves]
        with torch.enable_grad():
            out = _swiglu_math(*leaves, ctx.clamp_value)
        wanted = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(out, wanted, grad_output))
        dy, dbias, dweights = (None if t is None else next(grads) for t in leaves)
        return dy, dbias, dweights, None, None


def _apply(input, bias, weights, fp8_input_store, cpu_offload_input, clamp_value, what):
    if input.dim() not in (2, 3):
        raise ArgumentError(f"{what}: input must have 2 or 3 dimensions, got {input.dim()}")
    if cpu_offload_input:
        raise ValueError(f"{what}: cpu_offload_input=True (activation offloading) is not supported")
    shape = input.shape
    out = _RecomputedSwiGLU.apply(
        input.reshape(-1, shape[-1]), bias, weights, fp8_input_store, clamp_value
    )
    return out if len(shape) == 2 else out.view(shape[0], shape[1], -1)


def bias_swiglu_impl(input, bias, fp8_input_store=False, cpu_offload_input=False, clamp_value=None):
    """SwiGLU of `input + bias` (`bias` may be None) for 2-D or 3-D `input`."""
    return _apply(input, bias, None, fp8_input_store, cpu_offload_input, clamp_value,
                  "bias_swiglu_impl")  # fmt: skip


def weighted_bias_swiglu_impl(input, bias, weights, fp8_input_store=False, clamp_value=None):
    """SwiGLU of `input` times per-token `weights`; a bias raises NotImplementedError (Megatron)."""
    if bias is not None:
        raise NotImplementedError("weighted_bias_swiglu_impl: a bias is not supported")
    return _apply(input, None, weights, fp8_input_store, False, clamp_value,
                  "weighted_bias_swiglu_impl")  # fmt: skip
