"""The Triton kernel behind `MultiTensorAdamW` (imported only when a CUDA step runs, or for the
Triton interpreter in tests: `TRITON_INTERPRET=1`).

One launch updates many tensors: the grid walks a block table (tensor index, element offset) built
once from the tensors' sizes, and each program loads the addresses of its tensor's param, grad,
exp_avg and exp_avg_sq from per-tensor address arrays (int64), so the tensors need not be
contiguous with each other and the grads may be new tensors every step. Math in fp32 registers,
torch.optim.AdamW's formula (see `flat_adamw.adamw_flat_update`); per-tensor scalars (1 - lr * wd,
lr / (1 - beta1^t), sqrt(1 - beta2^t)) let param groups differ in lr and weight decay and
tensors in their step count. Full blocks run unmasked and, when every address is 16-byte
aligned (`ALIGNED`), with 16-byte vector accesses; a tensor's tail block is masked.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _adamw_update(p_ptr, g_ptr, m_ptr, v_ptr, idx, mask, decay, step_size, bias2_sqrt, beta1,
                  beta2, eps, PARAM_DTYPE: tl.constexpr):  # fmt: skip
    """The update of one block of elements `idx` (masked by `mask`) of one tensor."""
    g = tl.load(g_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    p = tl.load(p_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    m = m + (g - m) * (1.0 - beta1)
    v = v * beta2 + (1.0 - beta2) * g * g
    denom = tl.sqrt(v) / bias2_sqrt + eps
    p = p * decay - step_size * m / denom
    tl.store(p_ptr + idx, p.to(PARAM_DTYPE), mask=mask)
    tl.store(m_ptr + idx, m.to(PARAM_DTYPE), mask=mask)
    tl.store(v_ptr + idx, v.to(PARAM_DTYPE), mask=mask)


@triton.jit
def _adamw_blocks(
    block_tensor,  # [B] int32: which tensor block b belongs to
    block_offset,  # [B] int64: its first element inside that tensor (a multiple of BLOCK)
    numel,  # [T] int64
    param_addr,  # [T] int64 addresses, likewise grad_addr / exp_avg_addr / exp_avg_sq_addr
    grad_addr,
    exp_avg_addr,
    exp_avg_sq_addr,
    decay,  # [T] fp32: 1 - lr * weight_decay
    step_size,  # [T] fp32: lr / (1 - beta1^t)
    bias2_sqrt,  # [T] fp32: sqrt(1 - beta2^t)
    beta1,
    beta2,
    eps,
    PARAM_DTYPE: tl.constexpr,
    GRAD_DTYPE: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGNED: tl.constexpr,  # every address a multiple of 16 bytes: vector loads and stores
):
    b = tl.program_id(0)
    t = tl.load(block_tensor + b)
    start = tl.multiple_of(tl.load(block_offset + b), BLOCK)
    n = tl.load(numel + t)
    idx = start + tl.arange(0, BLOCK)
    p_ptr = tl.load(param_addr + t).to(tl.pointer_type(PARAM_DTYPE))
    g_ptr = tl.load(grad_addr + t).to(tl.pointer_type(GRAD_DTYPE))
    m_ptr = tl.load(exp_avg_addr + t).to(tl.pointer_type(PARAM_DTYPE))
    v_ptr = tl.load(exp_avg_sq_addr + t).to(tl.pointer_type(PARAM_DTYPE))
    if ALIGNED:
        # loaded addresses carry no alignment: say it, or every element is its own 2-byte load
        p_ptr = tl.multiple_of(p_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        m_ptr = tl.multiple_of(m_ptr, 16)
        v_ptr = tl.multiple_of(v_ptr, 16)
    args = (tl.load(decay + t), tl.load(step_size + t), tl.load(bias2_sqrt + t), beta1, beta2, eps)
    if start + BLOCK <= n:  # a full block: a constant mask, so the accesses vectorise
        full = tl.full([BLOCK], 1, tl.int1)
        _adamw_update(p_ptr, g_ptr, m_ptr, v_ptr, idx, full, *args, PARAM_DTYPE)
    else:  # the tensor's tail
        _adamw_update(p_ptr, g_ptr, m_ptr, v_ptr, idx, idx < n, *args, PARAM_DTYPE)


_TL_DTYPES = {
    "torch.float32": tl.float32,
    "torch.bfloat16": tl.bfloat16,
    "torch.float16": tl.float16,
}


def launch(
    tables, addrs, scalars, betas_eps, param_dtype, grad_dtype, block: int, aligned: bool
) -> None:
    """tables: (block_tensor, block_offset, numel); addrs: 4 int64 [T] tensors; scalars:
    (decay, step_size, bias2_sqrt), fp32 [T] each; betas_eps: (beta1, beta2, eps) floats;
    aligned: every address in addrs is a multiple of 16 bytes. Runs on the current device."""
    block_tensor, block_offset, numel = tables
    grid = (block_tensor.numel(),)
    _adamw_blocks[grid](
        block_tensor,
        block_offset,
        numel,
        *addrs,
        *scalars,
        *betas_eps,
        PARAM_DTYPE=_TL_DTYPES[str(param_dtype)],
        GRAD_DTYPE=_TL_DTYPES[str(grad_dtype)],
        BLOCK=block,
        ALIGNED=aligned,
    )
