"""FP8 GEMMs of the parallel linear layers: forward, input gradient and weight gradient.

gigatron's counterpart of Transformer Engine's FP8 linear: each GEMM operand is cast to FP8
with a scale from its own amax (current scaling; `gigatron.core.fp8_utils.Fp8Recipe` says the
dtype and whether one scale per tensor or per row) and multiplied by `torch._scaled_mm` (through
torchao's `addmm_float8_unwrapped`). The casts and GEMMs follow torchao's
`matmul_with_hp_or_float8_args` (`torchao/float8/float8_linear.py`); the TP communication and
the `main_grad` fusion are those of `_linear.py`.

TP: an amax over a dimension the TP group splits is all-reduced (MAX) over the group, so each
rank casts with the scale the unsplit tensor would get and TP changes no number. Under
sequence parallelism the local activation is cast once and its FP8 bytes are all-gathered (half
the bytes of a bf16 gather); a per-tensor cast is kept for the weight gradient, so backward
re-gathers FP8 bytes too. Master weights, gradients and optimizer state stay as they are.

Shapes (2-D views): n: tokens (s*b), h: input features of this rank's weight, o: output features
of this rank's weight, tp: TP group size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gigatron.core.tensor_parallel._collectives import (
    _C10D,
    _finish,
    _gather_along_first_dim,
    _group_name,
    _start_async,
    _wait,
)
from gigatron.core.tensor_parallel.fp8_transpose import fp8_transpose
from gigatron.core.tensor_parallel.wgrad import (
    WGRAD_IN_MAIN_GRAD,
    hand_over_weight_grad,
    weight_grad,
)
from gigatron.core.utils import group_size

# An FP8 operand is a pair `(data, scale)`: FP8 `data` `[r, c]` (`data ~ hp * scale`) and its
# scale `[]`, `[r, 1]` or `[1, c]`. Plain tuples (no class of gigatron's) keep the traced Python
# of each linear small under a whole-model torch.compile.


def _t(q: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    data, scale = q
    return data.t(), (scale.t() if scale.dim() else scale)


def _all_reduce_max(x: torch.Tensor, group) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return _wait(_C10D.all_reduce(x, "max", _group_name(group)))
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)
    return x


def _quantize(recipe, x: torch.Tensor, cast, *, dim: int, split_dim: int | None, group):
    """`x [r, c]` -> FP8 `(data, scale)`. A row-wise cast takes one scale per slice along `dim`
    (1: per row, scale `[r, 1]`; 0: per column, `[1, c]`). `split_dim`: the dimension TP splits
    `x` along (None: whole on every rank); an amax over it is all-reduced so all ranks share the
    scale. Runs under no_grad already (autograd.Function forward / backward)."""
    if x.numel() == 0:  # an expert that got no tokens: nothing to scale (peers may reduce it)
        shape = [1 if d == dim else n for d, n in enumerate(x.shape)] if cast.rowwise else []
        amax = torch.zeros(shape, dtype=torch.float32, device=x.device)
    elif cast.rowwise:
        amax = x.abs().amax(dim=dim, keepdim=True).float()
    else:
        amax = x.abs().max().float()
    spans_split = split_dim is not None and (not cast.rowwise or split_dim == dim)
    if spans_split and group_size(group) > 1:
        amax = _all_reduce_max(amax, group)
    if recipe.margin:
        amax = amax * 2.0**recipe.margin  # fp8_margin: scale / 2**margin
    scale = recipe.ao.amax_to_scale(amax, cast.dtype, recipe.round_scales_to_power_of_2)
    return recipe.ao.to_fp8_saturated(x.float() * scale, cast.dtype), scale


def delayed_args(state):
    """The `delayed` argument of `Fp8LinearFunction` for `state` (an `Fp8DelayedState` or None):
    (state, this forward's scales, record amaxes?)."""
    return None if state is None else (state, *state.forward_scales())


def _quantize_delayed(recipe, x: torch.Tensor, cast, state, role: int, scales, record: bool):
    """`x` -> FP8 `(data, scale)` with the delayed-scaling scale `scales[role]` (kept apart from
    the state, which the block's update rewrites before backward); its amax goes into the
    state's history when `record` (reduced over the amax group at the update, not here)."""
    if record:
        amax = x.abs().max().float() if x.numel() else x.new_zeros((), dtype=torch.float32)
        state.record(role, amax)
    scale = scales[role].clone()
    return recipe.ao.to_fp8_saturated(x.float() * scale, cast.dtype), scale


def _row_major(x: torch.Tensor) -> torch.Tensor:
    """`x [r, c]` laid out row-major; a transposed view is copied by `fp8_transpose` (its own
    kernel, not fused into the cast that made `x`)."""
    if x.is_contiguous():
        return x
    return fp8_transpose(x.t()) if x.t().is_contiguous() else x.contiguous()


def _mm(recipe, a, b, out_dtype: torch.dtype, gemm: str) -> torch.Tensor:
    """`a [m, k] @ b [k, n]` (FP8 pairs) -> `[m, n]` in `out_dtype` (`gemm`: output |
    grad_input | grad_weight, for the recipe's fast-accumulation choice)."""
    a_data, a_scale = a
    b_data, b_scale = b
    a_data = _row_major(a_data)  # what _scaled_mm takes
    b_data = _row_major(b_data.t()).t()  # column-major
    # _scaled_mm scales both operands per tensor or both per row / column: widen the other one
    if a_scale.dim() == 0 and b_scale.dim() > 0:
        a_scale = a_scale.repeat(a_data.size(0)).reshape(-1, 1)
    elif b_scale.dim() == 0 and a_scale.dim() > 0:
        b_scale = b_scale.repeat(b_data.size(1)).reshape(1, -1)
    return recipe.ao.addmm_float8_unwrapped(
        a_data, a_scale, b_data, b_scale, out_dtype, use_fast_accum=recipe.fast_accum[gemm]
    )


def _gather_fp8(q, group):
    """`[n/tp, h]` FP8 -> `[n, h]`: the bytes all-gathered along dim 0 (and per-row scales)."""
    data, scale = q
    data = _gather_along_first_dim(data.view(torch.uint8), group).view(data.dtype)
    scale = scale if scale.dim() == 0 else _gather_along_first_dim(scale, group)
    return data, scale


class Fp8LinearFunction(torch.autograd.Function):
    """`y = x W^T + b` with its three GEMMs in FP8 and the TP communication of `_linear.py`.

    `parallel`: "column" (W `[o/tp, h]`, x whole or `[s/tp, b, h]` under SP) or "row"
    (W `[o, h/tp]`, x `[s, b, h/tp]`; the caller reduces the partial output). `delayed`:
    None (current scaling) or `delayed_args(state)` (delayed scaling, decided by the caller:
    autograd runs this forward without grad, so it cannot tell training from evaluation).
    forward:  x -(SP: cast, all-gather FP8 dim 0)-> [s, b, h] @ W^T -> [s, b, o] (model dtype)
    backward: dgrad = dY @ W in FP8 -> all-reduce (allreduce_dgrad) / reduce-scatter (SP),
              overlapped with dW = dY^T @ X in FP8, added into `main_grad` under
              gradient_accumulation_fusion.
    """

    @staticmethod
    def forward(
        ctx,
        input_,
        weight,
        bias,
        recipe,
        parallel,
        gradient_accumulation_fusion,
        allreduce_dgrad,
        sequence_parallel,
        tp_group,
        delayed=None,
    ):
        column = parallel == "column"
        casts = recipe.casts
        x = input_.reshape(-1, input_.size(-1))  # [n(/tp under SP), h]
        fp8_state = None
        if delayed is not None:  # delayed scaling: stored scales, no collective here
            fp8_state, scales, record = delayed
            xq_local = _quantize_delayed(recipe, x, casts["input"], fp8_state, 0, scales, record)
            xq = _gather_fp8(xq_local, tp_group) if sequence_parallel else xq_local
            wq = _quantize_delayed(recipe, weight, casts["weight"], fp8_state, 1, scales, record)
        else:
            xq, xq_local, wq = _quantize_input_weight(
                recipe, x, weight, column, sequence_parallel, tp_group
            )
        out = _mm(recipe, xq, _t(wq), input_.dtype, "output")  # [n, o]
        if bias is not None:
            out = out + bias

        # Keep FP8 copies where backward casts the same tensor the same way (per-tensor scale).
        saved_x = xq_local if recipe.keep_input else (input_, input_)
        saved_w = wq if recipe.keep_weight else (weight, weight)
        ctx.save_for_backward(*saved_x, *saved_w, weight)
        ctx.recipe, ctx.column, ctx.tp_group = recipe, column, tp_group
        ctx.fp8_state = fp8_state
        ctx.use_bias = bias is not None
        ctx.gradient_accumulation_fusion = gradient_accumulation_fusion
        ctx.allreduce_dgrad, ctx.sequence_parallel = allreduce_dgrad, sequence_parallel
        rows = input_.size(0) * (group_size(tp_group) if sequence_parallel else 1)
        return out.view(rows, *input_.shape[1:-1], weight.size(0))  # [s, b, o]

    @staticmethod
    def backward(ctx, grad_output):
        x_a, x_b, w_a, w_b, weight = ctx.saved_tensors
        recipe, group, column = ctx.recipe, ctx.tp_group, ctx.column
        casts = recipe.casts
        need_dgrad, need_wgrad = ctx.needs_input_grad[:2]
        gy = grad_output.reshape(-1, grad_output.size(-1))  # [n, o]

        # SP: the input re-gather runs during the input-gradient GEMM (as in _linear.py).
        gather = None
        if need_wgrad and ctx.sequence_parallel:
            x_local = x_a.view(torch.uint8) if recipe.keep_input else x_a
            gather = _start_async("all_gather", x_local.reshape(-1, x_local.size(-1)), group)

        gq = grad_input = dgrad_comm = None
        if need_dgrad:
            gq = _quantize_grad_output(ctx, gy)
            if recipe.keep_weight:
                wq = (w_a, w_b)
            else:
                wq = _quantize(
                    recipe, weight, casts["weight_for_grad_input"], dim=0,
                    split_dim=0 if column else 1, group=group,
                )  # fmt: skip
            grad_input = _mm(recipe, gq, wq, grad_output.dtype, "grad_input")  # [n, h]
            grad_input = grad_input.view(*grad_output.shape[:-1], weight.size(1))
            if ctx.sequence_parallel or ctx.allreduce_dgrad:
                kind = "reduce_scatter" if ctx.sequence_parallel else "all_reduce"
                dgrad_comm = _start_async(kind, grad_input, group)

        grad_weight = None
        if need_wgrad:
            x_total = x_a.reshape(-1, x_a.size(-1)) if gather is None else _finish(*gather)
            if recipe.keep_input:  # FP8 bytes, per-tensor scale shared by all ranks
                grad_weight = _weight_grad(ctx, weight, gy, gq, (x_total.view(x_a.dtype), x_b))
            else:  # [n, h] model dtype
                grad_weight = _weight_grad(ctx, weight, gy, gq, x_total)
        grad_bias = gy.sum(dim=0) if ctx.use_bias else None

        if dgrad_comm is not None:
            grad_input = _finish(*dgrad_comm)  # [s/tp, b, h] (SP) or [s, b, h]
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None, None


def _quantize_input_weight(recipe, x, weight, column, sequence_parallel, group):
    """Current scaling: (FP8 input `[n, h]`, its local rows, FP8 weight), scales from the
    tensors themselves (amaxes over a split dimension all-reduced over TP)."""
    casts = recipe.casts
    if sequence_parallel:  # cast the local rows once, gather FP8 bytes
        xq_local = _quantize(recipe, x, casts["input"], dim=1, split_dim=0, group=group)
        xq = _gather_fp8(xq_local, group)  # [n, h]
    else:
        split = None if column else 1
        xq = xq_local = _quantize(recipe, x, casts["input"], dim=1, split_dim=split, group=group)
    split = 0 if column else 1
    wq = _quantize(recipe, weight, casts["weight"], dim=1, split_dim=split, group=group)
    return xq, xq_local, wq


def _quantize_grad_output(ctx, gy):
    """`dY [n, o]` cast for the input gradient (and, per tensor, the weight gradient)."""
    cast = ctx.recipe.casts["grad_output"]
    if ctx.fp8_state is not None:  # delayed scaling: the state's current gradient scale
        state = ctx.fp8_state
        return _quantize_delayed(ctx.recipe, gy, cast, state, 2, state.scale, True)
    split = 1 if ctx.column else None
    return _quantize(ctx.recipe, gy, cast, dim=1, split_dim=split, group=ctx.tp_group)


def _weight_grad(ctx, weight, gy, gq, x):
    """dW = dY^T X `[o, h]` from `gy [n, o]` (and its FP8 cast `gq` for the input gradient,
    reused when the recipe casts it the same way) and `x` (an FP8 pair, or `[n, h]` in the model
    dtype)."""
    recipe, group, column = ctx.recipe, ctx.tp_group, ctx.column
    if recipe.hp_grad_weight:  # high-precision weight gradient
        return weight_grad(ctx, weight, gy, x)
    casts = recipe.casts
    if gq is None and ctx.fp8_state is not None:  # no input gradient: cast dY here
        gq = _quantize_grad_output(ctx, gy)
    if gq is None or not recipe.reuse_grad_output:
        c_go = casts["grad_output_for_grad_weight"]
        gq = _quantize(recipe, gy, c_go, dim=0, split_dim=1 if column else None, group=group)
    if isinstance(x, torch.Tensor):
        c_in = casts["input_for_grad_weight"]
        x = _quantize(recipe, x, c_in, dim=0, split_dim=None if column else 1, group=group)
    fused = (
        ctx.gradient_accumulation_fusion
        and hasattr(weight, "main_grad")
        and getattr(weight, WGRAD_IN_MAIN_GRAD, False)
    )
    out_dtype = weight.main_grad.dtype if fused else weight.dtype  # fp32 main_grad: no bf16 trip
    grad_weight = _mm(recipe, _t(gq), x, out_dtype, "grad_weight")  # [o, h]
    return hand_over_weight_grad(weight, grad_weight) if fused else grad_weight
