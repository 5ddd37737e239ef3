"""The matmul of the parallel linear layers, with its communication folded into autograd.

Mirrors `LinearWithGradAccumulationAndAsyncCommunication` and
`linear_with_grad_accumulation_and_async_allreduce` of `megatron.core.tensor_parallel.layers`,
in plain PyTorch (no apex kernel; gradient-accumulation fusion is a cuBLAS `addmm_` into
`main_grad`, `wgrad.py`).
"""

from __future__ import annotations

import warnings

import torch

from gigatron.core.tensor_parallel._collectives import (
    _finish,
    _gather_along_first_dim,
    _start_async,
    _start_exchange,
)
from gigatron.core.tensor_parallel.wgrad import weight_grad
from gigatron.core.utils import (
    get_tensor_model_parallel_group_if_none,
    group_rank,
    group_size,
)


class LinearWithGradAccumulationAndAsyncCommunication(torch.autograd.Function):
    """`y = x W^T + b` with the TP communication of a column-parallel input.

    forward:  x [s/tp, b, h] -(SP: all-gather dim 0)-> [s, b, h] @ W^T [h, o/tp] -> [s, b, o/tp]
    backward: dgrad [s, b, h] -> all-reduce (allreduce_dgrad) or reduce-scatter dim 0 (SP), started
              asynchronously and overlapped with the weight-gradient matmul. Under SP the input
              is all-gathered again in backward instead of being kept (saves activation memory);
              that gather is started first and overlaps the input-gradient matmul.
    Under torch.compile the same order is expressed with functional collectives in the graph.
    """

    @staticmethod
    def forward(
        ctx,
        input_,
        weight,
        bias,
        gradient_accumulation_fusion,
        allreduce_dgrad,
        sequence_parallel,
        tp_group,
        tp_comm_overlap=False,
    ):
        ctx.save_for_backward(input_, weight)
        ctx.use_bias = bias is not None
        ctx.gradient_accumulation_fusion = gradient_accumulation_fusion
        ctx.allreduce_dgrad = allreduce_dgrad
        ctx.sequence_parallel = sequence_parallel
        ctx.tp_group = tp_group
        if sequence_parallel and tp_comm_overlap:
            output = _gather_matmul_overlapped(input_, weight, tp_group)  # [s, b, o/tp]
        else:
            total_input = _gather_along_first_dim(input_, tp_group) if sequence_parallel else input_
            output = torch.matmul(total_input, weight.t())  # [s, b, o/tp]
        if bias is not None:
            output = output + bias
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input_, weight = ctx.saved_tensors
        group = ctx.tp_group
        need_dgrad, need_wgrad, _ = ctx.needs_input_grad[:3]

        # Megatron's order: (SP) the input re-gather runs during the input-gradient matmul,
        # then the input-gradient collective runs during the weight-gradient matmul.
        gather = None
        if need_wgrad and ctx.sequence_parallel:
            gather = _start_async("all_gather", input_, group)  # -> [s, b, h]
        grad_input = dgrad_comm = None
        if need_dgrad:
            grad_input = grad_output.matmul(weight)  # [s, b, h]
        total_input = input_ if gather is None else _finish(*gather)  # [s, b, h]
        if need_dgrad and (ctx.sequence_parallel or ctx.allreduce_dgrad):
            # grad_input is a fresh tensor we own, so the eager all-reduce may work in place.
            kind = "reduce_scatter" if ctx.sequence_parallel else "all_reduce"
            dgrad_comm = _start_async(kind, grad_input, group)

        grad_output_2d = grad_output.reshape(-1, grad_output.size(-1))  # [s*b, o/tp]
        grad_weight = None
        if need_wgrad:  # a frozen weight gets no gradient (Megatron's linear_with_frozen_weight)
            total_input_2d = total_input.reshape(-1, total_input.size(-1))  # [s*b, h]
            grad_weight = weight_grad(ctx, weight, grad_output_2d, total_input_2d)
        grad_bias = grad_output_2d.sum(dim=0) if ctx.use_bias else None

        if dgrad_comm is not None:
            grad_input = _finish(*dgrad_comm)  # [s/tp, b, h] (SP) or [s, b, h]
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


