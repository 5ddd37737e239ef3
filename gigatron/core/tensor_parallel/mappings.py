"""Autograd-aware collectives that move activations in and out of the tensor-parallel region.

Mirrors `megatron.core.tensor_parallel.mappings`: one autograd Function per collective, the
public functions keep Megatron's names and argument order, and `group=None` means
parallel_state's tensor-parallel group. Every mapping is the identity (no communication) when
the group has one rank. Unlike Megatron, no mapping writes into its input or into the incoming
gradient: all-reduces work on a copy.

Layouts: `[s, b, h]` activations; "sequence parallel" splits dim 0 (s), "tensor parallel" splits
the last dim (h). `tp` below is the group size.
"""

from __future__ import annotations

import torch

from gigatron.core.tensor_parallel._collectives import (
    _all_to_all,
    _gather_along_first_dim,
    _gather_along_last_dim,
    _reduce,
    _reduce_scatter_along_first_dim,
    _reduce_scatter_along_last_dim,
    _split_along_first_dim,
    _split_along_last_dim,
)
from gigatron.core.tensor_parallel._groups import (
    get_tensor_model_parallel_group_if_none,
    group_size,
)

__all__ = [
    "copy_to_tensor_model_parallel_region",
    "reduce_from_tensor_model_parallel_region",
    "scatter_to_tensor_model_parallel_region",
    "gather_from_tensor_model_parallel_region",
    "scatter_to_sequence_parallel_region",
    "gather_from_sequence_parallel_region",
    "reduce_scatter_to_sequence_parallel_region",
    "all_gather_last_dim_from_tensor_parallel_region",
    "reduce_scatter_last_dim_to_tensor_parallel_region",
    "all_to_all",
    "all_to_all_sp2hp",
    "all_to_all_hp2sp",
]


class _CopyToModelParallelRegion(torch.autograd.Function):
    """Enter the TP region: every rank uses the full input, so input grads are summed.

    forward:  [..., h] -> identity        -> [..., h]
    backward: [..., h] grad -> all-reduce -> [..., h]
    """

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _reduce(grad, ctx.group), None


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    """Leave the TP region by summing partial results.

    forward:  [..., h] partial -> all-reduce -> [..., h]
    backward: [..., h] grad    -> identity   -> [..., h]
    """

    @staticmethod
    def forward(ctx, x, group):
        return _reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToModelParallelRegion(torch.autograd.Function):
    """Keep this rank's slice of the last dim.

    forward:  [..., h] -> split last dim             -> [..., h/tp]
    backward: [..., h/tp] grad -> all-gather last dim -> [..., h]
    """

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_along_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_along_last_dim(grad, ctx.group), None


class _GatherFromModelParallelRegion(torch.autograd.Function):
    """Concatenate the last-dim slices of all ranks.

    forward:  [..., h/tp] -> all-gather last dim -> [..., h]
    backward: [..., h] grad -> split last dim     -> [..., h/tp]
    """

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_along_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _split_along_last_dim(grad, ctx.group), None


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Keep this rank's slice of the sequence.

    forward:  [s, b, h] -> split dim 0                -> [s/tp, b, h]
    backward: [s/tp, b, h] grad -> all-gather dim 0   -> [s, b, h]
    """

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_along_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_along_first_dim(grad, ctx.group), None


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """Rebuild the full sequence from the per-rank slices.

    forward:  [s/tp, b, h] -> all-gather dim 0 -> [s, b, h]
    backward: [s, b, h] grad -> reduce-scatter dim 0 -> [s/tp, b, h]
              (plain split instead when `tensor_parallel_output_grad=False`: the consumer of
              the output was not tensor-parallel, so every rank already holds the full grad)
    """

    @staticmethod
    def forward(ctx, x, tensor_parallel_output_grad, group, output_split_sizes):
        ctx.tensor_parallel_output_grad = tensor_parallel_output_grad
        ctx.group = group
        ctx.output_split_sizes = output_split_sizes
        return _gather_along_first_dim(x, group, output_split_sizes)

    @staticmethod
    def backward(ctx, grad):
        if ctx.tensor_parallel_output_grad:
            grad_in = _reduce_scatter_along_first_dim(grad, ctx.group, ctx.output_split_sizes)
        elif ctx.output_split_sizes is None:
            grad_in = _split_along_first_dim(grad, ctx.group)
        else:
            rank = torch.distributed.get_rank(group=ctx.group)
            grad_in = grad.split(list(ctx.output_split_sizes), dim=0)[rank].contiguous()
        return grad_in, None, None, None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Sum partial outputs over TP ranks, keep this rank's sequence slice.

    forward:  [s, b, h] partial -> reduce-scatter dim 0 -> [s/tp, b, h]
    backward: [s/tp, b, h] grad -> all-gather dim 0     -> [s, b, h]
    """

    @staticmethod
    def forward(ctx, x, group, input_split_sizes):
        ctx.group = group
        ctx.input_split_sizes = input_split_sizes
        return _reduce_scatter_along_first_dim(x, group, input_split_sizes)

    @staticmethod
    def backward(ctx, grad):
        return _gather_along_first_dim(grad, ctx.group, ctx.input_split_sizes), None, None


