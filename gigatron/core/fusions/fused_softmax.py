"""Scale + mask + softmax over attention scores (mirrors `megatron.core.fusions.fused_softmax`).

`FusedScaleMaskSoftmax` keeps Megatron's constructor and forward; it always takes Megatron's
PyTorch path (`forward_torch_softmax`: `is_kernel_available` is False, gigatron has no CUDA
softmax kernels): optional FP32 upcast, scale, the causal (or sliding-window) mask made here when
none is given, `mask_func`, softmax, cast back. A `softmax_offset` ([np]) adds one logit per head
to each row's denominator (`SoftmaxOne`, softmax-off-by-one). Megatron's assertions raise
`ArgumentError` (an AssertionError and a ValueError).
"""

from __future__ import annotations

import torch
from torch import nn

from gigatron.compat.errors import ArgumentError
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.utils import get_sliding_window_causal_mask


class SoftmaxOne(nn.Module):
    """Softmax with one extra logit per head (`denominator_offset`, [np]) in the denominator."""

    def __init__(self, dim: int | None = None, denominator_offset=1.0) -> None:
        super().__init__()
        self.dim = dim
        self.denominator_offset = denominator_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, sq, _ = x.shape
        sink = torch.as_tensor(self.denominator_offset, dtype=x.dtype, device=x.device)
        sink = sink.reshape(1, -1, 1, 1).expand(b, x.size(1), sq, 1)
        return torch.softmax(torch.cat([x, sink], dim=-1), dim=-1)[..., :-1]


def _causal_mask(sq: int, sk: int, device) -> torch.Tensor:
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(diagonal=1)


class FusedScaleMaskSoftmax(nn.Module):
    """scale + mask + softmax over [b, np, sq, sk] scores (Megatron's arguments)."""

    def __init__(
        self,
        input_in_fp16,
        input_in_bf16,
        attn_mask_type,
        scaled_masked_softmax_fusion,
        mask_func,
        softmax_in_fp32,
        scale,
        window_size=None,
    ):
        super().__init__()
        if input_in_fp16 and input_in_bf16:
            raise ArgumentError(
                "FusedScaleMaskSoftmax: input_in_fp16 and input_in_bf16 are both set"
            )
        if scale is not None and not softmax_in_fp32:
            raise ArgumentError("FusedScaleMaskSoftmax: a scale needs softmax_in_fp32=True")
        self.input_in_fp16, self.input_in_bf16 = input_in_fp16, input_in_bf16
        self.input_in_float16 = input_in_fp16 or input_in_bf16
        self.attn_mask_type = attn_mask_type
        self.scaled_masked_softmax_fusion = scaled_masked_softmax_fusion  # a speed hint only
        self.mask_func = mask_func
        self.softmax_in_fp32 = softmax_in_fp32
        self.scale = scale
        self.window_size = window_size

    def forward(self, input: torch.Tensor, mask: torch.Tensor | None, softmax_offset=None):
        if input.dim() != 4:
            raise ArgumentError(
                "FusedScaleMaskSoftmax: input must be [b, np, sq, sk], got shape "
                f"{tuple(input.shape)}"
            )
        return self.forward_torch_softmax(input, mask, softmax_offset)

    def is_kernel_available(self, mask, b, np, sq, sk) -> bool:
        """Always False: gigatron has no fused softmax kernels."""
        return False

    def forward_torch_softmax(self, input, mask, softmax_offset=None):
        if self.input_in_float16 and self.softmax_in_fp32:
            input = input.float()
        if self.scale is not None:
            input = input * self.scale
        sq, sk = input.size(2), input.size(3)
        if self.window_size is not None:
            # Megatron's rule: the window mask replaces any given mask
            mask = get_sliding_window_causal_mask(sq, sk, self.window_size, input.device)
        elif self.attn_mask_type == AttnMaskType.causal and mask is None and sq > 1:
            # sq == 1: one query against a KV cache (or a one-token context), nothing to mask
            if sq != sk:
                raise ArgumentError(
                    f"FusedScaleMaskSoftmax: a causal mask is for self attention (sq == sk); "
                    f"got sq={sq}, sk={sk} without a mask"
                )
            mask = _causal_mask(sq, sk, input.device)
        scores = self.mask_func(input, mask) if mask is not None else input
        if softmax_offset is None:
            probs = torch.softmax(scores, dim=-1)
        else:
            probs = SoftmaxOne(-1, softmax_offset.to(input.device))(scores)
        if self.input_in_float16 and self.softmax_in_fp32:
            probs = probs.half() if self.input_in_fp16 else probs.bfloat16()
        return probs
