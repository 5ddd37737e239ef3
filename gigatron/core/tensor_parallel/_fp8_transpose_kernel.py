"""The Triton kernel behind `fp8_transpose` (imported only when a CUDA tensor is transposed).

One program moves a `[BLOCK, BLOCK]` tile of bytes: loaded along the rows of `x`, transposed in
registers (`tl.trans`, through shared memory) and stored along the rows of `y`, so reads and writes
are both coalesced.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _transpose_tiles(x_ptr, y_ptr, rows, cols, BLOCK: tl.constexpr):
    """`y [cols, rows] = x [rows, cols]^T` (both contiguous, one-byte elements)."""
    col_tiles = tl.cdiv(cols, BLOCK)  # one grid axis (axis 1 stops at 65,535 tiles)
    tile_r, tile_c = tl.program_id(0) // col_tiles, tl.program_id(0) % col_tiles
    r = (tile_r * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    c = (tile_c * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    tile = tl.load(
        x_ptr + r[:, None] * cols + c[None, :], mask=(r[:, None] < rows) & (c[None, :] < cols)
    )
    tl.store(
        y_ptr + c[:, None] * rows + r[None, :],
        tl.trans(tile),
        mask=(c[:, None] < cols) & (r[None, :] < rows),
    )


def transpose_bytes(x, y, block: int = 64) -> None:
    """`y [c, r] <- x [r, c]^T` for contiguous uint8 CUDA tensors."""
    rows, cols = x.shape
    grid = (triton.cdiv(rows, block) * triton.cdiv(cols, block),)
    with torch.cuda.device(x.device):  # Triton launches on the current device
        _transpose_tiles[grid](x, y, rows, cols, BLOCK=block, num_warps=4)