def _gather_matmul_overlapped(input_, weight, group):
    """`[s/tp, b, h] -> [s, b, o/tp]`: all-gather along dim 0, then `@ W^T`, overlapped.

    This rank's rows need no communication, so their matmul runs while the all-gather is in
    flight; the other ranks' rows follow once it lands (a 1/tp share of the GEMM hides the
    gather). Row blocks of a matmul are independent, so the result equals the plain path's.
    Eager writes each block into one output buffer; the traced version concatenates.
    """
    tp_rank, rows = group_rank(group), input_.size(0)
    mine = slice(tp_rank * rows, (tp_rank + 1) * rows)
    gather = _start_async("all_gather", input_, group)  # -> [s, b, h]
    if torch.compiler.is_compiling():
        local = torch.matmul(input_, weight.t())  # [s/tp, b, o/tp], overlaps the all-gather
        total_input = _finish(*gather)  # [s, b, h]
        before = torch.matmul(total_input[: mine.start], weight.t())  # ranks < tp_rank
        after = torch.matmul(total_input[mine.stop :], weight.t())  # ranks > tp_rank
        return torch.cat([before, local, after], dim=0)  # [s, b, o/tp]
    output = input_.new_empty((rows * group_size(group), *input_.shape[1:-1], weight.size(0)))
    torch.matmul(input_, weight.t(), out=output[mine])  # overlaps the all-gather
    total_input = _finish(*gather)  # [s, b, h]
    for block in (slice(0, mine.start), slice(mine.stop, output.size(0))):
        if block.stop > block.start:
            torch.matmul(total_input[block], weight.t(), out=output[block])
    return output  # [s, b, o/tp]


class LinearReduceScatterOverlapped(torch.autograd.Function):
    """`[s, b, h/tp] @ W^T`, summed over the TP ranks and split along dim 0 -> `[s/tp, b, o]`:
    the row-parallel linear plus the sequence-parallel reduce-scatter, pipelined
    (`tp_comm_overlap` under SP, gigatron's counterpart of Megatron's `tp_comm_overlap_rs`).

    forward:  rank r multiplies the rows of rank r+1 first and sends that block while it
              multiplies the rows of rank r+2, ... (a ring of pairwise exchanges), and its own
              rows last, while the last block is in flight; then adds what it received.
    backward: the grad is all-gathered along dim 0 while the matmul of this rank's own rows of
              the input gradient runs; then the other rows and the weight gradient.
    At TP = 2 the sum is bitwise the reduce-scatter's (two addends); at TP > 2 the addends
    are summed in another order (fp32 rounding only).
    """

    @staticmethod
    def forward(ctx, input_, weight, gradient_accumulation_fusion, tp_group):
        ctx.save_for_backward(input_, weight)
        ctx.gradient_accumulation_fusion = gradient_accumulation_fusion
        ctx.tp_group = tp_group
        tp, rank = group_size(tp_group), group_rank(tp_group)
        if input_.size(0) % tp != 0:
            raise ValueError(
                f"tp_comm_overlap reduce-scatter: dim 0 of the input ({input_.size(0)}) must be "
                f"divisible by the tensor-parallel size ({tp}) (gigatron/core/tensor_parallel/"
                "_linear.py)"
            )
        blocks = input_.chunk(tp, dim=0)  # block j: the rows rank j keeps, [s/tp, b, h/tp]
        pending = []
        for step in range(1, tp):
            dst, src = (rank + step) % tp, (rank - step) % tp
            part = torch.matmul(blocks[dst], weight.t())  # [s/tp, b, o] for rank dst
            pending.append(_start_exchange(part, dst, src, tp_group))
        output = torch.matmul(blocks[rank], weight.t())  # overlaps the exchanges in flight
        for exchange in pending:
            output = output + _finish(*exchange)
        return output  # [s/tp, b, o]

    @staticmethod
    def backward(ctx, grad_output):
        input_, weight = ctx.saved_tensors
        group = ctx.tp_group
        gather = _start_async("all_gather", grad_output, group)  # -> [s, b, o]
        grad_input = None
        if ctx.needs_input_grad[0]:
            # This rank's rows of the input gradient need only its own grad rows: their matmul
            # runs while the other ranks' grad rows arrive (row blocks are independent).
            own = grad_output.matmul(weight)  # [s/tp, b, h/tp]
        total = _finish(*gather)  # [s, b, o]
        if ctx.needs_input_grad[0]:
            rank, rows = group_rank(group), grad_output.size(0)
            before = total[: rank * rows].matmul(weight)  # ranks < this one
            after = total[(rank + 1) * rows :].matmul(weight)  # ranks > this one
            grad_input = torch.cat([before, own, after], dim=0)  # [s, b, h/tp]
        grad_weight = None
        if ctx.needs_input_grad[1]:
            total_2d = total.reshape(-1, total.size(-1))  # [s*b, o]
            input_2d = input_.reshape(-1, input_.size(-1))  # [s*b, h/tp]
            grad_weight = weight_grad(ctx, weight, total_2d, input_2d)
        return grad_input, grad_weight, None, None