class _AllGatherFromTensorParallelRegion(torch.autograd.Function):
    """Concatenate last-dim slices; the consumer is tensor-parallel, so grads are summed.

    forward:  [..., h/tp] -> all-gather last dim          -> [..., h]
    backward: [..., h] grad -> reduce-scatter last dim    -> [..., h/tp]
    """

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_along_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_along_last_dim(grad, ctx.group), None


class _ReduceScatterToTensorParallelRegion(torch.autograd.Function):
    """Sum partial results over ranks, keep this rank's last-dim slice.

    forward:  [..., h] partial -> reduce-scatter last dim -> [..., h/tp]
    backward: [..., h/tp] grad -> all-gather last dim     -> [..., h]
    """

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_along_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_along_last_dim(grad, ctx.group), None


class _AllToAll(torch.autograd.Function):
    """Exchange dim-0 chunks between ranks (chunk i goes to rank i).

    forward:  [n_in, ...]  -> all-to-all(v)         -> [n_out, ...]
    backward: [n_out, ...] grad -> reverse all-to-all -> [n_in, ...]
    """

    @staticmethod
    def forward(ctx, group, x, output_split_sizes, input_split_sizes):
        ctx.group = group
        ctx.output_split_sizes = output_split_sizes
        ctx.input_split_sizes = input_split_sizes
        return _all_to_all(x, group, output_split_sizes, input_split_sizes)

    @staticmethod
    def backward(ctx, grad):
        grad_in = _all_to_all(grad, ctx.group, ctx.input_split_sizes, ctx.output_split_sizes)
        return None, grad_in, None, None


# ---------------------------------------------------------------------------------------------
# Public functions (Megatron's names and argument order).


def copy_to_tensor_model_parallel_region(input_, group=None):
    """Identity forward, all-reduce of the gradient in backward."""
    group = get_tensor_model_parallel_group_if_none(group)
    return _CopyToModelParallelRegion.apply(input_, group)


def reduce_from_tensor_model_parallel_region(input_, group=None):
    """All-reduce (sum) forward, identity backward."""
    group = get_tensor_model_parallel_group_if_none(group)
    return _ReduceFromModelParallelRegion.apply(input_, group)


def scatter_to_tensor_model_parallel_region(input_, group=None):
    """`[..., h] -> [..., h/tp]` (own slice); backward all-gathers the last dim."""
    group = get_tensor_model_parallel_group_if_none(group)
    return _ScatterToModelParallelRegion.apply(input_, group)


def gather_from_tensor_model_parallel_region(input_, group=None):
    """`[..., h/tp] -> [..., h]` (all-gather); backward keeps this rank's slice."""
    group = get_tensor_model_parallel_group_if_none(group)
    return _GatherFromModelParallelRegion.apply(input_, group)


