"""`fp8_transpose(x)`: `x [r, c]` -> a contiguous `x^T [c, r]`, as one op that torch.compile
does not fuse into its neighbours.

`torch._scaled_mm` multiplies a row-major operand by a column-major one, so the input and weight
gradients need transposed copies of FP8 casts (`fp8_linear._mm`). Written as `.t().contiguous()`,
Inductor fuses the copy into the kernel that makes the cast, often a row-wise reduction (an
RMSNorm backward feeding the next linear's output gradient), whose transposed one-byte writes
then scatter across memory: on an H200 that kernel took ~0.6 ms at `[8192, 4096]` against
~0.08 ms without the copy. As a custom op the copy is a kernel of its own: a tiled Triton
transpose on CUDA (both sides coalesced), ATen's copy elsewhere. The bytes are moved as they are,
so the result equals `x.t().contiguous()` exactly.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("gigatron::fp8_transpose", mutates_args=())
def fp8_transpose(x: torch.Tensor) -> torch.Tensor:
    """`x [r, c]` (any one-byte dtype, any strides) -> `x^T [c, r]`, contiguous."""
    if x.dim() != 2:
        raise ValueError(
            f"fp8_transpose takes a 2-D tensor [r, c], got shape {tuple(x.shape)} "
            "(gigatron/core/tensor_parallel/fp8_transpose.py)"
        )
    if x.is_cuda and x.element_size() == 1 and x.numel() > 0 and _triton_available():
        from gigatron.core.tensor_parallel._fp8_transpose_kernel import transpose_bytes

        src = x.contiguous().view(torch.uint8)
        out = torch.empty((x.size(1), x.size(0)), dtype=torch.uint8, device=x.device)
        transpose_bytes(src, out)
        return out.view(x.dtype)
    return x.new_empty((x.size(1), x.size(0))).copy_(x.t())  # never an alias of x


@fp8_transpose.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.size(1), x.size(0)))


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