def linear_with_grad_accumulation_and_async_allreduce(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    gradient_accumulation_fusion: bool,
    allreduce_dgrad: bool,
    sequence_parallel: bool,
    grad_output_buffer: list | None = None,
    wgrad_deferral_limit: int | None = 0,
    tp_group=None,
    gtp_remat_size: int = 1,
    async_grad_allreduce: bool | None = None,
    *,
    tp_comm_overlap: bool = False,
) -> torch.Tensor:
    """Linear layer whose input-gradient communication runs inside autograd.

    `allreduce_dgrad`: all-reduce the input gradient over `tp_group` (column-parallel input that
    every rank used in full). `sequence_parallel`: the input is `[s/tp, b, h]`; it is all-gathered
    along dim 0 and its gradient reduce-scattered. `gradient_accumulation_fusion`: add the weight
    gradient into `weight.main_grad` when the weight has one. `async_grad_allreduce` is
    megatron-core 0.16's deprecated alias of `allreduce_dgrad` (0.19 dropped it and put
    `tp_group, gtp_remat_size` in its place; pass it by keyword). `gtp_remat_size` (0.19's GTP
    weight sharding) is accepted only as 1. Deferred embedding wgrad (`grad_output_buffer`) is
    not supported. `tp_comm_overlap` (gigatron's own, keyword-only;
    Megatron's needs Transformer Engine userbuffers): under SP, overlap the forward all-gather
    with the matmul of this rank's own rows (`_gather_matmul_overlapped`); same numbers.
    """
    if isinstance(tp_group, bool):  # a 0.16-style positional call: async_grad_allreduce
        raise TypeError(
            f"tp_group got a bool ({tp_group}): megatron-core 0.19 removed async_grad_allreduce "
            "from this position; pass async_grad_allreduce / tp_group by keyword"
        )
    if gtp_remat_size != 1:
        raise ValueError(
            f"gtp_remat_size={gtp_remat_size!r} is not supported by gigatron (GTP weight "
            "sharding is not implemented); only 1"
        )
    if async_grad_allreduce is not None:
        warnings.warn(
            "async_grad_allreduce is deprecated; use allreduce_dgrad",
            DeprecationWarning,
            stacklevel=2,
        )
        allreduce_dgrad = async_grad_allreduce
    if grad_output_buffer is not None:
        raise ValueError(
            "grad_output_buffer is not supported by gigatron (deferred embedding wgrad compute)"
        )
    if allreduce_dgrad and sequence_parallel:
        raise ValueError("allreduce_dgrad and sequence_parallel cannot both be True")
    tp_group = get_tensor_model_parallel_group_if_none(tp_group)
    if group_size(tp_group) == 1:
        allreduce_dgrad = sequence_parallel = False
    if not (allreduce_dgrad or sequence_parallel) and not (
        gradient_accumulation_fusion and hasattr(weight, "main_grad")
    ):
        # Nothing to communicate or fuse: plain F.linear lets cuBLAS fuse the bias and
        # torch.compile use its standard backward (same numbers as the Function below).
        return torch.nn.functional.linear(input, weight, bias)
    return LinearWithGradAccumulationAndAsyncCommunication.apply(
        input,
        weight,
        bias,
        gradient_accumulation_fusion,
        allreduce_dgrad,
        sequence_parallel,
        tp_group,
        tp_comm_overlap,
    )