def scatter_to_sequence_parallel_region(input_, group=None):
    """`[s, b, h] -> [s/tp, b, h]` (own slice); backward all-gathers dim 0."""
    group = get_tensor_model_parallel_group_if_none(group)
    return _ScatterToSequenceParallelRegion.apply(input_, group)


def gather_from_sequence_parallel_region(
    input_,
    tensor_parallel_output_grad=True,
    group=None,
    output_split_sizes=None,
    use_global_buffer=False,
):
    """`[s/tp, b, h] -> [s, b, h]` (all-gather); backward reduce-scatters dim 0.

    `tensor_parallel_output_grad=False` makes the backward a plain split (the output feeds a
    non-tensor-parallel op). `output_split_sizes` allows uneven per-rank chunks.
    `use_global_buffer` is accepted for compatibility (gigatron always allocates).
    """
    group = get_tensor_model_parallel_group_if_none(group)
    return _GatherFromSequenceParallelRegion.apply(
        input_, tensor_parallel_output_grad, group, output_split_sizes
    )


def reduce_scatter_to_sequence_parallel_region(
    input_, group=None, input_split_sizes=None, use_global_buffer=False
):
    """`[s, b, h] -> [s/tp, b, h]` (reduce-scatter); backward all-gathers dim 0."""
    group = get_tensor_model_parallel_group_if_none(group)
    return _ReduceScatterToSequenceParallelRegion.apply(input_, group, input_split_sizes)


def all_gather_last_dim_from_tensor_parallel_region(input_, group=None):
    """`[..., h/tp] -> [..., h]` (all-gather); backward reduce-scatters the last dim."""
    group = get_tensor_model_parallel_group_if_none(group)
    return _AllGatherFromTensorParallelRegion.apply(input_, group)


def reduce_scatter_last_dim_to_tensor_parallel_region(input_, group=None):
    """`[..., h] -> [..., h/tp]` (reduce-scatter); backward all-gathers the last dim."""
    group = get_tensor_model_parallel_group_if_none(group)
    return _ReduceScatterToTensorParallelRegion.apply(input_, group)


def all_to_all(
    group, input_, output_split_sizes_=None, input_split_sizes=None, use_nccl_stream=False
):
    """All-to-all along dim 0 over `group` (required, first as in Megatron); backward reverses it.

    `use_nccl_stream` is accepted for compatibility and has no effect.
    """
    group = get_tensor_model_parallel_group_if_none(group)
    return _AllToAll.apply(group, input_, output_split_sizes_, input_split_sizes)


def all_to_all_sp2hp(input_, group=None):
    """Sequence-split to hidden-split: `[T/tp, H] -> [T, H/tp]` (T tokens, H hidden).

    Rank j receives hidden slice j of every rank's tokens, stacked in rank order.
    """
    group = get_tensor_model_parallel_group_if_none(group)
    world_size = group_size(group)
    rows = input_.reshape(-1, input_.shape[-1])  # [T/tp, H]
    if world_size == 1:
        return rows
    if rows.size(-1) % world_size != 0:
        raise ValueError(
            f"all_to_all_sp2hp: hidden size ({rows.size(-1)}) must be divisible by the "
            f"group size ({world_size})"
        )
    stacked = torch.cat(torch.split(rows, rows.size(-1) // world_size, dim=1), dim=0)
    return all_to_all(group, stacked)  # [T, H/tp]


def all_to_all_hp2sp(input_, group=None):
    """Hidden-split to sequence-split: `[T, H/tp] -> [T/tp, H]` (inverse of `all_to_all_sp2hp`)."""
    group = get_tensor_model_parallel_group_if_none(group)
    world_size = group_size(group)
    rows = input_.reshape(-1, input_.shape[-1])  # [T, H/tp]
    if world_size == 1:
        return rows
    exchanged = all_to_all(group, rows)  # [tp * T/tp, H/tp], block i = rank i's hidden slice
    return torch.cat(torch.split(exchanged, exchanged.size(0) // world_size, dim=0), dim=-1)
